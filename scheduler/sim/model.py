"""What a simulation runs on: a cluster of nodes, pods with their demands and times."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.core.allocation import Allocation
from scheduler.core.inventory import Node
from scheduler.core.quota import Quota
from scheduler.core.request import MILLI, Demand

# How a trace is replayed unless the command line says otherwise.
ARRIVALS = "arrivals"  # the FGD protocol: seeded shuffle, inflation, pods never leave
TIMED = "timed"  # creation and deletion times: freed shares are reused
REPLAY_MODES = (ARRIVALS, TIMED)


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod of a trace. Times are seconds from the trace start (None: unknown / never)."""

    name: str
    demand: Demand
    created: float | None = None
    deleted: float | None = None
    namespace: str = "default"  # whose GPU quota it counts against (scenarios' namespace:)


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod already running when the simulation starts (from a cluster snapshot).

    Without an allocation record it gets the first allocation ``fit`` finds on its node.
    """

    name: str
    node: str
    demand: Demand
    allocation: Allocation | None = None


@dataclass(frozen=True, slots=True)
class Shape:
    """One request shape of a generator, drawn with probability weight / total weight."""

    demand: Demand
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Generator:
    """Pods drawn at run time from the run's seed: ``count`` pods, shapes by weight, Poisson
    arrivals at ``rate`` per second from ``start`` (all at ``start`` if rate is 0), and
    durations (None: pods never leave) from ``duration``."""

    name: str
    count: int
    shapes: tuple[Shape, ...]
    rate: float = 0.0
    start: float = 0.0
    duration: Duration | None = None
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class Duration:
    """How long generated pods run: ``fixed`` (mean), ``exponential`` (mean) or ``uniform`` (low..high)."""

    distribution: str = "fixed"
    mean: float = 0.0
    low: float = 0.0
    high: float = 0.0


@dataclass(frozen=True)
class Trace:
    """A cluster and a workload, as read from one input.

    ``replay``, ``inflate`` and ``shuffle`` are the input's own defaults for how to run it.
    """

    name: str
    nodes: tuple[Node, ...]
    pods: tuple[SimPod, ...]
    bound: tuple[BoundPod, ...] = ()
    replay: str = ARRIVALS
    inflate: float = 0.0
    shuffle: bool = True
    source: str = ""
    typical: tuple[Demand, ...] = field(default=(), repr=False)  # pods defining the typical workload
    generators: tuple[Generator, ...] = ()
    quotas: tuple[Quota, ...] = ()  # GPU quotas per namespace (scenarios' quotas:)

    @property
    def gpus(self) -> int:
        return sum(len(n.devices) for n in self.nodes)

    @property
    def capacity_milli(self) -> int:
        return MILLI * self.gpus

    def typical_demands(self) -> tuple[Demand, ...]:
        """The pods the fragmentation measure's typical shapes are drawn from (the original
        workload, before any inflation)."""
        if self.typical:
            return self.typical
        demands = [p.demand for p in self.pods]
        for gen in self.generators:
            # the generator's expected mix, about 100 pods' worth per generator
            total = sum(s.weight for s in gen.shapes) or 1.0
            for shape in gen.shapes:
                demands += [shape.demand] * max(1, round(100 * shape.weight / total))
        return tuple(demands)

    def reference_memory_mib(self) -> int:
        """The largest GPU memory in the cluster: the yardstick for memory-only requests."""
        return max((d.memory_mib for n in self.nodes for d in n.devices), default=0)


def request_milli(demand: Demand, reference_memory_mib: int = 0) -> int:
    """GPU requested by a pod, in milli-GPU, independent of where it lands
    (:meth:`~scheduler.core.request.GpuRequest.total_milli`; ``reference_memory_mib`` is the
    cluster's largest GPU, against which a memory-only request is read)."""
    return demand.gpu.total_milli(reference_memory_mib)


def total_request_milli(pods: Iterable[SimPod], reference_memory_mib: int = 0) -> int:
    return sum(request_milli(p.demand, reference_memory_mib) for p in pods)
