"""A filter answer's reasons name what the pod asks, never the numbers of each node's own
state: kube-scheduler counts the failed nodes by their reason's text, and an event's message
ends at 1,024 bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.capacity import SHORT_COMPUTE, SHORT_MEMORY
from scheduler.core.fit import counted_reason, fit, short_reason
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.extender import wire
from tests.builders import make_state

lefts = st.lists(st.integers(0, 10**6), min_size=2, max_size=4, unique=True)


def one_text(texts: set[str], asked: str) -> str:
    (text,) = texts  # the same for every node
    assert asked in text
    return text


@given(need=st.integers(1, 10**6), left=lefts)
def test_memory_and_compute_refusals_read_the_same_on_every_node(need: int, left: list[int]) -> None:
    memory = one_text({wire.node_reason(short_reason(SHORT_MEMORY, need, f)) for f in left}, f"needs {need} MiB")
    assert memory == f"needs {need} MiB on one GPU, none has that much free"
    milli = need % 1000 + 1  # what is asked is more than any node's free compute below
    compute = {wire.node_reason(short_reason(SHORT_COMPUTE, milli, f % milli)) for f in left}
    assert one_text(compute, "compute on one GPU").endswith(", none has that much free")


@given(count=st.integers(2, 9), options=st.lists(st.integers(0, 8), min_size=2, max_size=4, unique=True))
def test_gpu_counts_read_the_same_on_every_node(count: int, options: list[int]) -> None:
    gpu = GpuRequest(GpuKind.WHOLE, count)
    texts = {wire.node_reason(counted_reason(gpu, n, short_reason(SHORT_MEMORY, 80_000, n * 100))) for n in options}
    memory = "needs 80000 MiB on one GPU, none has that much free"
    asked = f"needs {count} GPUs for {gpu.describe()}"
    assert one_text(texts, asked) == f"{asked}, fewer available ({memory})"
    # joined by NVLink: nodes of enough GPUs whose largest joined set is smaller than asked
    linked = Demand(0, 0, GpuRequest(GpuKind.WHOLE, count, nvlink=True))
    nvlink = set()
    for n in options:
        joined = n % (count - 1) + 1
        links = frozenset((a, b) for a in range(joined) for b in range(a + 1, joined))
        reason = fit(linked, make_state(gpus=count, nvlink=links)).reason
        assert f", {joined} available" in reason
        nvlink.add(wire.node_reason(reason))
    asked = f"needs {count} GPUs joined by NVLink"
    assert one_text(nvlink, asked) == f"{asked}, fewer available"


@given(cpu=lefts, memory=lefts)
def test_host_refusals_read_the_same_on_every_node(cpu: list[int], memory: list[int]) -> None:
    asked_cpu, asked_memory = 10**6 + 1, 10**6 + 1
    texts = {wire.node_reason(fit(Demand(asked_cpu, 0), make_state(cpu_milli=c)).reason) for c in cpu}
    assert one_text(texts, f"needs {asked_cpu}m") == f"insufficient cpu: needs {asked_cpu}m"
    texts = {wire.node_reason(fit(Demand(0, asked_memory), make_state(memory_mib=m)).reason) for m in memory}
    assert one_text(texts, f"needs {asked_memory} MiB") == f"insufficient memory: needs {asked_memory} MiB"


def test_what_names_no_node_number_is_kept() -> None:
    for text in ("model L4 not in A30", "node has no GPUs", "GPU 0 is not free", "no free MIG slot for 3g.40gb"):
        assert wire.node_reason(text) == text
