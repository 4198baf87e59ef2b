"""The examples' node snippets advertise the GPU units the node agent would (scheduler.core.units)."""

from __future__ import annotations

from scheduler.core.k8s import parse_node
from scheduler.core.units import node_units
from tests.e2e.nodes import example_nodes


def test_each_example_node_advertises_the_units_of_its_gpus() -> None:
    nodes = example_nodes()
    assert nodes
    for node in nodes:
        advertised = node["status"]["allocatable"].get("gpuslice.io/gpu-units")
        assert advertised == str(node_units(parse_node(node))), node["metadata"]["name"]
