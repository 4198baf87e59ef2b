"""What a policy is: a score of one placement, plus what it optionally needs, registered by name.

A policy answers one question: how good is placing this pod on this node with this
allocation? ``score(demand, state, allocation)``, a number in 0..100, higher is better.
The board (:mod:`scheduler.core.board`) does the rest: it finds the candidate allocations
(:func:`~scheduler.core.fit.fit`), keeps the best-scored one per node and compares nodes.
What the board may reuse follows from what the policy declares, never from its name.

Optional parts, found by their presence (a policy defines only what it needs):

``reads``
    What the score depends on beyond the pod's GPU request and the node's usage, free CPU and
    memory: a set of :class:`Reads` (default: the pod's CPU request). The board reuses a
    node's score for every pod that agrees on these, and for every node in the same state.
``tiebreak(demand, state, allocation) -> float``
    Within a node, among allocations of equal score: the lowest wins (then the lowest GPU
    index). Without it the lowest GPU index wins.
``normalize(scores) -> scores``
    Rescales the scores of the nodes a pod may go to (min-max, for instance).
``adjust(demand, scores, cluster) -> scores``
    The whole cluster weighs in; scores are ``-inf`` where the pod does not fit and must stay
    so. ``cluster`` (:class:`Cluster`) holds the cluster's histogram of free shares and each
    node's move in it, worked out only for a policy that declares it reads them
    (``Reads.GAPS``); its CPU; and, for a policy that declares ``Reads.GROUPS``, the same
    histogram split by GPU group (model and sharing mode, :mod:`scheduler.core.groups`).
``prepare(demand, candidates)``
    Told, before the board scores them one by one, of the candidate placements of a call
    (pairs of node state and allocation), so that what they have in common can be worked out
    at once; it must not change any score.
``score_took(demand, cpu_free, gpu_free, capacity, took) -> scores``
    For a policy whose score of one share of one GPU (one whole GPU, one MIG instance) reads
    only the node's free CPU, its GPUs' free share and capacity (milli-GPU) and the milli-GPU
    the share takes, and never falls as the share takes more: :meth:`score` over arrays, one
    entry per node, exactly (the same arithmetic). The board then scores every node of such
    a request at once, each by the share that takes the most of its hosting GPUs, instead of
    asking ``score`` placement by placement; it does so only for a policy that reads neither
    the gaps nor the pods.
``score_nodes(demand, candidates) -> (scores, moves)``
    For candidates that each place one share on one GPU, given as arrays
    (:class:`~scheduler.core.fragmentation.ShareCandidates`: per node its state and a label
    per GPU, equal for GPUs in equal device states; per candidate its node and GPU, the first
    GPU of each hosting device state of the node, in order; per label the share placed): per
    node what scoring them one by one gives, exactly, as arrays: the best scores, and the gap
    moves (one row per node) of the candidates the ``tiebreak`` picks among the best, then the
    first ((-1, -1) for no move), worked out at once. The board then asks it instead of
    ``score`` (and ``prepare``) placement by placement, and builds no placement per candidate.
``score_without_gpu(demand, states, labels) -> scores``
    For a pod that asks no GPU (one placement per node, taking only CPU and memory): per node
    of ``states`` (with a label per GPU, as :class:`~scheduler.core.fragmentation.ShareCandidates`
    has them), what ``score`` gives, exactly, worked out at once. The board then asks it
    instead of ``score`` node by node (such a placement moves no gap).
``observe(demand)``
    Told of each pod once, at its first sight (online policies learn here), and
    ``version``, raised whenever what it learned changes its scores.

A policy's options are a frozen dataclass (``options``, registered with it): the service's
configuration validates them by field path, and the simulator passes a :class:`Context`
(the run's seed, and the typical workload when one is known in advance) that a policy
may use or ignore.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..allocation import Allocation
from ..errors import ConfigError
from ..fragmentation import TypicalWorkload
from ..groups import Groups
from ..request import Demand, GpuKind
from ..state import NodeState


class Reads(StrEnum):
    """Parts of a pod a score may depend on."""

    CPU = "cpu"  # the CPU request
    CPU_WITHOUT_GPU = "cpu-without-gpu"  # the CPU request, of pods that ask for no GPU only
    MEMORY = "memory"  # the memory request
    PODS = "pods"  # the allocations of the pods already on the node (not only what they use)
    GAPS = "gaps"  # in adjust: the cluster's free shares and each placement's move among them
    GROUPS = "groups"  # in adjust: the free shares by GPU group, and each scored node's group


ALL_READS = frozenset({Reads.CPU})


@runtime_checkable
class Policy(Protocol):
    """The one method every policy has (see the module for the optional ones)."""

    name: str

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float: ...


class Cluster(Protocol):
    """What :meth:`adjust` may read of the cluster (worked out only when read)."""

    @property
    def gaps(self) -> np.ndarray:
        """``gaps[h]``: how many GPUs of the cluster have a free share at level ``h`` (hundredths)."""

    @property
    def moves(self) -> np.ndarray:
        """``moves[:, j]``: the (before, after) free level of the one GPU that node ``j``'s
        placement shares; -1 when it takes whole GPUs, several GPUs, or none."""

    @property
    def cpu_milli(self) -> int:
        """The allocatable CPU of the cluster's usable nodes, in milli-CPU."""

    @property
    def groups(self) -> Groups:
        """The cluster by GPU group, for the nodes scored (read only by ``Reads.GROUPS`` policies)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What the face running a policy knows: the run's seed, and the typical workload when it
    is known in advance (the simulator reads it from the whole trace, as the FGD paper does;
    the service knows none)."""

    seed: int = 0
    workload: TypicalWorkload | None = None


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A policy without options."""


@dataclass(frozen=True, slots=True)
class Entry:
    make: Callable[[Any, Context], Policy]
    options: type[Any]


REGISTRY: dict[str, Entry] = {}


def register(name: str, options: type[Any] = NoOptions) -> Callable[[Callable[[Any, Context], Policy]], Any]:
    """Register ``make(options, context)`` under ``name`` with its options dataclass."""

    def add(make: Callable[[Any, Context], Policy]) -> Any:
        if not name or name in REGISTRY:
            raise ValueError(f"policy {make!r} needs a unique name, got {name!r}")
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"the options of policy {name} must be a dataclass")
        REGISTRY[name] = Entry(make, options)
        return make

    return add


def options_of(name: str) -> type[Any]:
    """The options dataclass of policy ``name`` (ConfigError naming the accepted names if unknown)."""
    return entry(name).options


def entry(name: str) -> Entry:
    found = REGISTRY.get(name)
    if found is None:
        raise ConfigError(f"unknown policy {name!r}; accepted: {', '.join(sorted(REGISTRY))}")
    return found


def make_policy(name: str, options: Any = None, context: Context | None = None) -> Policy:
    """Policy ``name`` with ``options`` (its dataclass, a mapping of its fields, or None for the
    defaults) and ``context``. ConfigError names an unknown policy or option."""
    found = entry(name)
    if options is None:
        options = found.options()
    elif isinstance(options, Mapping):
        accepted = [f.name for f in dataclasses.fields(found.options)]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise ConfigError(
                f"policy {name}: unknown option {unknown[0]!r}; accepted: {', '.join(accepted) or 'none'}"
            )
        try:
            options = found.options(**options)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"policy {name}: {exc}") from exc
    elif not isinstance(options, found.options):
        raise ConfigError(f"policy {name}: options must be {found.options.__name__}, got {type(options).__name__}")
    return found.make(options, context or Context())


def reads(policy: Policy) -> frozenset[Reads]:
    """What of a pod ``policy``'s score depends on."""
    declared: frozenset[Reads] | None = getattr(policy, "reads", None)
    return ALL_READS if declared is None else declared


def demand_key(policy: Policy, demand: Demand) -> tuple[Any, ...]:
    """The parts of ``demand`` that ``policy``'s score reads (its GPU request always: whether it
    fits at all depends on it): pods with equal keys score alike."""
    parts = reads(policy)
    cpu = Reads.CPU in parts or (Reads.CPU_WITHOUT_GPU in parts and demand.gpu.kind is GpuKind.NONE)
    return (
        demand.gpu,
        demand.cpu_milli if cpu else None,
        demand.memory_mib if Reads.MEMORY in parts else None,
    )


def tell(policy: Policy, demand: Demand) -> None:
    """Tell ``policy`` of a pod seen (its ``observe``, if it learns)."""
    observe = getattr(policy, "observe", None)
    if observe is not None:
        observe(demand)


def version(policy: Policy) -> int:
    value: int = getattr(policy, "version", 0)
    return value
