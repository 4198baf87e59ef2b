"""Cluster files an operator gets wrong on the first day: one clear line, never a service that
runs and answers nonsense."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scheduler.extender.debug import describe
from scheduler.extender.inspection import render

SCRIPT = Path(sys.executable).with_name("gpuslice")

PODS_ONLY = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: trainer, namespace: ml}
  spec:
    containers:
    - name: main
      resources: {limits: {nvidia.com/gpu: "1"}}
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: ml}
  spec:
    nodeName: gpu-1
    containers: [{name: main}]
"""


def test_a_cluster_file_of_pods_without_nodes_is_refused_by_serve_with_one_line(tmp_path: Path) -> None:
    # kubectl get pods -A -o yaml, "nodes" forgotten: served, every pod would fit nowhere
    path = tmp_path / "pods.yaml"
    path.write_text(PODS_ONLY)
    serve = ["serve", "--cluster-file", str(path), "--demo-exit", "--port", "0"]
    for args in (serve, ["defrag", "--cluster-file", str(path)]):
        # a real process: serve sets up logging, which must not outlive the test in this one
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert lines == [
            f"gpuslice {args[0]}: {path}: 2 Pods and no Node: nothing to schedule them on; list the nodes too "
            "(kubectl get nodes,pods -A -o yaml)"
        ], done.stderr


def test_a_node_known_only_by_its_pods_is_shown_with_a_reason_not_none() -> None:
    text = render(describe("gpu-1", None), "table")
    assert "None" not in text
    assert "gpu-1: not served until fixed: no Node object of that name" in text
