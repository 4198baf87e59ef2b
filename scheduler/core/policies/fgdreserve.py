"""fgd-reserve: fgd-cpu's score plus five rules, each a small pure module, named in the
``rules`` option (all five by default; the others are left out to measure one, as
simulations/fgd-reserve/ablation.md does):

* ``reservation`` (:mod:`.reserve`): a price on the GPU groups that pinned pods will need;
* ``cpu-bound`` (:mod:`.rules.cpubound`): the stranding term stands down when CPU, not GPU,
  will run out;
* ``departures`` (:mod:`.rules.departures`): the balance stands down as pods leave;
* ``mig-balance`` (:mod:`.rules.migbalance`): the balance leaves MIG GPUs out;
* ``gpu-cpu`` (:mod:`.rules.gpucpu`): GPU nodes' CPU is kept for GPU pods while nodes without
  GPUs can take a pod that asks none.

Why each stays (simulations/fgd-reserve/ablation.md: each rule removed with the others kept, on
held-out seeds, against the seeds' spread, the sd of the per-seed differences): without the
reservation the MPS/time-slicing replay turns away 7.8 more pods a run (sd 4.4), and the openb
variant with a third of the GPU pods pinned (gen-gpuspec33-s2, seed 42) leaves 12.68% of its GPU
unallocated instead of 4.62%; without
``departures`` that replay turns away 13.0 more (sd 5.6); without ``cpu-bound`` the MIG arrivals
replay turns away 10.7 more (sd 7.7), without ``mig-balance`` 14.2 more (sd 8.2). ``gpu-cpu``
acts only where some node has no GPU, which no recorded replay has and a live cluster has
(simulations/README.md, "GPU nodes' CPU").
A sixth rule, a price on MIG nodes' CPU for pods without GPUs once MIG profiles were seen,
moved both held-out MIG replays by less than their seeds' spread, and was removed.

The node's own score is fgd-cpu's (:mod:`.fgdcpu`): the fall of C_n = F_n(M) + lambda * S_n,
FGD's fragmentation against the typical workload M learned online plus the GPU the node
strands for lack of CPU, and for a pod that shares one GPU the Sum-of-Squares balance of
the cluster's holes. The rules read the cluster in ``adjust``.

**Reservation.** A group is the GPUs of one model and sharing mode
(:mod:`scheduler.core.groups`). A pod may use only the groups where it would fit an empty
node (its model list, its sharing mode, its GPU count and CPU); pods with the same allowed
groups form a class, and the policy keeps each class's GPU request so far, vol(A). A pod of
class A is priced for the classes *strictly inside* its own (B a proper subset of A: every
group B may use, A may use too); every other pod counts as flexible. With R_g the free GPU
of group g and R the cluster's, the *pinned load* of g splits each such class over its
groups by free GPU, L_g = sum over B of vol(B) R_g / R_B, and g's *pressure* is
rho_g = (L_g / V) / (R_g / R), V the whole request so far: the share of arriving GPU that
only a few groups, g among them, can take, per share of the free GPU that g holds
(:mod:`.reserve`). If the mix holds, those pods alone fill g before the cluster fills when
rho_g >= 1. A GPU taken on g then costs ramp(rho_g) = clip((rho_g - 0.5) / 0.5, 0, 1)
GPUs, times the share the pod takes there, and the score loses ``reserve_weight`` times
that cost on fgd-cpu's scale (50 points per 2,000 milli-GPU).

Why it wastes less: FGD and fgd-cpu judge a node by the pods of the typical mix, all of
which they take to be able to go anywhere. With a third of the GPU pods pinned to a model
(T4, say), a flexible pod that lands on the last free T4s scores as well as one that lands
on an idle G2, but the first leaves a pinned T4 pod with nowhere to go and the G2 idle:
that GPU is lost twice. The price moves flexible pods off the groups pinned demand will
fill, and costs nothing while pinned demand leaves room (rho below 0.5), nor to a pod
pinned to one group (nothing is inside its class). On the openb traces with 30-40% of the
GPU pods pinned, unallocated GPU falls from 9-16% (FGD) to 4-8%.

Why only the classes inside: a class that may use a group A may not has somewhere else to
go, and yielding to it can only push A's pods onto the groups that classes inside A need.
Where every class is pinned (MIG profiles to MIG GPUs, fractions to MIG or MPS GPUs, whole
GPUs to MPS or exclusive ones), pricing every pinned class charged fractions for the whole
GPUs' need of MPS GPUs and sent them onto MIG GPUs, each into a slot a profile needed: the
MIG scenario with departures turned away 257 pods a run against FGD's 200 (seeds 1-10),
most of them profiles; priced for the profiles alone, fractions stay on MPS GPUs while
there is room.

**The balance and MIG.** fgd-cpu's Sum-of-Squares balance counts partly used GPUs by the
share sizes their holes admit. A MIG GPU's hole admits what its free slots allow, not what
its size would suggest (three free slices of an H100 take a 3g.40gb only as slices 4-6),
so fgd-reserve leaves MIG GPUs out of the counts and placements on MIG nodes out of the
balance (:meth:`FgdReserve.balance_view`): fractions were otherwise drawn onto MIG GPUs to
fill holes that only profiles could use. A placement left out is not preferred either: it
rises as much as the counted placement that rises most (:meth:`.FgdCpu.adjust`). At a rise
of 0 it beat nearly every counted placement (a share placed on a shared GPU almost always
adds to some class), and the balance, blind to MIG GPUs, drew shares onto them.

**GPU nodes' CPU.** The same holds for every GPU node: a core a pod without GPUs takes there
is a core the GPU pods of that node cannot have, and a node without GPUs loses nothing by it.
So, while some node without GPUs can take it, a pod that asks no GPU loses ``gpu_cpu_price``
points (30) on every GPU node: it runs on a GPU node only when the nodes without GPUs are
full, or score far better. (simulations/README.md, "GPU nodes' CPU", measures it on the openb
traces with their CPU-only nodes.)

**CPU-bound stranding.** S_n counts GPU that the GPU pods of the mix could not use because
the node's CPU runs out first; it pays to keep CPU beside free GPU only if the CPU is not
all going to be taken anyway. kappa = (CPU per GPU requested by every pod seen so far, the
CPU-only ones included) x (the cluster's GPUs) / (the cluster's CPU) is the share of the
cluster's CPU the workload asks for by the time its GPU request reaches the cluster's
capacity. Below ``cpu_bound_low`` the stranding weight is lambda; above ``cpu_bound_high``,
0 (CPU runs out everywhere, so keeping it beside a GPU only spreads CPU-only pods onto the
wrong nodes); linear between, in eighths. kappa is worked out again, with the cluster the
next call sees, at each re-estimate of M; a change of the weight raises the learned object's
``version``, and the new weight counts from the next call's node scores on.

**Departures.** The Sum-of-Squares balance is a rule for bins that only fill: a hole made
now waits for a pod that fits it. When pods leave, holes open and close by themselves and the
balance only spreads shares. The policy watches the cluster's free GPU from call to call:
what it lost (placements) and what it gained (departures, or nodes joining). The balance
weight is multiplied by 1 - freed / held, held = lost - freed being the GPU the pods placed
since still hold: 1 while nothing leaves (the FGD protocol), 0 once as much has been freed as
is held (after about one pod lifetime, holes are made by departures more than they wait).

Everything is learned from the pods seen so far and the cluster as it stands: nothing from
the future, nothing per trace. What is learned is one object (:class:`FgdReserveLearned`): told
of the pods (``observe``) and of the cluster as each call sees it, before ``adjust``
(``follow``: the departures, kappa, the classes); ``adjust`` only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..capacity import GAP_LEVELS
from ..fragmentation import DEFAULT_WORKLOAD, OnlineWorkload, TypicalWorkload, workload_of
from ..groups import Groups
from ..inventory import SharingMode
from ..request import Demand, GpuKind, GpuRequest
from .base import Cluster, Context, Learned, Reads, register
from .fgdcpu import SCORE_SCALE_MILLI, FgdCpu, FgdCpuLearned, FgdCpuOptions, nominal_milli
from .reserve import free_by_group, inside, milli_on, pressure, price, squash
from .rules import cpubound, departures, gpucpu, migbalance

POINTS_PER_MILLI = 50.0 / SCORE_SCALE_MILLI  # fgd-cpu's scale near the middle
LEVELS = np.arange(GAP_LEVELS + 1)  # a gap level's free share, in hundredths of a GPU
RULES = ("reservation", "cpu-bound", "departures", "mig-balance", "gpu-cpu")  # see the module


@dataclass(frozen=True, slots=True)
class FgdReserveOptions(FgdCpuOptions):
    reserve_weight: float = 4.0  # milli-GPU of cost per milli-GPU taken on a group at full price
    reserve_start: float = 0.5  # pressure at which a group's price starts to rise (reaches 1 at 1)
    cpu_bound_low: float = 0.9  # kappa up to which stranding counts in full
    cpu_bound_high: float = 1.1  # kappa from which it does not count
    gpu_cpu_price: float = 30.0  # points a pod without GPUs loses on a GPU node while a node without GPUs takes it
    learn_settle: int = 256  # re-estimates of the workload: by 1.5x steps until this many pods,
    learn_late_growth: float = 4.0  # then by this factor
    rules: tuple[str, ...] = RULES  # the rules added to fgd-cpu's score (all by default)

    def __post_init__(self) -> None:
        FgdCpuOptions.__post_init__(self)
        if isinstance(self.rules, str) or not all(isinstance(rule, str) for rule in self.rules):
            raise ValueError(f"rules must be a list of rule names, got {self.rules!r}; accepted: {', '.join(RULES)}")
        unknown = [rule for rule in self.rules if rule not in RULES]
        if unknown:
            raise ValueError(f"unknown rule {unknown[0]!r}; accepted: {', '.join(RULES)}")
        object.__setattr__(self, "rules", tuple(self.rules))
        if not 0 <= self.reserve_weight < float("inf"):
            raise ValueError(f"reserve_weight must be a finite number >= 0, got {self.reserve_weight!r}")
        if not 0 <= self.reserve_start < 1:
            raise ValueError(f"reserve_start must be in 0 <= x < 1, got {self.reserve_start!r}")
        if not 0 < self.cpu_bound_low < self.cpu_bound_high:
            raise ValueError(
                f"cpu_bound_low and cpu_bound_high must be 0 < low < high, got {self.cpu_bound_low}, "
                f"{self.cpu_bound_high}"
            )
        if not 0 <= self.gpu_cpu_price <= 100:
            raise ValueError(f"gpu_cpu_price must be in 0 <= x <= 100, got {self.gpu_cpu_price!r}")
        if self.learn_settle < 0 or not self.learn_late_growth > 1:
            raise ValueError("learn_settle must be >= 0 and learn_late_growth > 1")


class FgdReserveLearned(FgdCpuLearned):
    """What fgd-reserve learns: fgd-cpu's (:class:`~.fgdcpu.FgdCpuLearned`), and from the pods
    seen the CPU and GPU they asked (kappa's inputs) and their classes by allowed groups with
    each class's GPU request; from the cluster as each call sees it (``follow``): its free GPU
    from call to call (departures), kappa with its GPUs and CPU once the workload was estimated
    again (the stranding weight's share ``cpu_factor``), and its groups, to sort the pods seen
    into classes. Each change of ``cpu_factor`` raises ``version``."""

    def __init__(self, options: FgdReserveOptions, prior: TypicalWorkload, online: OnlineWorkload | None) -> None:
        super().__init__(prior, online)
        self.options = options
        self.cpu_factor = 1.0  # the share of lambda in use (see the module: CPU-bound stranding)
        self.cpu_seen = 0  # milli-CPU requested by the pods seen
        self.gpu_seen = 0  # milli-GPU requested by the pods seen
        self.kappa_due = True
        self.pending: list[Demand] = []  # GPU pods seen, not yet sorted into classes
        self.class_rows: dict[bytes, int] = {}  # allowed-groups mask -> class row
        self.class_demands: list[Demand] = []  # one pod of each class (to widen its mask)
        self.masks = np.zeros((0, 0), dtype=bool)  # [class, group]: may the class use the group
        self.volumes = np.zeros(0)  # [class]: milli-GPU requested
        self.flow = departures.Flow()  # the cluster's free GPU from call to call (departures rule)
        # per demand: its class row and milli-GPU per group; per GPU request: milli-GPU per group
        # (both for the groups as they are: forgotten when a group appears)
        self.seen_demands: dict[Demand, tuple[int, float]] = {}
        self.milli: dict[GpuRequest, np.ndarray] = {}

    def observe(self, demand: Demand) -> None:
        version = self.version
        super().observe(demand)
        self.kappa_due = self.kappa_due or self.version != version
        self.cpu_seen += demand.cpu_milli
        gpu = demand.gpu
        if gpu.kind is not GpuKind.NONE:
            self.gpu_seen += nominal_milli(gpu) * max(1, gpu.count)
            self.pending.append(demand)

    def follow(self, demand: Demand, cluster: Cluster) -> None:
        """The cluster as a call for ``demand`` sees it, before the policy adjusts its scores:
        its free GPU (departures), kappa once the workload was estimated again (its new weight
        counts from the next call's scores), and the pods seen sorted into classes by its
        groups, for a GPU pod that the reservation prices."""
        rules = self.options.rules
        if "departures" in rules:
            self.flow = departures.follow(self.flow, int(cluster.gaps @ LEVELS))
        if self.kappa_due and "cpu-bound" in rules:
            self._follow_cpu(cluster)
        if demand.gpu.kind is GpuKind.NONE or not self.options.reserve_weight or "reservation" not in rules:
            return
        groups = cluster.groups
        if len(groups.keys):  # no GPU node yet: the pods seen wait to be sorted into classes
            self._learn_classes(groups)

    def copy(self) -> FgdReserveLearned:
        copied = super().copy()
        assert isinstance(copied, FgdReserveLearned)
        copied.pending = list(self.pending)
        copied.class_rows = dict(self.class_rows)
        copied.class_demands = list(self.class_demands)
        copied.volumes = self.volumes.copy()  # the others are replaced, never changed in place
        copied.seen_demands = dict(self.seen_demands)
        copied.milli = dict(self.milli)
        return copied

    # ------------------------------------------------------------ CPU-bound stranding

    def kappa(self, cluster: Cluster) -> float:
        """The share of the cluster's CPU the mix seen so far asks for once its GPU request
        reaches the cluster's GPUs (0 while nothing is known)."""
        return cpubound.kappa(self.cpu_seen, self.gpu_seen, int(cluster.gaps.sum()), cluster.cpu_milli)

    def _follow_cpu(self, cluster: Cluster) -> None:
        self.kappa_due = False
        factor = cpubound.factor(self.kappa(cluster), self.options.cpu_bound_low, self.options.cpu_bound_high)
        if factor != self.cpu_factor:
            self.cpu_factor = factor
            self.version += 1

    # ------------------------------------------------------------ reservation classes

    def milli_per_group(self, gpu: GpuRequest, groups: Groups) -> np.ndarray:
        """The milli-GPU ``gpu`` takes on each group (kept while the groups are as they are)."""
        found = self.milli.get(gpu)
        return np.array([milli_on(gpu, device) for device in groups.devices]) if found is None else found

    def _learn_classes(self, groups: Groups) -> None:
        width = len(groups.keys)
        if self.masks.shape[1] != width:  # a group appeared: every class's mask again
            self.masks = np.array([groups.allowed(d) for d in self.class_demands], dtype=bool).reshape(-1, width)
            self.seen_demands.clear()
            self.milli.clear()
        for d in self.pending:
            known = self.seen_demands.get(d)
            if known is None:
                allowed = groups.allowed(d)
                row = self.class_rows.setdefault(allowed.tobytes(), len(self.class_rows))
                if row == len(self.volumes):
                    self.masks = np.vstack([self.masks, allowed[None, :]])
                    self.volumes = np.append(self.volumes, 0.0)
                    self.class_demands.append(d)
                milli = self.milli.get(d.gpu)
                if milli is None:
                    milli = self.milli[d.gpu] = self.milli_per_group(d.gpu, groups)
                known = (row, float(milli[allowed].mean() if allowed.any() else milli.mean()))
                if len(self.seen_demands) < 100_000:
                    self.seen_demands[d] = known
            self.volumes[known[0]] += known[1]
        self.pending.clear()


class FgdReserve(FgdCpu):
    name = "fgd-reserve"
    reads = frozenset({Reads.CPU, Reads.GAPS, Reads.GROUPS})
    # memos of pure results besides fgd-cpu's: which groups are MIG, and per allowed-groups
    # mask the classes strictly inside it (for the masks of _inside_shape)
    memos = FgdCpu.memos | {"_inside", "_inside_shape", "_stacked", "_mig_groups"}
    learned: FgdReserveLearned
    options: FgdReserveOptions

    def __init__(self, options: FgdReserveOptions, learned: FgdReserveLearned | None = None) -> None:
        super().__init__(options, learned)
        self._inside: dict[bytes, np.ndarray] = {}
        self._inside_shape: tuple[int, ...] = (0, 0)
        self._stacked = np.ones((1, 0), dtype=bool)  # the class masks and a flexible row
        self._mig_groups = np.zeros(0, dtype=bool)  # per group: is it MIG

    @staticmethod
    def learner(options: FgdCpuOptions) -> FgdReserveLearned:
        assert isinstance(options, FgdReserveOptions)
        prior = workload_of(options.workload) if options.workload else DEFAULT_WORKLOAD
        online = OnlineWorkload(prior, settle=options.learn_settle, late_growth=options.learn_late_growth)
        return FgdReserveLearned(options, prior, online if options.learn else None)

    def over(self, learned: Learned) -> FgdReserve:
        assert isinstance(learned, FgdReserveLearned)
        return FgdReserve(self.options, learned)

    @property
    def stranding_weight(self) -> float:
        """lambda times the share kappa leaves it (see the module: CPU-bound stranding)."""
        return self.options.stranding_weight * self.learned.cpu_factor

    @property
    def balance_weight(self) -> float:
        """The balance weight times 1 - freed / held (see the module: departures)."""
        if "departures" not in self.options.rules:
            return self.options.balance_weight
        return self.options.balance_weight * departures.factor(self.learned.flow)

    # ------------------------------------------------------------ reservation

    def _mig(self, groups: Groups) -> np.ndarray:
        """Per group: is it MIG (groups only ever join)."""
        if len(self._mig_groups) != len(groups.keys):
            self._mig_groups = np.array([mode is SharingMode.MIG for _, mode in groups.keys], dtype=bool)
        return self._mig_groups

    def balance_view(self, cluster: Cluster) -> tuple[np.ndarray, np.ndarray | None]:
        """The balance counts only GPUs whose holes take shares by size: not MIG GPUs, where
        what a hole admits depends on its slots (see the module: the balance and MIG)."""
        if "mig-balance" not in self.options.rules:
            return cluster.gaps, None
        groups = cluster.groups
        found = migbalance.view(groups.gaps, self._mig(groups), groups.node_group)
        return (cluster.gaps, None) if found is None else found

    def _gpu_cpu(self, scores: np.ndarray, groups: Groups) -> np.ndarray:
        """A pod without GPUs loses ``gpu_cpu_price`` points on GPU nodes while a node without
        GPUs can take it (see the module: GPU nodes' CPU)."""
        if "gpu-cpu" not in self.options.rules:
            return scores
        return gpucpu.apply(scores, groups.node_group >= 0, self.options.gpu_cpu_price)

    def _pressure(self, allowed: np.ndarray, free: np.ndarray) -> np.ndarray | None:
        """rho_g as the pod of allowed groups ``allowed`` sees it: the pinned load of the classes
        strictly inside its own, the rest of the volume counted as flexible (None when no class
        is). Which classes are inside is kept per mask until a class or a group appears."""
        masks, volumes = self.learned.masks, self.learned.volumes
        if self._inside_shape != masks.shape:
            self._inside.clear()
            self._inside_shape = masks.shape
            self._stacked = np.vstack([masks, np.ones((1, masks.shape[1]), dtype=bool)])
        key = allowed.tobytes()
        within = self._inside.get(key)
        if within is None:
            within = self._inside[key] = inside(masks, allowed)
        if not within.any():
            return None
        flexible = np.append(np.where(within, volumes, 0.0), volumes[~within].sum())
        return pressure(self._stacked, flexible, free)

    def adjust(self, demand: Demand, scores: np.ndarray, cluster: Cluster) -> np.ndarray:
        """fgd-cpu's balance, then each node's group price (see the module), from what was
        learned and the cluster as they stand: nothing of either changes here."""
        out = super().adjust(demand, scores, cluster)
        groups = cluster.groups
        if not len(groups.keys):
            return out
        if demand.gpu.kind is GpuKind.NONE:
            return self._gpu_cpu(out, groups)
        learned = self.learned
        if not self.options.reserve_weight or "reservation" not in self.options.rules or not learned.volumes.size:
            return out
        known = learned.seen_demands.get(demand)
        allowed = learned.masks[known[0]] if known is not None else groups.allowed(demand)
        rho = self._pressure(allowed, free_by_group(groups.gaps))
        if rho is None:
            return out
        cost = price(rho, self.options.reserve_start) * learned.milli_per_group(demand.gpu, groups)
        if not cost.any():
            return out
        mine = groups.node_group
        per_node = np.where(mine >= 0, cost[np.maximum(mine, 0)], 0.0)
        points = self.options.reserve_weight * per_node * POINTS_PER_MILLI
        return np.where(scores > -np.inf, squash(out - points), -np.inf)


@register("fgd-reserve", FgdReserveOptions)
def make(options: FgdReserveOptions, context: Context) -> FgdReserve:
    return FgdReserve(options)
