"""What a policy is: a score of one placement, plus what it optionally needs, registered by name.

A policy answers one question: how good is placing this pod on this node with this
allocation? ``score(demand, state, allocation)``, a number in 0..100, higher is better.
The board (:mod:`scheduler.core.board`) does the rest: it finds the candidate allocations
(:func:`~scheduler.core.fit.fit`), keeps the best-scored one per node and compares nodes.
What the board may reuse follows from what the policy declares, never from its name.

Optional parts, each a capability: a protocol (:class:`Reading`, :class:`Tiebreaking`,
:class:`Normalizing`, :class:`Adjusting`, :class:`Preparing`, :class:`ScoringTook`,
:class:`ScoringNodes`, :class:`ScoringWithoutGpu`, :class:`Learning`) that the policy's class
names among its bases, so mypy checks its signature; :func:`capabilities` finds them once per
policy and refuses a class whose hooks and named protocols disagree (a policy defines only
what it needs):

``reads``
    What the score depends on beyond the pod's GPU request and the node's usage, free CPU and
    memory: a set of :class:`Reads` (default: the pod's CPU request). The board reuses a
    node's score for every pod that agrees on these, and for every node in the same state.
    Checked, not trusted: ``adjust`` is given a view of the cluster (:class:`Declared`) that
    refuses, naming the policy, a part the policy does not declare; and every registered
    policy's scores through the board are checked against the plain node-by-node ranking
    (:func:`scheduler.core.select.rank`, which reuses nothing) in the tests, which catch a
    score that reads more of the pod than it declares.
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
``learned``
    A policy that learns reads what it learned from one object, its :class:`Learned`: told of
    each pod once, at its first sight (``observe``), and of the cluster as each call sees it,
    just before ``adjust`` (``follow``: fgd-reserve follows the cluster's free GPU from call to
    call); its ``version`` rises whenever what it learned changes the policy's scores. Learning
    happens there and only there: ``score``, ``adjust`` and the other hooks read the learned
    object and the cluster as they stand and change neither (what they keep besides is a memo
    of pure results, named in the class's ``memos``; the one exception is ``random``, whose
    generators are its learned object and whose ``adjust`` and ``tiebreak`` draw from them).
    The face that makes the policy (the service, the simulator) owns its learned object; a
    planner that asks about clusters that are not the one served (defragmentation) asks the
    same policy over a copy of it (:func:`over_a_copy`), so the serving one never sees those
    clusters and no second policy need be told the same pods.

A policy's options are a frozen dataclass (``options``, registered with it): the service's
configuration validates them by field path, and the simulator passes a :class:`Context`
(the run's seed, and the typical workload when one is known in advance) that a policy
may use or ignore.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..allocation import Allocation
from ..errors import ConfigError
from ..fragmentation import ShareCandidates, TypicalWorkload
from ..groups import Groups
from ..request import Demand, GpuKind
from ..state import NodeState
from .options import unknown_options


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
    """The one method every policy has; what else it can do is one of the capabilities below,
    each a protocol the policy's class names among its bases (so mypy checks its signatures)."""

    name: str

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float: ...


@runtime_checkable
class Reading(Protocol):
    """Declares what of a pod and of the cluster its scores read (see the module: ``reads``)."""

    reads: frozenset[Reads]


@runtime_checkable
class Tiebreaking(Protocol):
    def tiebreak(self, demand: Demand, state: NodeState, allocation: Allocation) -> float: ...


@runtime_checkable
class Normalizing(Protocol):
    def normalize(self, scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class Adjusting(Protocol):
    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray: ...


@runtime_checkable
class Preparing(Protocol):
    def prepare(self, demand: Demand, candidates: Sequence[tuple[NodeState, Allocation]]) -> None: ...


@runtime_checkable
class ScoringTook(Protocol):
    def score_took(
        self, demand: Demand, cpu_free: np.ndarray, gpu_free: np.ndarray, capacity: np.ndarray, took: np.ndarray
    ) -> np.ndarray: ...


@runtime_checkable
class ScoringNodes(Protocol):
    def score_nodes(self, demand: Demand, batch: ShareCandidates) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class ScoringWithoutGpu(Protocol):
    def score_without_gpu(self, demand: Demand, states: Sequence[NodeState], labels: np.ndarray) -> list[float]: ...


class Learned(Protocol):
    """What a policy learned, one object that the face owning the policy owns: the pods seen
    (``observe``), what it follows of the cluster from call to call (``follow``), and what is
    worked out of them when they change. ``version`` rises whenever that changes the policy's
    scores (the board keeps scores by it). ``copy`` is a copy that shares nothing mutable."""

    version: int

    def observe(self, demand: Demand) -> None: ...

    def follow(self, demand: Demand, cluster: Cluster) -> None: ...

    def copy(self) -> Learned: ...


@runtime_checkable
class Learning(Protocol):
    """Reads what it learned from ``learned`` (see :class:`Learned`); ``over(learned)`` is the
    same policy (its options) reading another learned object. ``memos``: the attributes that
    only memoise pure results (everything else of the policy stays as made)."""

    learned: Learned
    memos: frozenset[str]

    def over(self, learned: Learned) -> Policy: ...


CAPABILITIES: dict[str, Any] = {  # protocols: mypy takes no abstract class as type[...]
    "reads": Reading,
    "tiebreak": Tiebreaking,
    "normalize": Normalizing,
    "adjust": Adjusting,
    "prepare": Preparing,
    "score_took": ScoringTook,
    "score_nodes": ScoringNodes,
    "score_without_gpu": ScoringWithoutGpu,
    "learned": Learning,
}  # the part each capability adds, by the name of its defining attribute


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a policy can do beyond ``score``, each part None where it cannot: found once per
    policy from the capability protocols its class names (never from an attribute's mere
    presence: :func:`capabilities` refuses a policy that has a hook it does not declare)."""

    reads: frozenset[Reads]
    tiebreak: Tiebreaking | None
    normalize: Normalizing | None
    adjust: Adjusting | None
    prepare: Preparing | None
    score_took: ScoringTook | None
    score_nodes: ScoringNodes | None
    score_without_gpu: ScoringWithoutGpu | None
    learning: Learning | None


_FOUND: dict[int, tuple[Policy, Capabilities]] = {}  # by the policy's id (with the policy: an id is reused)


def capabilities(policy: Policy) -> Capabilities:
    """``policy``'s capabilities, by the protocols its class names among its bases (found once
    per policy). A hook that the class has without naming its protocol, or the other way
    round, is a mistake (some code paths would call it and others not): TypeError naming it."""
    kept = _FOUND.get(id(policy))
    if kept is not None and kept[0] is policy:
        return kept[1]
    bases = type(policy).__mro__
    for attribute, protocol in CAPABILITIES.items():
        if (protocol in bases) != hasattr(policy, attribute):
            raise TypeError(
                f"policy {policy.name}: {attribute!r} and the capability {protocol.__name__} go together "
                f"(name {protocol.__name__} among the class's bases and define {attribute})"
            )
    # each protocol is among the bases exactly when the policy has its part: isinstance says so too
    found = Capabilities(
        reads=policy.reads if isinstance(policy, Reading) else ALL_READS,
        tiebreak=policy if isinstance(policy, Tiebreaking) else None,
        normalize=policy if isinstance(policy, Normalizing) else None,
        adjust=policy if isinstance(policy, Adjusting) else None,
        prepare=policy if isinstance(policy, Preparing) else None,
        score_took=policy if isinstance(policy, ScoringTook) else None,
        score_nodes=policy if isinstance(policy, ScoringNodes) else None,
        score_without_gpu=policy if isinstance(policy, ScoringWithoutGpu) else None,
        learning=policy if isinstance(policy, Learning) else None,
    )
    if len(_FOUND) >= 256:
        _FOUND.clear()
    _FOUND[id(policy)] = (policy, found)
    return found


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


class ReadsError(TypeError):
    """A policy read a part of the cluster it does not declare (its ``reads``): the board
    would have answered from a cache that does not follow that part."""


class Declared:
    """The :class:`Cluster` a policy's ``adjust`` is given: the parts it declares it reads
    (``Reads.GAPS``: ``gaps`` and ``moves``; ``Reads.GROUPS``: ``groups``), and its CPU; any
    other part read raises :class:`ReadsError` naming the policy, so a wrong declaration
    cannot leave it reading moves the board never worked out."""

    __slots__ = ("_cluster", "_name", "_reads")

    def __init__(self, cluster: Cluster, reads: frozenset[Reads], name: str) -> None:
        self._cluster = cluster
        self._reads = reads
        self._name = name

    def _part(self, part: Reads, what: str) -> None:
        if part not in self._reads:
            raise ReadsError(
                f"policy {self._name} read the cluster's {what} in adjust but does not declare Reads.{part.name}"
            )

    @property
    def gaps(self) -> np.ndarray:
        self._part(Reads.GAPS, "gaps")
        return self._cluster.gaps

    @property
    def moves(self) -> np.ndarray:
        self._part(Reads.GAPS, "moves")
        return self._cluster.moves

    @property
    def cpu_milli(self) -> int:
        return self._cluster.cpu_milli

    @property
    def groups(self) -> Groups:
        self._part(Reads.GROUPS, "groups")
        return self._cluster.groups


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
        unknown = unknown_options(found.options, options)
        if unknown:
            where, accepted, _ = unknown[0]
            shown = ".".join(map(str, where))
            raise ConfigError(f"policy {name}: unknown option {shown!r}; accepted: {', '.join(accepted) or 'none'}")
        try:
            options = found.options(**options)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"policy {name}: {exc}") from exc
    elif not isinstance(options, found.options):
        raise ConfigError(f"policy {name}: options must be {found.options.__name__}, got {type(options).__name__}")
    return found.make(options, context or Context())


def reads(policy: Policy) -> frozenset[Reads]:
    """What of a pod ``policy``'s score depends on."""
    return capabilities(policy).reads


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
    """Tell ``policy``'s learned object of a pod seen (if it learns)."""
    learning = capabilities(policy).learning
    if learning is not None:
        learning.learned.observe(demand)


def over_a_copy(policy: Policy) -> Policy:
    """``policy`` over a copy of what it learned, to ask about clusters that are not the one it
    serves (a defragmentation plan's): the copy follows those clusters, the learned object of
    the face that owns the policy does not, and no second policy is told the same pods. A
    policy that learns nothing answers from its options alone: the policy itself."""
    learning = capabilities(policy).learning
    return policy if learning is None else learning.over(learning.learned.copy())


def version(policy: Policy) -> int:
    learning = capabilities(policy).learning
    return 0 if learning is None else learning.learned.version
