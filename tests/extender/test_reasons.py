"""A node's reason names what the pod asks, never the numbers of the node's own state:
kube-scheduler counts the failed nodes by their reason's text, and an event's message ends
at 1,024 bytes. Nodes in different states that refuse for the same rule give one text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.fit import counted_reason, fit, short_reason
from scheduler.core.modes.shared import SHORT_COMPUTE, SHORT_MEMORY
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.state import NodeState
from tests.builders import make_state

lefts = st.lists(st.integers(0, 10**6), min_size=2, max_size=4, unique=True)


def one_text(texts: set[str | None]) -> str | None:
    (text,) = texts  # the same for every node
    return text


@given(used=st.lists(st.integers(200, 999), min_size=2, max_size=4, unique=True))
def test_a_share_refused_on_gpus_of_different_free_compute_reads_the_same(used: list[int]) -> None:
    asked = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=1_000, compute_milli=900))
    texts = set()
    for milli in used:  # one MPS GPU with ``milli`` of its compute already given to a pod
        state = make_state(mode="mps")
        small = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=1_000, compute_milli=milli))
        state = state.apply("a", fit(small, state).allocations[0])
        texts.add(fit(asked, state).reason)
    expected = "needs 90 percent compute on one GPU, more than is free"
    assert one_text(texts) == short_reason(SHORT_COMPUTE, 900) == expected


@given(taken=st.lists(st.integers(0, 70_000), min_size=2, max_size=4, unique=True))
def test_a_share_refused_on_gpus_of_different_free_memory_reads_the_same(taken: list[int]) -> None:
    # compute given, so that memory alone refuses (a memory request alone takes compute in proportion)
    asked = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=79_000, compute_milli=10))
    texts = set()
    for used in taken:  # one MPS GPU of 80 GB with ``used`` MiB (and 1 percent) given to a pod
        state = make_state(mode="mps")
        small = Demand(0, 0, GpuRequest(GpuKind.SHARE, 1, memory_mib=max(used, 3_000), compute_milli=10))
        state = state.apply("a", fit(small, state).allocations[0])
        assert not fit(asked, state)
        texts.add(fit(asked, state).reason)
    expected = "needs 79000 MiB on one GPU, more than is free"
    assert one_text(texts) == short_reason(SHORT_MEMORY, 79_000) == expected


@given(count=st.integers(2, 8), used=st.lists(st.integers(0, 7), min_size=2, max_size=4, unique=True))
def test_gpu_counts_read_the_same_on_every_node(count: int, used: list[int]) -> None:
    whole = Demand(0, 0, GpuRequest(GpuKind.WHOLE, count))
    texts = set()
    for taken in used:  # a node of 8 GPUs with all but fewer than ``count`` of them taken
        state: NodeState = make_state(gpus=8)
        for _ in range(8 - (taken % count)):
            one = fit(Demand(0, 0, GpuRequest(GpuKind.WHOLE, 1)), state).allocations[0]
            state = state.apply(f"p{len(state.pods)}", one)
        texts.add(fit(whole, state).reason)
    gpu = whole.gpu
    why = "GPU 0 is not free"  # the first of the GPUs that refuse (GPU 0 is taken on every node here)
    assert (
        one_text(texts)
        == counted_reason(gpu, why)
        == f"needs {count} GPUs for {gpu.describe()}, not that many available ({why})"
    )
    # joined by NVLink: nodes of enough GPUs whose largest joined set is smaller than asked
    linked = Demand(0, 0, GpuRequest(GpuKind.WHOLE, count, nvlink=True))
    nvlink = set()
    for taken in used:
        joined = taken % (count - 1) + 1
        links = frozenset((a, b) for a in range(joined) for b in range(a + 1, joined))
        nvlink.add(fit(linked, make_state(gpus=count, nvlink=links)).reason)
    assert one_text(nvlink) == f"needs {count} GPUs joined by NVLink, not that many free and joined"


@given(cpu=lefts, memory=lefts)
def test_host_refusals_read_the_same_on_every_node(cpu: list[int], memory: list[int]) -> None:
    asked = 10**6 + 1
    texts = {fit(Demand(asked, 0), make_state(cpu_milli=c)).reason for c in cpu}
    assert one_text(texts) == f"insufficient cpu: needs {asked}m"
    texts = {fit(Demand(0, asked), make_state(memory_mib=m)).reason for m in memory}
    assert one_text(texts) == f"insufficient memory: needs {asked} MiB"
