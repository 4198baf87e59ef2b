"""fit: candidates, selectors, multi-GPU topology, and the reasons a pod does not fit."""

from __future__ import annotations

from scheduler.core.board import Board
from scheduler.core.fit import fit
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.policies import make_policy
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_device, make_state


def test_one_candidate_per_fitting_gpu_in_index_order() -> None:
    state = make_state(gpus=3, mode="mps")
    found = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500)), state)
    assert [a.shares[0].index for a in found.allocations] == [0, 1, 2]


def test_model_selector_reason() -> None:
    found = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1, models=("H100-80GB", "A100-80GB"))), make_state(model="T4"))
    assert found.reason == "model T4 not in H100-80GB|A100-80GB"


def test_sharing_selector_reason() -> None:
    gpu = GpuRequest(GpuKind.SHARE, 1, fraction_milli=500, sharing=frozenset({SharingMode.MIG}))
    assert fit(Demand(0, 0, gpu), make_state(mode="mps")).reason == "no GPU in sharing mode mig"


def test_memory_reason_names_what_is_asked_not_what_each_gpu_has() -> None:
    state = make_state(gpus=2, mode="mps", model="L4")  # 23034 MiB each
    first = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=16384)), state)
    state = state.apply("a", first.allocations[0])
    found = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=20480, compute_milli=10)), state)
    assert found  # GPU 1 is empty
    state = state.apply("b", found.allocations[0])
    # GPU 0: 23034 - 16384 = 6650 free; GPU 1: 23034 - 20480 = 2554 free
    assert (
        fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=8192, compute_milli=10)), state).reason
        == "needs 8192 MiB on one GPU, more than is free"
    )


def test_multi_gpu_prefers_the_best_connected_set() -> None:
    # NVLink pairs (0,3), (1,2), (2,3), (1,3): {1,2,3} has 3 links, any set with 0 has at most 2.
    devices = tuple(make_device(i, uuid=f"g{i}") for i in range(4))
    node = Node("n", 64_000, 512_000, devices, nvlink=frozenset({(0, 3), (1, 2), (2, 3), (1, 3)}))
    found = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 3)), NodeState.empty(node))
    assert [s.index for s in found.allocations[0].shares] == [1, 2, 3]
    # without a topology: lowest indices
    plain = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 3)), make_state(gpus=4))
    assert [s.index for s in plain.allocations[0].shares] == [0, 1, 2]


def test_nvlink_required_takes_gpus_joined_pairwise() -> None:
    # Links (0,1), (1,2), (2,3), (1,3): the only triangle is {1,2,3}; {0,1,2} is a path, not joined pairwise.
    devices = tuple(make_device(i, uuid=f"g{i}") for i in range(4))
    node = Node("n", 64_000, 512_000, devices, nvlink=frozenset({(0, 1), (1, 2), (2, 3), (1, 3)}))
    required = Demand(0, 0, GpuRequest(GpuKind.WHOLE, 3, nvlink=True))
    state = NodeState.empty(node)
    assert [s.index for s in fit(required, state).allocations[0].shares] == [1, 2, 3]
    # with GPU 3 taken, no three free GPUs are joined pairwise: the largest such set is a pair
    state = state.apply("a", fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), state).allocations[3])
    assert fit(required, state).reason == "needs 3 GPUs joined by NVLink, not that many free and joined"
    # preferred (the default) still takes the best connected three
    assert [s.index for s in fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 3)), state).allocations[0].shares] == [
        0,
        1,
        2,
    ]
    # no topology at all: a required pair never fits, a single GPU always does
    plain = make_state(gpus=4)
    assert fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 2, nvlink=True)), plain).reason == (
        "needs 2 GPUs joined by NVLink, not that many free and joined"
    )
    assert fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1, nvlink=True)), plain)


def test_multi_gpu_count_reason() -> None:
    state = make_state(gpus=2)
    state = state.apply("a", fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), state).allocations[0])
    found = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 2)), state)
    assert found.reason.startswith("needs 2 GPUs for 2 whole GPUs, not that many available")


def test_shared_multi_gpu_takes_a_share_on_each() -> None:
    state = make_state(gpus=2, mode="mps")
    alloc = fit(Demand(0, 0, GpuRequest(GpuKind.SHARE, 2, fraction_milli=250)), state).allocations[0]
    assert [(s.index, s.compute_milli) for s in alloc.shares] == [(0, 250), (1, 250)]


def test_cpu_only_pod_fits_without_gpus() -> None:
    found = fit(Demand(1000, 1024), NodeState.empty(Node("cpu", 4000, 8192)))
    assert found and found.allocations[0].shares == ()


def test_gpu_pod_on_a_node_without_gpus() -> None:
    assert (
        fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), NodeState.empty(Node("cpu", 4000, 8192))).reason
        == "node has no GPUs"
    )


def test_a_reason_names_the_gpu_of_its_own_node_whatever_was_asked_before() -> None:
    """Answers are kept per GPU state, which GPUs at other indices share: node p's GPU 0 and
    node q's GPU 1 hold the same 0.3 GPU on time-slicing GPUs of one replica. Asked of p
    first, q's reason must still name q's own GPU 1 (its most free memory: 1 - 0.3 against
    1 - 0.8), through fit and through the board."""
    p = make_state(name="p", gpus=1, mode="time-slicing", device_options={"replicas": 1})
    p = p.apply("a", fit(_fraction(300), p).allocations[0])
    q = make_state(name="q", gpus=2, mode="time-slicing", device_options={"replicas": 1})
    q = q.apply("b", fit(_fraction(800), q).allocations[0])  # GPU 0
    q = q.apply("c", fit(_fraction(300), q).allocations[0])  # GPU 1, as p's GPU 0
    asked = _fraction(500)
    assert fit(asked, p).reason == "GPU 0 has no free time-slicing replica (of 1)"
    assert fit(asked, q).reason == "GPU 1 has no free time-slicing replica (of 1)"
    outcomes = Board([p, q]).filter(make_policy("binpack"), _fraction(400))
    assert [outcomes.texts[r] for r in outcomes.reason] == [
        "GPU 0 has no free time-slicing replica (of 1)",
        "GPU 1 has no free time-slicing replica (of 1)",
    ]


def _fraction(milli: int) -> Demand:
    return Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli))
