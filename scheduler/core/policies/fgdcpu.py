"""fgd-cpu: fragmentation gradient descent that also counts the GPU a node strands for lack of
CPU, and keeps the cluster's partly used GPUs in balance.

Cost of a node state, in milli-GPU:

    C_n = F_n(M) + lambda * S_n,    S_n = max(0, gpu_free_n - r * cpu_free_n)

F_n(M) is FGD's fragmentation against the typical workload M
(:mod:`scheduler.core.fragmentation`); r is M's GPU per CPU (popularity-weighted
milli-GPU over milli-CPU of its GPU shapes), so S_n is the idle GPU that pods of the
typical mix could not use because the node's CPU runs out first. A placement's local
score is the fall of C it causes, 50 + 50 * tanh((C_before - C_after) / 2000) rounded to
an integer in 0..100 (near the middle one point is about 40 milli-GPU of cost, so
near-equal placements tie and the balance below decides between them). Inside the node
every distinct candidate GPU or MIG slot is tried and the lowest C wins.

For a pod that takes a share of one GPU, the cluster then weighs in (:meth:`adjust`, run
by the board on every call). A partly used GPU's free share is counted by its class:
the largest share size seen so far that fits in it, in hundredths of a GPU (a 0.21 hole
and a 0.19 hole are both of class 0.16 when the shares seen are 0.16, 0.32, 0.47 and
0.81); a hole smaller than every share seen has no class and is not counted. Holes of
one class admit exactly the same pods seen so far, so they wait for the same future
pods. Let N[c] count the GPUs of class c. The placement moves one GPU from class a to
class b, which changes sum(N[c]^2) by (2 N[b] + 1) - (2 N[a] - 1) (0 when a = b); the
score loses ``balance_weight`` points per unit of that rise per GPU of the cluster. This
is the Sum-of-Squares rule of online bin packing (Csirik, Johnson, Kenyon, Orlin, Shor
and Weber, 2006) over classes instead of exact gap sizes, used with a weight of 0.0125
points per unit of rise on a 6,000-GPU cluster (75 / 6,000).

Why it wastes less than FGD: FGD sees CPU only through single typical pods ("can one
more fit?"), so a 96-core node with 8 GPUs looks unfragmented until its last CPU is
gone, and CPU-heavy or CPU-only pods that land there strand its GPUs. S prices that
early and steers CPU-heavy pods to CPU-rich nodes (on the openb trace: the 2-GPU,
104-core T4 nodes) and CPU-light pods to CPU-poor ones. FGD
also judges each hole alone: a hole that typical pods can use looks harmless however
many such holes already wait. The squares make a hole that is already common costly to
create and cheap to fill, so small shares go to the 0.19-GPU holes that 0.81-GPU pods
leave (which few pods can use) and 0.81-GPU pods go beside a small share when they can.
Counting by class rather than by exact size sees that a new 0.21 hole (0.32 beside 0.47)
competes with those many 0.19 holes for the few pods of 0.16 GPU or less, where exact
sizes took it for a rare and so harmless hole (default openb trace, seeds 42-51: 4.00%
unallocated against 4.06% by exact sizes).

M and r are learned online from the pods seen so far (:class:`OnlineWorkload`), never
from the trace in advance (the run's known workload, :class:`~.base.Context`, is ignored on
purpose), and so are the share sizes that define the classes: all of it in one object,
:class:`FgdCpuLearned`, that the policy reads and the face owning it owns (scoring changes
nothing of it); each re-estimate of M raises its ``version`` so cached scores are not reused.
N is the cluster as it stands. Options
(:class:`FgdCpuOptions`): the workload assumed until the first estimate, the two weights,
and whether to learn at all (off only to pin a workload, in a test).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..allocation import Allocation
from ..capacity import GAP_LEVELS, allocated_milli, gap_level
from ..fragmentation import (
    DEFAULT_WORKLOAD,
    Fragmentation,
    OnlineWorkload,
    Shape,
    ShareCandidates,
    TypicalWorkload,
    workload_of,
)
from ..request import Demand, GpuKind, GpuRequest
from ..state import NodeState
from .base import (
    Adjusting,
    Cluster,
    Context,
    Learned,
    Learning,
    Preparing,
    Reading,
    Reads,
    ScoringNodes,
    ScoringWithoutGpu,
    Tiebreaking,
    register,
)

DEFAULT_STRANDING_WEIGHT = 4.0
DEFAULT_BALANCE_WEIGHT = 75.0
SCORE_SCALE_MILLI = 2000.0
NOMINAL_GPU_MIB = 81920  # a memory-only share is read against an 80 GiB GPU
_COSTS_KEPT = 4096  # placements whose costs are kept (see FgdCpu._costs_of)


def nominal_milli(gpu: GpuRequest) -> int:
    """A request's share of one GPU in milli-GPU (a memory-only share read against 80 GiB)."""
    return gpu.per_gpu_milli(NOMINAL_GPU_MIB)


def gpu_per_cpu(workload: TypicalWorkload) -> float:
    """Milli-GPU per milli-CPU of the workload's GPU shapes (0 when they ask for no CPU)."""
    gpu = cpu = 0.0
    for demand, p in workload.shapes:
        g = demand.gpu
        if g.kind is GpuKind.NONE:
            continue
        gpu += p * nominal_milli(g) * g.count
        cpu += p * demand.cpu_milli
    return gpu / cpu if cpu else 0.0


@dataclass(frozen=True, slots=True)
class FgdCpuOptions:
    workload: tuple[Shape, ...] | None = None  # assumed until the first estimate (default: built in)
    stranding_weight: float = DEFAULT_STRANDING_WEIGHT  # milli-GPU of cost per milli-GPU stranded
    balance_weight: float = DEFAULT_BALANCE_WEIGHT  # score points per unit of balance rise per GPU (0: off)
    learn: bool = True  # refine the workload from the pods seen

    def __post_init__(self) -> None:
        for field in ("stranding_weight", "balance_weight"):
            value = getattr(self, field)
            if not 0 <= value < math.inf:
                raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")


def gap_classes_of(share_levels: np.ndarray) -> np.ndarray:
    """Per gap level 0..GAP_LEVELS, then one entry for "no move": the class a GPU with that
    free share counts in, the largest of ``share_levels`` (the share sizes seen) that is at most
    the gap; -1 when none is (dead holes), for idle GPUs (level GAP_LEVELS) and for no move."""
    levels = np.arange(GAP_LEVELS)
    largest = np.maximum.accumulate(np.where(share_levels[:GAP_LEVELS], levels, -1))
    return np.concatenate([largest, [-1, -1]])


class FgdCpuLearned:
    """What fgd-cpu learns from the pods seen, and what is worked out of it when it changes:
    the typical workload M (re-estimated online from the prior, or the prior for good when not
    learning), r (M's GPU per CPU), the share sizes seen and the classes of holes they define.
    ``version`` rises with each new M. Scoring only reads it."""

    def __init__(self, prior: TypicalWorkload, online: OnlineWorkload | None) -> None:
        self.online = online
        self.workload = prior
        self.ratio = gpu_per_cpu(prior)
        self.share_levels = np.zeros(GAP_LEVELS + 1, dtype=bool)  # the share sizes seen, in hundredths
        self.classes = gap_classes_of(self.share_levels)  # replaced, never changed in place
        self.version = 0

    def observe(self, demand: Demand) -> None:
        if demand.gpu.kind is GpuKind.SHARE:
            level = max(1, gap_level(nominal_milli(demand.gpu)))
            if not self.share_levels[level]:
                self.share_levels[level] = True
                self.classes = gap_classes_of(self.share_levels)
        if self.online is not None and self.online.observe(demand):
            self.workload = self.online.workload
            self.ratio = gpu_per_cpu(self.workload)
            self.version += 1

    def follow(self, demand: Demand, cluster: Cluster) -> None:
        """fgd-cpu follows nothing of the cluster from call to call."""

    def copy(self) -> FgdCpuLearned:
        copied = copy.copy(self)
        copied.online = None if self.online is None else self.online.copy()
        copied.share_levels = self.share_levels.copy()
        return copied


class FgdCpu(Reading, Learning, Preparing, ScoringNodes, ScoringWithoutGpu, Tiebreaking, Adjusting):
    name = "fgd-cpu"
    reads = frozenset({Reads.CPU, Reads.GAPS})
    # memos of pure results: F for the workload learned (and the device answers every estimate
    # shares), and C before and after of the placements scored lately (see _costs)
    memos = frozenset({"_fragmentation", "_hosted", "_costs_of", "_costs_version"})

    def __init__(self, options: FgdCpuOptions, learned: FgdCpuLearned | None = None) -> None:
        self.options = options
        self.learned = self.learner(options) if learned is None else learned
        self._hosted: dict[tuple[Any, ...], bool] = {}  # shared by every estimate's Fragmentation
        self._fragmentation = Fragmentation(self.learned.workload, self._hosted)
        # C_before and C_after of the placements scored lately, by the allocation's id (with the
        # state and allocation themselves, so an id cannot be another's), for the learned
        # object's version: the score and the tiebreak of one placement ask one after the
        # other, and a node's tied candidates again
        self._costs_of: dict[int, tuple[NodeState, Allocation, tuple[float, float]]] = {}
        self._costs_version = self.learned.version

    @staticmethod
    def learner(options: FgdCpuOptions) -> FgdCpuLearned:
        """A learned object that knows nothing yet (the prior of ``options``)."""
        prior = workload_of(options.workload) if options.workload else DEFAULT_WORKLOAD
        return FgdCpuLearned(prior, OnlineWorkload(prior) if options.learn else None)

    def over(self, learned: Learned) -> FgdCpu:
        assert isinstance(learned, FgdCpuLearned)
        return FgdCpu(self.options, learned)

    @property
    def stranding_weight(self) -> float:
        """lambda: milli-GPU of cost per milli-GPU stranded."""
        return self.options.stranding_weight

    @property
    def balance_weight(self) -> float:
        """Score points per unit of balance rise per GPU."""
        return self.options.balance_weight

    @property
    def fragmentation(self) -> Fragmentation:
        """F against the workload learned (a memo: made again when a new estimate is adopted)."""
        found = self._fragmentation
        if found.workload is not self.learned.workload:
            found = self._fragmentation = Fragmentation(self.learned.workload, self._hosted)
        return found

    def _costs(self, state: NodeState, allocation: Allocation) -> tuple[float, float]:
        """C_before and C_after of placing ``allocation`` (kept a while: see ``_costs_of``)."""
        if self._costs_version != self.learned.version:  # costs of an older estimate or weight
            self._costs_of.clear()
            self._costs_version = self.learned.version
        kept = self._costs_of.get(id(allocation))
        if kept is not None and kept[0] is state and kept[1] is allocation:
            return kept[2]
        frag = self.fragmentation
        gpu_free = frag.free_share(state)
        frag_before = frag.node_frag(state)  # kept with the state: every candidate and shape asks it
        cpu_after = state.cpu_free - allocation.cpu_milli
        left = gpu_free - allocated_milli(allocation)
        if not allocation.shares and frag.cpu_level(cpu_after) == frag.cpu_level(state.cpu_free):
            frag_after = frag_before  # F reads the CPU by its level only: a pod without GPUs moves F no other way
        else:
            frag_after = frag.frag_after(state, allocation)
        # C before and after: :meth:`_cost`'s arithmetic on the two
        costs = self._cost(
            np.array([frag_before, frag_after]), np.array([gpu_free, left]), np.array([state.cpu_free, cpu_after])
        )
        before, after = float(costs[0]), float(costs[1])
        if len(self._costs_of) >= _COSTS_KEPT:
            self._costs_of.clear()
        self._costs_of[id(allocation)] = (state, allocation, (before, after))
        return before, after

    def prepare(self, demand: Demand, candidates: Sequence[tuple[NodeState, Allocation]]) -> None:
        self._costs_of.clear()  # a new call: its candidates are new allocations
        self.fragmentation.warm(candidates)

    def score(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        before, after = self._costs(state, allocation)
        return float(self._scores(np.array([before - after]))[0])

    def score_nodes(self, demand: Demand, batch: ShareCandidates) -> tuple[np.ndarray, np.ndarray]:
        """Per node of ``batch`` (candidates that each place one share on one GPU), the best
        score of its candidates and the gap move of the one chosen: what scoring them one by
        one gives (:meth:`score`, then the lowest :meth:`tiebreak` among the best, then the
        first), with F after every placement worked out at once
        (:meth:`~scheduler.core.fragmentation.Fragmentation.frags_after_shares`) and the costs
        over arrays in the same arithmetic."""
        frag = self.fragmentation
        states, node, gpu = batch.states, batch.node, batch.gpu
        found = frag.frags_after_shares(batch, demand.cpu_milli)
        frags, gpu_free, cpu_free = found.frags, found.node_free, batch.cpu_free_now()
        cost = self._cost(found.node_frag, gpu_free, cpu_free)
        left = gpu_free[node] - batch.milli_taken(batch.labels[node, gpu])
        after = self._cost(frags, left, cpu_free[node] - demand.cpu_milli)
        falls = cost[node] - after
        scores = self._scores(falls)
        # per node: the best score, the lowest cost among those, then the first
        order = np.lexsort((np.arange(len(node)), after, -scores, node))
        starts = np.flatnonzero(np.diff(node[order], prepend=-1))
        best = order[starts]
        assert len(best) == len(states), "every node has a candidate"
        moves = np.full((len(best), 2), -1, dtype=np.int64)
        if demand.gpu.kind is GpuKind.SHARE:  # the gap levels of the GPU placed on, before and after
            moves[:, 0] = found.gpu_free_before[best]
            moves[:, 1] = found.gpu_free_after[best]
            moves = gap_level(moves)
        return scores[best], moves

    def score_without_gpu(self, demand: Demand, states: Sequence[NodeState], labels: np.ndarray) -> list[float]:
        """Per node of ``states``, :meth:`score` of placing ``demand`` (a pod that asks no GPU:
        one placement per node, taking only CPU and memory) there, worked out at once: F
        moves only on the nodes where the pod's CPU lowers the CPU level (how many typical
        shapes' CPU still fits), and the stranded GPU by the CPU the pod takes. The same
        arithmetic as one by one, over arrays."""
        frag = self.fragmentation
        before, frag_before, gpu_free, cpu_free = self._costs_before(states, labels)
        cpu_after = cpu_free - demand.cpu_milli
        levels = np.array(frag.cpu_levels(), dtype=np.int64)
        moved = np.searchsorted(levels, cpu_after, side="right") != np.searchsorted(levels, cpu_free, side="right")
        after = frag_before.copy()
        for k in np.flatnonzero(moved).tolist():
            after[k] = frag.frag(frag.profiles(states[k]), int(cpu_after[k]))
        after = self._cost(after, gpu_free, cpu_after)  # the pod takes no GPU
        scores: list[float] = self._scores(before - after).tolist()
        return scores

    def _costs_before(
        self, states: Sequence[NodeState], labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per node of ``states`` (``labels`` as :class:`ShareCandidates` has them): C before
        (:meth:`_costs`' arithmetic over arrays), F, the free milli-GPU and the free milli-CPU."""
        frag_before, gpu_free = self.fragmentation.node_frags(states, labels)
        cpu_free = np.array([state.cpu_free for state in states], dtype=np.int64)
        return self._cost(frag_before, gpu_free, cpu_free), frag_before, gpu_free, cpu_free

    def _cost(self, frag: np.ndarray, gpu_free: np.ndarray, cpu_free: np.ndarray) -> np.ndarray:
        """C of nodes with F ``frag``, ``gpu_free`` milli-GPU and ``cpu_free`` milli-CPU free
        (:meth:`_costs`' arithmetic over arrays)."""
        ratio = self.learned.ratio
        if not ratio:
            return frag
        cost: np.ndarray = frag + self.stranding_weight * np.maximum(0.0, gpu_free - ratio * cpu_free)
        return cost

    def tiebreak(self, demand: Demand, state: NodeState, allocation: Allocation) -> float:
        """Inside the node the lowest cost wins, not just the best rounded score."""
        return self._costs(state, allocation)[1]

    @staticmethod
    def _scores(falls: np.ndarray) -> np.ndarray:
        """The score of each of ``falls``, integer points: 50 + 50 * tanh(fall / 2000), rounded
        half to even. A continuous score let tiny differences of F decide, which on the
        model-pinned openb traces (gpuspec10/20) left whole GPUs of some models idle (5.9%
        unallocated against FGD's 5.5%); rounded, near-equal holes tie and the balance picks."""
        scores: np.ndarray = np.rint(50.0 + 50.0 * np.tanh(falls / SCORE_SCALE_MILLI))
        return scores

    def gap_classes(self) -> np.ndarray:
        """Per gap level 0..GAP_LEVELS, then one entry for "no move": the class a GPU with that
        free share counts in (:func:`gap_classes_of` the share sizes learned)."""
        return self.learned.classes

    def balance_view(self, cluster: Cluster) -> tuple[np.ndarray, np.ndarray | None]:
        """The GPUs the balance counts, as a gap histogram, and per scored node whether its
        placement is left out of it (None: none is): here every GPU and every node. A placement
        left out rises as much as the counted placement that rises most (see :meth:`adjust`)."""
        return cluster.gaps, None

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        """Subtract the rise in the sum of squared class counts each placement causes.

        ``gaps`` (:meth:`balance_view`) counts the GPUs per gap level; ``cluster.moves`` holds
        each placement's (before, after) level of the GPU it shares, -1 for none. Moving one
        GPU from class a to class b changes sum(N[c]^2) by (2 N[b] + 1) - (2 N[a] - 1), 0 when
        a = b, counting only GPUs with a class (see :meth:`gap_classes`); the rise is read per
        GPU of the cluster so the weight does not depend on its size. A placement that
        :meth:`balance_view` leaves out is given the largest rise of the counted placements
        that move a class (0 when none does): the balance has no view of it, so it must not
        prefer it either (a rise of 0 would beat nearly every counted placement).
        """
        if not self.balance_weight or demand.gpu.kind is not GpuKind.SHARE:
            return scores
        gpus = int(cluster.gaps.sum())
        if not gpus:
            return scores
        gaps, skip = self.balance_view(cluster)
        moves = cluster.moves
        classes = self.gap_classes()
        of_level = classes[: GAP_LEVELS + 1]
        counted = of_level >= 0
        counts = np.bincount(of_level[counted], weights=gaps[counted], minlength=GAP_LEVELS + 1)
        before, after = classes[moves[0]], classes[moves[1]]
        rise = np.where(after >= 0, 2 * counts[after] + 1, 0) - np.where(before >= 0, 2 * counts[before] - 1, 0)
        rise = np.where(before == after, 0, rise)
        if skip is not None:
            counted_moves = (scores > -np.inf) & ~skip & (before != after)
            rise = np.where(skip, rise[counted_moves].max() if counted_moves.any() else 0, rise)
        adjusted = np.clip(scores - self.balance_weight * rise / gpus, 0.0, 100.0)
        return np.where(scores > -np.inf, adjusted, -np.inf)


@register("fgd-cpu", FgdCpuOptions)
def make(options: FgdCpuOptions, context: Context) -> FgdCpu:
    return FgdCpu(options)
