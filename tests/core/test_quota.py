"""GPU quotas: what each sharing mode's placement holds, and when a quota refuses one more."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.errors import QuotaError
from scheduler.core.inventory import Node
from scheduler.core.policies import make_policy
from scheduler.core.quota import (
    Amount,
    Charge,
    Limits,
    Quota,
    charge,
    over_quota,
    parse_quota,
    refusal,
    status_json,
    use_by_namespace,
)
from scheduler.core.request import parse_pod
from scheduler.core.select import evaluate
from scheduler.core.state import NodeState
from tests.builders import make_device, make_node, pod, static_mig

H100 = 81920  # MiB of an H100-80GB (catalog)
A100_40 = 40960


def placed(node: Node, annotations: dict[str, Any] | None = None, gpus: int | None = None) -> Charge:
    """What the pod holds once the binpack policy places it on an empty ``node``."""
    request = parse_pod(pod(annotations=annotations, gpus=gpus))
    found = evaluate(make_policy("binpack"), request.demand, NodeState.empty(node))
    assert not isinstance(found, str), found
    return charge(found.allocation, node)


@pytest.mark.parametrize(
    ("node", "annotations", "gpus", "expected"),
    [
        # a fraction: half of 81920 MiB = 40960 MiB, 0.5 GPU = 500 milli, no whole GPU
        (make_node(mode="mps"), {"gpu-fraction": "0.5"}, None, Amount(40960, 500, 0)),
        # an MPS share by memory: 20480 MiB; compute in proportion, 20480 / 81920 = 0.25 -> 250
        (make_node(mode="mps"), {"gpu-memory": "20Gi"}, None, Amount(20480, 250, 0)),
        # an MPS share by compute: 30 percent -> 300 milli; memory 300 x 81920 // 1000 = 24576
        (make_node(mode="mps"), {"gpu-compute": "30"}, None, Amount(24576, 300, 0)),
        # a time-slicing replica counts what it asked: 0.25 x 81920 = 20480 MiB, 250 milli
        (
            make_node(mode="time-slicing", device_options={"replicas": 4}),
            {"gpu-fraction": "0.25"},
            None,
            Amount(20480, 250, 0),
        ),
        # a MIG 3g.40gb instance: 40 x 1024 = 40960 MiB, 3 of 7 slices = 3000 // 7 = 428 milli
        (make_node(mode="mig"), {"mig-profile": "3g.40gb"}, None, Amount(40960, 428, 0)),
        # a MIG 1g.10gb instance: 10240 MiB, 1000 // 7 = 142 milli
        (make_node(mode="mig"), {"mig-profile": "1g.10gb"}, None, Amount(10240, 142, 0)),
        # a 7g.80gb instance holds every slice: 7000 // 7 = 1000 milli, so one whole GPU
        (make_node(mode="mig"), {"mig-profile": "7g.80gb"}, None, Amount(81920, 1000, 1)),
        # two whole exclusive GPUs: 2 x 81920 = 163840 MiB, 2 x 1000 milli, 2 whole GPUs
        (make_node(gpus=4), None, 2, Amount(163840, 2000, 2)),
        # a whole GPU on an MPS GPU holds all of it: 81920 MiB, 1000 milli, 1 whole GPU
        (make_node(mode="mps"), None, 1, Amount(81920, 1000, 1)),
        # 2 x 0.5 GPU across two MPS GPUs: 2 x 40960 = 81920 MiB, 2 x 500 = 1000 milli, no whole
        (make_node(gpus=2, mode="mps"), {"gpu-fraction": "0.5", "gpu-count": "2"}, None, Amount(81920, 1000, 0)),
    ],
)
def test_what_each_mode_holds(
    node: Node, annotations: dict[str, Any] | None, gpus: int | None, expected: Amount
) -> None:
    assert placed(node, annotations, gpus).total == expected


def test_nvlink_whole_gpus_count_each_gpu() -> None:
    # 4 GPUs joined by NVLink, 3 asked with nvlink required: 3 x 81920 = 245760 MiB, 3000 milli, 3 GPUs
    node = make_node(gpus=4, nvlink=frozenset({(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}))
    held = placed(node, {"nvlink": "required"}, 3)
    assert held.total == Amount(245760, 3000, 3)
    assert held.models == (("H100-80GB", Amount(245760, 3000, 3)),)


def test_static_mig_instance_counts_its_profile() -> None:
    device = make_device(0, "A100-40GB", "mig", mig_instances=static_mig("A100-40GB", ("2g.10gb", 0)))
    node = Node("n", 64_000, 512_000, (device,))
    # 2g.10gb: 10 x 1024 = 10240 MiB, 2 of 7 slices = 2000 // 7 = 285 milli
    assert placed(node, {"mig-profile": "2g.10gb"}).total == Amount(10240, 285, 0)


def test_charge_per_model_on_a_mixed_node() -> None:
    devices = (make_device(0, "H100-80GB", "mps"), make_device(1, "A100-40GB", "mps"))
    node = Node("n", 64_000, 512_000, devices)
    state = NodeState.empty(node)
    request = parse_pod(pod(annotations={"gpu-fraction": "0.5", "gpu-count": "2"}))
    found = evaluate(make_policy("binpack"), request.demand, state)
    assert not isinstance(found, str)
    held = charge(found.allocation, node)
    # 0.5 of each: 40960 MiB of the H100, 20480 MiB of the A100; 500 milli each
    assert held.models == (("A100-40GB", Amount(20480, 500, 0)), ("H100-80GB", Amount(40960, 500, 0)))
    assert held.total == Amount(61440, 1000, 0)


def test_use_by_namespace_sums_per_namespace() -> None:
    node = make_node(gpus=2, mode="mps")
    state = NodeState.empty(node)
    policy = make_policy("binpack")
    used = []
    for key in ("a/p1", "a/p2", "b/p1"):
        found = evaluate(policy, parse_pod(pod(annotations={"gpu-fraction": "0.25"})).demand, state)
        assert not isinstance(found, str)
        state = state.apply(key, found.allocation)
        used.append((key, found.allocation, node))
    totals = use_by_namespace(used)
    # a: 2 x 0.25 = 500 milli, 2 x 20480 = 40960 MiB; b: one of them
    assert totals["a"].total == Amount(40960, 500, 0)
    assert totals["b"].total == Amount(20480, 250, 0)


QUOTA = Quota("team-a", "gpus", Limits(memory_mib=81920, compute_milli=1000, gpus=1))
HALF = Charge(Amount(40960, 500, 0))
WHOLE = Charge(Amount(81920, 1000, 1))


@pytest.mark.parametrize(
    ("used", "adding", "expected"),
    [
        # 40960 + 40960 = 81920 <= 81920 MiB, 500 + 500 = 1000 <= 1000: exactly at the limit is within
        (HALF, HALF, None),
        # 40960 + 81920 = 122880 > 81920 MiB: memory is the first limit asked
        (
            HALF,
            WHOLE,
            "GPUQuota team-a/gpus: allows gpuMemory 81920 MiB, gpuCompute 1 GPUs, gpus 1 "
            "(used: 40960 MiB, 0.5 GPUs of compute, 0 whole GPUs)",
        ),
        # nothing used: a whole GPU fits exactly
        (Charge(), WHOLE, None),
    ],
)
def test_refusal_names_quota_limit_and_use(used: Charge, adding: Charge, expected: str | None) -> None:
    assert refusal([QUOTA], used, adding) == expected


def test_refusal_by_compute_and_by_whole_gpus() -> None:
    compute = Quota("ns", "c", Limits(compute_milli=1500))
    # 1000 + 1000 = 2000 > 1500 milli
    assert refusal([compute], WHOLE, WHOLE) == (
        "GPUQuota ns/c: allows gpuCompute 1.5 GPUs (used: 81920 MiB, 1 GPUs of compute, 1 whole GPUs)"
    )
    count = Quota("ns", "g", Limits(gpus=1))
    assert refusal([count], WHOLE, WHOLE) is not None
    assert refusal([count], WHOLE, HALF) is None  # a share adds no whole GPU


def test_a_limit_the_pod_takes_nothing_of_does_not_refuse() -> None:
    # the quota was lowered to 0 whole GPUs while one runs: a half GPU still fits (memory and
    # compute are unlimited), but the namespace is over its quota
    lowered = Quota("ns", "q", Limits(gpus=0))
    assert refusal([lowered], WHOLE, HALF) is None
    assert over_quota(lowered, WHOLE)
    assert not over_quota(lowered, HALF)


def test_per_model_limits_count_that_model_only() -> None:
    quota = Quota("ns", "q", models=(("H100-80GB", Limits(gpus=1)),))
    h100 = Charge(Amount(81920, 1000, 1), (("H100-80GB", Amount(81920, 1000, 1)),))
    a100 = Charge(Amount(40960, 1000, 1), (("A100-40GB", Amount(40960, 1000, 1)),))
    assert refusal([quota], h100, a100) is None  # A100s are not limited
    assert refusal([quota], h100, h100) == (
        "GPUQuota ns/q: H100-80GB allows gpus 1 (used: 81920 MiB, 1 GPUs of compute, 1 whole GPUs)"
    )


def test_every_quota_of_a_namespace_must_admit() -> None:
    loose = Quota("ns", "loose", Limits(gpus=8))
    tight = Quota("ns", "tight", Limits(memory_mib=40960))
    assert refusal([loose, tight], HALF, HALF) is not None
    assert refusal([loose], HALF, HALF) is None


def test_charges_add_and_subtract_per_model() -> None:
    a = Charge(Amount(1, 2, 0), (("A", Amount(1, 2, 0)),))
    b = Charge(Amount(3, 4, 1), (("B", Amount(3, 4, 1)),))
    assert (a + b).models == (("A", Amount(1, 2, 0)), ("B", Amount(3, 4, 1)))
    assert (a + b) - b == a


def quota_object(limits: Any, name: str = "q", namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "gpuslice.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": limits},
    }


def test_parse_quota_reads_quantities() -> None:
    quota = parse_quota(
        quota_object(
            {"gpuMemory": "320Gi", "gpuCompute": "2.5", "gpus": 4, "models": {"H100-80GB": {"gpuCompute": "500m"}}}
        )
    )
    # 320 x 1024 = 327680 MiB; 2.5 GPUs = 2500 milli; 500m = 0.5 GPU = 500 milli
    assert quota == Quota("team-a", "q", Limits(327680, 2500, 4), (("H100-80GB", Limits(None, 500, None)),))


def test_parse_quota_rounds_limits_down() -> None:
    # 1.5 MiB in bytes rounds down to 1 MiB; 0.0005 GPU = 0.5 milli rounds down to 0
    quota = parse_quota(quota_object({"gpuMemory": str(3 * 2**19), "gpuCompute": "0.0005"}))
    assert quota.limits == Limits(1, 0, None)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"gpuMemory": "lots"}, "GPUQuota team-a/q spec.limits.gpuMemory: invalid value 'lots'"),
        ({"gpuCompute": "-1"}, "GPUQuota team-a/q spec.limits.gpuCompute: invalid value '-1'"),
        ({"gpus": 1.5}, "GPUQuota team-a/q spec.limits.gpus: invalid value 1.5"),
        ({"gpus": True}, "GPUQuota team-a/q spec.limits.gpus: invalid value True"),
        ({"gpu": 1}, "GPUQuota team-a/q spec.limits.gpu: unknown field"),
        ({"models": {"H100": {"gpus": "x"}}}, "GPUQuota team-a/q spec.limits.models.H100.gpus: invalid value 'x'"),
        ({"models": ["H100"]}, "GPUQuota team-a/q spec.limits.models: must be a map"),
        ("1", "GPUQuota team-a/q spec.limits: must be an object"),
    ],
)
def test_parse_quota_names_the_bad_field(limits: Any, message: str) -> None:
    with pytest.raises(QuotaError) as caught:
        parse_quota(quota_object(limits))
    assert str(caught.value).startswith(message)


def test_status_reports_use_and_over_quota() -> None:
    quota = Quota("ns", "q", Limits(gpus=0), (("H100-80GB", Limits()),))
    used = Charge(Amount(81920, 1000, 1), (("H100-80GB", Amount(81920, 1000, 1)),))
    assert status_json(quota, used) == {
        "used": {
            "gpuMemory": "81920Mi",
            "gpuCompute": "1000m",
            "gpus": 1,
            "models": {"H100-80GB": {"gpuMemory": "81920Mi", "gpuCompute": "1000m", "gpus": 1}},
        },
        "overQuota": True,
    }
