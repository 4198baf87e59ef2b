"""Fragmentation of a node against a typical workload (FGD, Weng et al., ATC 2023), generalised.

For a typical pod shape m (popularity p_m) and a node n with free share ``free[g]`` on
each GPU (see :mod:`capacity`):

* if m needs no GPU, or n lacks the CPU for m, or fewer than m.count GPUs can host
  one share of m:  F_n(m) = sum_g free[g]   (every idle bit of GPU is a fragment for m)
* otherwise:       F_n(m) = sum of free[g] over the GPUs that cannot host a share of m

F_n(M) = sum_m p_m F_n(m). "Can host" is the core's own fit test on one device, so the
same measure covers MPS and time-slicing (memory + compute), MIG (slots) and
exclusive GPUs; on the paper's fractional GPUs it is exactly ``free[g] >= d_m``.

Implementation: each device state gets a bit mask of the shapes it can host (memoised
by device kind and usage), so a node's F is one pass over its GPUs:
F = sum_g free[g] * (1 - P(bits[g] & feasible)), with P(mask) the popularity of a mask.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np

from . import modes
from .allocation import Allocation, DeviceShare
from .arrays import distinct, unique_inverse
from .capacity import (
    DeviceUsage,
    add_share,
    device_key,
    free_milli,
    share_milli,
    shares_fit,
    usage_row,
)
from .errors import RequestError
from .fit import hosts, mig_question
from .ids import Ids
from .inventory import Device, Node, SharingMode
from .modes.shared import rows_fit, rows_free_milli
from .quantity import cpu_milli
from .request import DEFAULT_PREFIX, Demand, GpuKind, GpuRequest, parse_gpu_request
from .state import NodeState

MAX_SHAPES = 256  # the most shapes a typical workload learned from pods keeps (see from_demands)
_STATES_KEPT = 8192  # node states whose profiles are kept (see Fragmentation.profiles)
_MEMO_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class TypicalWorkload:
    """Typical pod shapes and their popularity (summing to 1)."""

    shapes: tuple[tuple[Demand, float], ...]

    @staticmethod
    def from_demands(demands: Iterable[Demand], coverage: float = 0.95, limit: int = MAX_SHAPES) -> TypicalWorkload:
        """The most popular shapes covering ``coverage`` of the pods, at most ``limit`` of them,
        renormalised.

        Shapes are keyed by CPU and GPU request (memory is not part of the key); equal
        counts are ordered by the larger key, as the FGD authors' code does. The limit bounds
        what every new GPU state costs (one capacity question per shape): where every pod asks
        a GPU memory of its own, thousands of shapes would cover 95% of the pods, each seen a
        few times. The workloads of the openb family choose far fewer (31-101 on the shared
        traces, under 200 with nine in ten pods pinned to GPU models).
        """
        if limit < 1:
            raise ValueError(f"a typical workload needs a limit of at least one shape, got {limit}")
        counts: Counter[tuple[int, GpuRequest]] = Counter((d.cpu_milli, d.gpu) for d in demands)
        total = sum(counts.values())
        if total == 0:
            raise ValueError("a typical workload needs at least one pod")

        def order(item: tuple[tuple[int, GpuRequest], int]) -> tuple[int, tuple[Any, ...]]:
            (cpu, gpu), n = item
            return n, (cpu, gpu.share_milli, gpu.count, gpu.models)

        chosen: list[tuple[tuple[int, GpuRequest], int]] = []
        covered = 0
        for item in sorted(counts.items(), key=order, reverse=True):
            chosen.append(item)
            covered += item[1]
            if covered >= coverage * total or len(chosen) == limit:
                break
        return TypicalWorkload(tuple((Demand(cpu, 0, gpu), n / covered) for (cpu, gpu), n in chosen))


@dataclass(frozen=True, slots=True)
class Shape:
    """One typical pod as an operator writes it: the GPU request in annotation form (the keys
    of ``gpuslice.io/...`` without the prefix), its CPU, and its weight in the mix."""

    weight: float
    cpu: str | int = 0
    gpu_fraction: str | None = None
    gpu_memory: str | None = None
    gpu_compute: str | None = None
    gpu_count: str | None = None
    mig_profile: str | None = None
    sharing: str | None = None
    gpu_model: str | None = None

    def __post_init__(self) -> None:
        if not self.weight > 0 or self.weight == float("inf"):
            raise ValueError(f"weight must be a positive number, got {self.weight!r}")
        try:
            if cpu_milli(self.cpu) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"cpu must be a CPU quantity such as 4 or 500m, got {self.cpu!r}") from None
        self.gpu_request()

    def gpu_request(self) -> GpuRequest:
        annotations = {
            DEFAULT_PREFIX + key.replace("_", "-"): str(value)
            for key in ("gpu_fraction", "gpu_memory", "gpu_compute", "gpu_count", "mig_profile", "sharing", "gpu_model")
            if (value := getattr(self, key)) is not None
        }
        try:
            return parse_gpu_request(annotations)
        except RequestError as exc:
            raise ValueError(str(exc).replace(DEFAULT_PREFIX, "")) from exc

    def demand(self) -> Demand:
        return Demand(cpu_milli(self.cpu), 0, self.gpu_request())


def workload_of(shapes: Iterable[Shape]) -> TypicalWorkload:
    """The typical workload of ``shapes``, their weights renormalised to sum to 1."""
    listed = list(shapes)
    total = sum(s.weight for s in listed)
    workload = TypicalWorkload(tuple((s.demand(), s.weight / total) for s in listed))
    if not any(d.gpu.kind is not GpuKind.NONE for d, _ in workload.shapes):
        raise ValueError("a workload needs at least one shape with a GPU request")
    return workload


class OnlineWorkload:
    """The typical workload learned from the pods seen so far (nothing known in advance).

    :meth:`observe` counts each arriving pod's shape. The estimate is recomputed when
    the count reaches ``first`` and then each time it has grown by ``growth`` (4, 6, 9,
    13, 19, 28, ...: often while little is known, rarely later), and adopted only if it
    moved (by more than ``tolerance`` in total variation from the one in use; by default,
    at all). A policy thus re-tunes while little is known and keeps its caches while the
    estimate stands still. Until the first estimate, ``initial`` stands in.
    (On the openb default trace the early estimates decide much: with fgd-cpu, a first
    estimate at 256 pods instead of 16 cost 0.3 point of unallocated GPU, growth 1.5
    instead of doubling gained 0.06, and a tolerance of 0.05 cost 0.15.) From ``settle``
    pods on, the count must grow by ``late_growth`` instead: the estimate has settled, and
    each new one throws away every cached score.
    """

    def __init__(
        self,
        initial: TypicalWorkload,
        coverage: float = 0.95,
        tolerance: float = 0.0,
        first: int = 4,
        growth: float = 1.5,
        settle: int = 0,
        late_growth: float | None = None,
    ) -> None:
        if first < 1 or growth <= 1.0 or (late_growth is not None and late_growth <= 1.0):
            raise ValueError(
                f"OnlineWorkload needs first >= 1 and growth > 1 (late growth too), "
                f"got {first}, {growth}, {late_growth}"
            )
        self.workload = initial
        self.coverage = coverage
        self.tolerance = tolerance
        self.growth = growth
        self.settle = settle  # from this many pods on, the estimate is made by late_growth steps
        self.late_growth = late_growth or growth
        self.seen: Counter[Demand] = Counter()
        self._count = 0
        self._next = first
        self._learned = False

    def copy(self) -> OnlineWorkload:
        """A copy that counts on apart (the estimates are never changed, only replaced)."""
        copied = copy.copy(self)
        copied.seen = Counter(self.seen)
        return copied

    def observe(self, demand: Demand) -> bool:
        """Count one pod; True when a new estimate was adopted."""
        self.seen[Demand(demand.cpu_milli, 0, demand.gpu)] += 1
        self._count += 1
        if self._count < self._next:
            return False
        growth = self.late_growth if self._count >= self.settle else self.growth
        self._next = max(self._next + 1, int(self._next * growth))
        estimate = TypicalWorkload.from_demands(self.seen.elements(), self.coverage)
        if self._learned and total_variation(estimate, self.workload) <= self.tolerance:
            return False
        self.workload, self._learned = estimate, True
        return True


def total_variation(a: TypicalWorkload, b: TypicalWorkload) -> float:
    """Half the L1 distance between two workloads' popularity over the union of their shapes."""
    pa: dict[Demand, float] = dict(a.shapes)
    pb: dict[Demand, float] = dict(b.shapes)
    return 0.5 * sum(abs(pa.get(d, 0.0) - pb.get(d, 0.0)) for d in pa.keys() | pb.keys())


def _whole(n: int) -> GpuRequest:
    return GpuRequest(GpuKind.WHOLE, n)


def _share(milli: int) -> GpuRequest:
    return GpuRequest(GpuKind.SHARE, 1, fraction_milli=milli)


# What the extender assumes until configured otherwise: mostly fractional inference and
# notebook pods, some whole GPUs, a few multi-GPU training pods.
DEFAULT_WORKLOAD = TypicalWorkload(
    (
        (Demand(0, 0, _share(250)), 0.20),
        (Demand(0, 0, _share(500)), 0.25),
        (Demand(0, 0, _whole(1)), 0.35),
        (Demand(0, 0, _whole(2)), 0.10),
        (Demand(0, 0, _whole(4)), 0.05),
        (Demand(0, 0, _whole(8)), 0.05),
    )
)


@dataclass(frozen=True, slots=True)
class ShareCandidates:
    """Placements of one share of one GPU each, over many nodes, as arrays: per node its state
    and a label per GPU (equal labels: GPUs in equal device states, by
    :func:`~.capacity.device_key`), per candidate its node and GPU (each node's candidates
    together, in GPU order), and per label of a candidate's GPU the share placed on it: as a
    :class:`DeviceShare` in ``shares``, or as rows in ``after``."""

    states: Sequence[NodeState]
    labels: np.ndarray  # [node, GPU], as wide as the node with the most GPUs
    node: np.ndarray  # per candidate, the index of its node in states
    gpu: np.ndarray  # per candidate, the GPU it places the share on
    shares: Mapping[int, DeviceShare]  # the labels after does not give
    # Optionally, for labels of healthy MPS and time-slicing GPUs (sorted): the device kind and
    # :func:`~.capacity.usage_row` of their GPU once the share is placed, and the milli-GPU the
    # share takes (:func:`~.capacity.share_milli`). Their after-states are profiled from these
    # rows at once, without building each state or share.
    after: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    cpu_free: np.ndarray | None = None  # optionally, per node its free milli-CPU (else read from states)

    def cpu_free_now(self) -> np.ndarray:
        """Per node, its free milli-CPU."""
        if self.cpu_free is not None:
            return self.cpu_free
        return np.array([state.cpu_free for state in self.states], dtype=np.int64)

    def milli_taken(self, labels: np.ndarray) -> np.ndarray:
        """Per label in ``labels`` (labels of candidates' GPUs), the milli-GPU its share takes."""
        out = np.zeros(len(labels), dtype=np.int64)
        rest = np.ones(len(labels), dtype=bool)
        if self.after is not None and len(self.after[0]):
            ids, _, milli = self.after
            at = np.minimum(np.searchsorted(ids, labels), len(ids) - 1)
            given = ids[at] == labels
            out[given] = milli[at[given]]
            rest = ~given
        if rest.any():
            took = {label: share_milli(share) for label, share in self.shares.items()}
            out[rest] = [took[label] for label in labels[rest].tolist()]
        return out


class SharesAfter(NamedTuple):
    """What :meth:`Fragmentation.frags_after_shares` works out: per candidate F after it and
    its GPU's free milli-GPU before and after it; per node F and its free milli-GPU now."""

    frags: np.ndarray
    gpu_free_before: np.ndarray
    gpu_free_after: np.ndarray
    node_frag: np.ndarray
    node_free: np.ndarray


class Fragmentation:
    """The fragmentation measure for one typical workload (memoised; not thread-safe by design:
    each worker owns its own, and the memo only ever caches pure results)."""

    def __init__(self, workload: TypicalWorkload, hosted: dict[tuple[Any, ...], bool] | None = None) -> None:
        """``hosted``: a memo of "can this device state take one share of this request", which
        the successive workloads of one learner may share (it depends on neither)."""
        self.workload = workload
        self._hosted = {} if hosted is None else hosted
        shapes = workload.shapes
        self._gpu_shapes = [(1 << i, d.gpu) for i, (d, _) in enumerate(shapes) if d.gpu.kind is not GpuKind.NONE]
        self._multi = [(1 << i, d.gpu.count) for i, (d, _) in enumerate(shapes) if d.gpu.count > 1]
        # the multi-GPU shapes as one mask per GPU count (see _too_few)
        self._multi_by_count: dict[int, int] = {}
        for bit, count in self._multi:
            self._multi_by_count[count] = self._multi_by_count.get(count, 0) | bit
        self._multi_mask = sum(bit for bit, _ in self._multi)  # every multi-GPU shape
        by_cpu = sorted((d.cpu_milli, 1 << i) for i, (d, _) in enumerate(shapes))
        self._cpu_levels = [c for c, _ in by_cpu]
        self._cpu_masks: list[int] = []
        mask = 0
        for _, bit in by_cpu:
            mask |= bit
            self._cpu_masks.append(mask)
        self._weights = [p for _, p in shapes]
        self._devices: dict[tuple[Any, ...], tuple[int, int]] = {}
        # Per device kind: each GPU shape's share of such a GPU as arrays, for shares_fit
        self._shares: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # Per MIG device kind: the shapes grouped by what they ask of such a GPU (_questions)
        self._mig_questions: dict[int, list[tuple[int, GpuRequest]]] = {}
        self._popularity: dict[int, float] = {}
        self._counts: dict[tuple[int, ...], list[int]] = {}  # see _counts_of
        # _too_few_beside's answers, by (id of the counts, the GPU's shapes before, after), with
        # the counts themselves (so that the id cannot be another list's)
        self._beside: dict[tuple[int, int, int], tuple[list[int], int]] = {}
        # The profiles of the node states asked about lately, with their F and free share once
        # asked: a node's candidates ask one after another, and every new request shape asks
        # every node again. Kept by the state's id with the state itself (so the id cannot be
        # another's while it is kept).
        self._by_state: dict[int, _Kept] = {}
        # Each distinct mask of shapes a GPU hosts, numbered (for frags_after_shares' arrays);
        # numbered afresh, with a new numbering, when too many
        self._bit_ids: dict[int, int] = {}
        # and each distinct mask of multi-GPU shapes that too few GPUs host, the same way
        self._few_ids = Ids()
        self._numbering = 0

    def device_profile(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int]:
        """(free milli-GPU, bit mask of the typical shapes one share of which fits)."""
        key = device_key(node, device, usage)
        hit = self._devices.get(key)
        if hit is not None:
            return hit
        bits = self._bits_at_once(node, device, usage)
        if bits is None:
            bits = 0
            hosted = self._hosted
            for bit, gpu in self._questions(device):
                can = hosted.get((key, gpu))
                if can is None:
                    if len(hosted) > _MEMO_LIMIT:
                        hosted.clear()
                    can = hosted[(key, gpu)] = hosts(gpu, node, device, usage)
                if can:
                    bits |= bit
        if len(self._devices) > _MEMO_LIMIT:
            self._devices.clear()
        result = (free_milli(node, device, usage), bits)
        self._devices[key] = result
        return result

    def _questions(self, device: Device) -> list[tuple[int, GpuRequest]]:
        """The typical GPU shapes to ask ``device`` about one by one (:func:`~.fit.hosts`), each
        with the mask of the shapes its answer stands for: on a MIG GPU the shapes that ask
        the same of it (:func:`~.fit.mig_question`: the same covering profiles) are asked once,
        and those it can never host not at all; elsewhere each shape for itself."""
        if device.mode is not SharingMode.MIG:
            return self._gpu_shapes
        found = self._mig_questions.get(device.kind)
        if found is None:
            by_question: dict[str, tuple[int, GpuRequest]] = {}
            for bit, gpu in self._gpu_shapes:
                question = mig_question(gpu, device)
                if question is not None:
                    mask, asked = by_question.get(question, (0, gpu))
                    by_question[question] = (mask | bit, asked)
            found = self._mig_questions[device.kind] = list(by_question.values())
        return found

    def _bits_at_once(self, node: Node, device: Device, usage: DeviceUsage) -> int | None:
        """The mask of shapes one share of which fits, from :func:`~.capacity.shares_fit`
        (every shape at once; what :func:`~.fit.hosts` answers shape by shape), or None where
        that does not apply (MIG and exclusive GPUs, unhealthy ones)."""
        arrays = self._share_arrays(device)
        if arrays is None:
            return None
        selected, memory, compute = arrays
        fits = shares_fit(node, device, usage, memory, compute)
        if fits is None:
            return None
        return int.from_bytes(np.packbits(fits & selected, bitorder="little").tobytes(), "little")

    def _share_arrays(self, device: Device) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per typical shape, on a GPU of ``device``'s kind: whether one of its shares is asked
        of it at all, and the share's memory and compute; None on MIG and exclusive GPUs."""
        arrays = self._shares.get(device.kind)
        if arrays is None:
            if not modes.of(device.mode).arrayable:
                return None
            selected = np.zeros(len(self._weights), dtype=bool)
            memory = np.zeros(len(self._weights), dtype=np.int64)
            compute = np.zeros(len(self._weights), dtype=np.int64)
            for bit, gpu in self._gpu_shapes:
                i = bit.bit_length() - 1
                # a MIG request never fits a GPU outside MIG mode; the selectors, as hosts reads them
                selected[i] = (
                    gpu.kind is not GpuKind.MIG and gpu.allows_model(device.model.name) and gpu.allows_mode(device.mode)
                )
                if selected[i]:
                    memory[i], compute[i] = gpu.share_on(device)
            arrays = self._shares[device.kind] = (selected, memory, compute)
        return arrays

    def warm(self, placements: Iterable[tuple[NodeState, Allocation]]) -> None:
        """Work out at once the profiles of the MPS and time-slicing GPU states of the nodes of
        ``placements`` not yet known, and of those the placements would leave (every state
        against every typical shape in one question of arrays, :func:`~.capacity.rows_fit`),
        so that scoring them one by one finds them known: a new request shape on a busy cluster
        leaves a new state on nearly every GPU it could take. The others are left to
        :meth:`device_profile`; the answers are its own."""
        self._warm(placements)

    def _warm(self, placements: Iterable[tuple[NodeState, Allocation]]) -> None:
        devices = self._devices
        pending: dict[tuple[Any, ...], tuple[Node, Device, DeviceUsage]] = {}
        shared = modes.arrayable()
        seen: set[int] = set()
        for state, alloc in placements:
            node = state.node
            if id(state) not in seen and id(state) not in self._by_state:
                seen.add(id(state))
                for device, usage in zip(node.devices, state.usage, strict=True):
                    if device.mode in shared:
                        key = device_key(node, device, usage)
                        if key not in devices and key not in pending:
                            pending[key] = (node, device, usage)
            for share in alloc.shares:
                device = node.devices[share.index]
                if device.mode not in shared:
                    continue
                usage = add_share(device, state.usage[share.index], share)
                key = device_key(node, device, usage)
                if key not in devices and key not in pending:
                    pending[key] = (node, device, usage)
        if len(pending) >= 2:  # one state is as quickly asked alone
            self._profile_at_once(pending)

    def _profile_at_once(self, pending: dict[tuple[Any, ...], tuple[Node, Device, DeviceUsage]]) -> None:
        """:meth:`device_profile` of the MPS and time-slicing GPU states ``pending`` (by key),
        every state of one device kind against every typical shape in one question of arrays."""
        devices = self._devices
        if len(devices) + len(pending) > _MEMO_LIMIT:
            devices.clear()
        by_kind: dict[int, list[tuple[Any, ...]]] = {}
        for key, (_, device, _) in pending.items():
            by_kind.setdefault(device.kind, []).append(key)
        for keys in by_kind.values():
            device = pending[keys[0]][1]
            rows = np.array([usage_row(*pending[key]) for key in keys], dtype=np.int64)
            found = self._profiles_of_rows(device, rows)
            if found is not None:
                devices.update(zip(keys, found, strict=True))

    def _profiles_of_rows(self, device: Device, rows: np.ndarray) -> list[tuple[int, int]] | None:
        """:meth:`device_profile` of GPU states of ``device``'s kind given as
        :func:`~.capacity.usage_row` rows, every state against every typical shape in one
        question of arrays; None where the rules of arrays do not answer (MIG and exclusive
        GPUs, an unhealthy kind)."""
        arrays = self._share_arrays(device)
        if arrays is None or not device.healthy:  # one kind: one health
            return None
        selected, memory, compute = arrays
        fits = rows_fit(tuple(rows.T[:, :, None]), memory, compute)  # [state, shape]
        packed = np.packbits(fits & selected, axis=1, bitorder="little")
        frees = rows_free_milli(rows, modes.of(device.mode).divides_compute).tolist()
        return [(free, int.from_bytes(row.tobytes(), "little")) for free, row in zip(frees, packed, strict=True)]

    def _profiles_after(
        self, batch: ShareCandidates, placed: np.ndarray, first: list[int]
    ) -> list[tuple[int, int] | None]:
        """Per label of ``placed`` (its first candidate ``first``), the profile of its GPU once
        the share is placed, where the batch gives that GPU's row after (``after``); None for
        the others."""
        found: list[tuple[int, int] | None] = [None] * len(placed)
        if batch.after is None or not len(placed):
            return found
        ids, rows, _ = batch.after
        at = np.minimum(np.searchsorted(ids, placed), max(0, len(ids) - 1))
        given = np.flatnonzero(ids[at] == placed) if len(ids) else np.zeros(0, dtype=np.int64)
        kinds = rows[at[given], 0]
        for kind in distinct(kinds).tolist():
            mine = given[kinds == kind]
            c = first[int(mine[0])]
            device = batch.states[int(batch.node[c])].node.devices[int(batch.gpu[c])]
            profiles = self._profiles_of_rows(device, rows[at[mine], 1:])
            assert profiles is not None, device  # after gives healthy MPS and time-slicing GPUs only
            for u, profile in zip(mine.tolist(), profiles, strict=True):
                found[u] = profile
        return found

    def _p(self, mask: int) -> float:
        value = self._popularity.get(mask)
        if value is None:
            value = sum(w for i, w in enumerate(self._weights) if mask >> i & 1)
            self._popularity[mask] = value
        return value

    def cpu_levels(self) -> list[int]:
        """The typical shapes' CPU requests, lowest first (:meth:`cpu_level` counts those that fit)."""
        return self._cpu_levels

    def cpu_level(self, cpu_free: int) -> int:
        """How many typical shapes' CPU requests fit in ``cpu_free`` (F depends on CPU only so)."""
        return bisect_right(self._cpu_levels, cpu_free)

    def frag(self, profiles: Sequence[tuple[int, int]], cpu_free: int) -> float:
        """F_n(M) of a node whose devices have ``profiles`` and ``cpu_free`` milli-CPU left."""
        level = self.cpu_level(cpu_free)
        feasible = self._cpu_masks[level - 1] if level else 0
        if self._multi:
            feasible &= ~self._too_few(tuple(b for _, b in profiles))
        return self._sum(profiles, feasible)

    def _sum(self, profiles: Sequence[tuple[int, int]], feasible: int) -> float:
        """F of GPUs with ``profiles`` when the shapes of mask ``feasible`` are the ones the node
        could take: each GPU's free share times the popularity of what it cannot host."""
        total = 0.0
        for free, bits in profiles:
            if free:
                total += free * (1.0 - self._p(bits & feasible))
        return total

    def _too_few(self, bits: tuple[int, ...]) -> int:
        """The mask of multi-GPU shapes that fewer GPUs than they ask for can host, of a node
        whose GPUs host ``bits``."""
        return self._too_few_of(self._counts_of(bits))

    def _too_few_of(self, at_least: list[int]) -> int:
        """:meth:`_too_few` of GPUs whose :meth:`_at_least` counts are ``at_least``."""
        found = 0
        for count, shapes in self._multi_by_count.items():
            found |= shapes & ~at_least[count]
        return found

    def _counts_of(self, bits: tuple[int, ...]) -> list[int]:
        """:meth:`_at_least` of GPUs hosting ``bits``, up to one past the most GPUs a shape asks
        for (kept per tuple: GPUs in the same states count the same)."""
        at_least = self._counts.get(bits)
        if at_least is None:
            if len(self._counts) > _MEMO_LIMIT:
                self._counts.clear()
            at_least = self._counts[bits] = self._at_least(bits, max(self._multi_by_count) + 1)
        return at_least

    def _held(self, state: NodeState) -> _Kept | None:
        """What is kept of ``state`` (None: nothing yet)."""
        kept = self._by_state.get(id(state))
        return kept if kept is not None and kept.state is state else None

    def _kept(self, state: NodeState) -> _Kept:
        kept = self._held(state)
        if kept is not None:
            return kept
        node = state.node
        return self._keep(
            state, [self.device_profile(node, d, u) for d, u in zip(node.devices, state.usage, strict=True)]
        )

    def _keep(self, state: NodeState, profiles: list[tuple[int, int]]) -> _Kept:
        if len(self._by_state) >= _STATES_KEPT:
            self._by_state.clear()
        kept = self._by_state[id(state)] = _Kept(state, profiles)
        return kept

    def profiles(self, state: NodeState) -> list[tuple[int, int]]:
        """(free milli-GPU, shapes it can host) of each of the node's GPUs."""
        return self._kept(state).profiles

    def node_frag(self, state: NodeState) -> float:
        """F_n(M) of the node as it stands (kept with its profiles: every shape asks it)."""
        return self._frag_of(self._kept(state))

    def free_share(self, state: NodeState) -> int:
        """The node's free milli-GPU, the sum of its GPUs' (kept with its profiles)."""
        return self._free_of(self._kept(state))

    def _frag_of(self, kept: _Kept) -> float:
        if kept.frag is None:
            kept.frag = self.frag(kept.profiles, kept.state.cpu_free)
        return kept.frag

    @staticmethod
    def _free_of(kept: _Kept) -> int:
        if kept.free is None:
            kept.free = sum(kept.frees)
        return kept.free

    def fall(self, state: NodeState, alloc: Allocation) -> float:
        """F_before - F_after of placing ``alloc`` on ``state``."""
        return self.node_frag(state) - self.frag_after(state, alloc)

    def frag_after(self, state: NodeState, alloc: Allocation) -> float:
        """F_n(M) once ``alloc`` is placed on ``state``. A share of one GPU (nearly every
        candidate) changes one GPU: which multi-GPU shapes too few GPUs can host then follows
        from the state's own counts and that GPU's change (:meth:`_too_few_beside`), not from
        counting every GPU again for every such shape."""
        node = state.node
        kept = self._kept(state)
        after = list(kept.profiles)
        for share in alloc.shares:
            device = node.devices[share.index]
            after[share.index] = self.device_profile(node, device, add_share(device, state.usage[share.index], share))
        cpu_after = state.cpu_free - alloc.cpu_milli
        if len(alloc.shares) != 1 or not self._multi:
            return self.frag(after, cpu_after)
        g = alloc.shares[0].index
        level = self.cpu_level(cpu_after)
        feasible = (self._cpu_masks[level - 1] if level else 0) & ~self._too_few_beside(kept, g, after[g][1])
        return self._sum(after, feasible)

    def frags_after_shares(self, batch: ShareCandidates, cpu_milli: int) -> SharesAfter:
        """:meth:`frag_after` of every candidate of ``batch`` (each places one share of one GPU
        and takes ``cpu_milli``), the free milli-GPU its GPU has and keeps (:meth:`device_profile`
        of the GPU before and after it), and per node of the batch :meth:`node_frags` (read on
        the way), worked out at once. What a GPU becomes is asked once per label
        (equal labels: equal device states and share), the profiles of node states not kept
        yet once per label of their GPUs, and the rest over arrays: which shapes stay feasible
        (the node's CPU level after the pod, and the multi-GPU shapes too few GPUs would host)
        and each GPU's term, its free share times the popularity of what it cannot host,
        looked up once per distinct (GPU profile, feasible shapes) pair. The terms are summed
        GPU by GPU in the same order as :meth:`_sum`'s (a GPU with nothing free adds an exact
        zero), so the values are equal to :meth:`frag_after`'s, not merely close."""
        count = len(batch.node)
        if not count:
            none = np.zeros(0, dtype=np.int64)
            return SharesAfter(np.zeros(0), none, none, *self.node_frags(batch.states, batch.labels))
        states, labels = batch.states, batch.labels
        node_of, gpu_of = batch.node.tolist(), batch.gpu.tolist()
        devices = self._devices
        shared = modes.arrayable()
        pending: dict[tuple[Any, ...], tuple[Node, Device, DeviceUsage]] = {}
        # what each candidate GPU becomes: once per label; from the batch's rows where it has them
        placed, first, inverse = np.unique(labels[batch.node, batch.gpu], return_index=True, return_inverse=True)
        first_of = first.tolist()
        profile_after = self._profiles_after(batch, placed, first_of)
        after: list[tuple[int, tuple[Any, ...], Node, Device, DeviceUsage]] = []
        for u, (label, c) in enumerate(zip(placed.tolist(), first_of, strict=True)):
            if profile_after[u] is not None:
                continue
            state, g = states[node_of[c]], gpu_of[c]
            node = state.node
            device = node.devices[g]
            usage = add_share(device, state.usage[g], batch.shares[label])
            key = device_key(node, device, usage)
            after.append((u, key, node, device, usage))
            if device.mode in shared and key not in devices:
                pending[key] = (node, device, usage)
        held = self._kept_all(states, labels, pending)  # every node's, the fresh ones kept now
        for u, key, node, device, usage in after:
            profile_after[u] = devices.get(key) or self.device_profile(node, device, usage)
        profiles = cast(list[tuple[int, int]], profile_after)  # every label's now
        # per node: its GPUs' free shares and profile numbers, and the multi-GPU shapes its
        # GPUs are too few for
        if len(self._bit_ids) > _MEMO_LIMIT or len(self._few_ids) > _MEMO_LIMIT:
            self._bit_ids, self._few_ids = {}, Ids()
            self._numbering += 1
        bit_ids = self._bit_ids
        multi = bool(self._multi)
        numbering = self._numbering
        # what is worked out once per kept state: its F and free share, its GPUs' profile
        # numbers (per numbering) and the multi-GPU shapes its GPUs are too few for
        for k in [k for k in held if k.ready != numbering or (multi and k.too_few is None)]:
            self._frag_of(k)
            self._free_of(k)
            k.bit_ids = [bit_ids.setdefault(b, len(bit_ids)) for _, b in k.profiles]
            k.ready = numbering
            if multi:
                if k.too_few is None:
                    if k.at_least is None:
                        k.at_least = self._counts_of(tuple([b for _, b in k.profiles]))
                    k.too_few = self._too_few_of(k.at_least)
                k.few_id = self._few_ids.of(k.too_few)
        frag_before = np.array([k.frag for k in held], dtype=float)
        free_before = np.array([k.free for k in held], dtype=np.int64)
        frees = [k.frees for k in held]
        rows = cast(list[list[int]], [k.bit_ids for k in held])
        free_after = np.array([free for free, _ in profiles], dtype=np.int64)[inverse]
        id_after = np.array([bit_ids.setdefault(b, len(bit_ids)) for _, b in profiles], dtype=np.int64)[inverse]
        # which shapes stay feasible: by the node's CPU level after the pod, and the multi-GPU
        # shapes too few GPUs host (the node's own, unless the GPU placed on gains or loses one)
        cpu_after = batch.cpu_free_now() - cpu_milli
        levels = np.searchsorted(np.array(self._cpu_levels, dtype=np.int64), cpu_after, side="right")[batch.node]
        if multi:
            few = np.array([k.few_id for k in held], dtype=np.int64)[batch.node]
            multi_mask = self._multi_mask
            moved = [
                bool((held[node_of[c]].profiles[gpu_of[c]][1] ^ profiles[u][1]) & multi_mask)
                for u, c in enumerate(first_of)
            ]
            beside = np.flatnonzero(np.array(moved, dtype=bool)[inverse]).tolist()
            label_of = inverse.tolist()
            few[beside] = [
                self._few_ids.of(self._too_few_beside(held[node_of[c]], gpu_of[c], profiles[label_of[c]][1]))
                for c in beside
            ]
            values = cast(list[int], self._few_ids.values)
        else:
            few = np.zeros(count, dtype=np.int64)
            values = [0]
        keys = levels * len(values) + few
        unique_keys, key_of = np.unique(keys, return_inverse=True)
        feasible_ids: dict[int, int] = {}
        ids_of_key = []
        for key in unique_keys.tolist():
            level, few_id = divmod(key, len(values))
            mask = (self._cpu_masks[level - 1] if level else 0) & ~values[few_id]
            ids_of_key.append(feasible_ids.setdefault(mask, len(feasible_ids)))
        feasible_of = np.array(ids_of_key, dtype=np.int64)[key_of]
        lengths = set(map(len, rows))
        width = max(lengths)
        if len(lengths) > 1:  # nodes of fewer GPUs: nothing free beyond theirs
            frees = [row + [0] * (width - len(row)) for row in frees]
            rows = [list(row) + [0] * (width - len(row)) for row in rows]
        at = (np.arange(count), batch.gpu)
        free = np.array(frees, dtype=np.int64)[batch.node]
        gpu_before = free[at]
        free[at] = free_after
        ids = np.array(rows, dtype=np.int64)[batch.node]
        ids[at] = id_after
        pairs = ids * len(feasible_ids) + feasible_of[:, None]
        unique, pair_of = unique_inverse(pairs, len(bit_ids) * len(feasible_ids))
        bits_by_id = list(bit_ids)  # in numbering order (dicts keep it)
        masks_by_id = list(feasible_ids)
        width_f = len(feasible_ids)
        spare = np.array([1.0 - self._p(bits_by_id[k // width_f] & masks_by_id[k % width_f]) for k in unique.tolist()])
        terms = free * spare[pair_of]
        total = np.zeros(count)
        for j in range(width):
            total = total + terms[:, j]
        return SharesAfter(total, gpu_before, free_after, frag_before, free_before)

    def node_frags(self, states: Sequence[NodeState], labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`node_frag` and :meth:`free_share` of each of ``states`` (``labels``: per node
        a label per GPU, as :class:`ShareCandidates` has them), the profiles of the states not
        kept yet worked out once per label, the MPS and time-slicing ones at once."""
        held = self._kept_all(states, labels, {})
        frags = np.array([self._frag_of(k) for k in held], dtype=float)
        return frags, np.array([self._free_of(k) for k in held], dtype=np.int64)

    def _kept_all(
        self,
        states: Sequence[NodeState],
        labels: np.ndarray,
        pending: dict[tuple[Any, ...], tuple[Node, Device, DeviceUsage]],
    ) -> list[_Kept]:
        """What is kept of each of ``states``, those not kept yet kept now (their GPUs' profiles
        asked once per label, the MPS and time-slicing states among them at once together with
        those already ``pending``)."""
        kept, before = self._unkept(states, labels, pending)
        if len(pending) >= 2:  # one state is as quickly asked alone
            self._profile_at_once(pending)
        return self._keep_unkept(states, labels, kept, before) if None in kept else cast(list[_Kept], kept)

    def _unkept(
        self,
        states: Sequence[NodeState],
        labels: np.ndarray,
        pending: dict[tuple[Any, ...], tuple[Node, Device, DeviceUsage]],
    ) -> tuple[list[_Kept | None], dict[int, tuple[tuple[Any, ...], Node, Device, DeviceUsage]]]:
        """What is kept of each of ``states`` (None: nothing yet) and, once per label of the
        GPUs of those not kept, its device state; the MPS and time-slicing states among them
        not profiled yet are added to ``pending``."""
        devices = self._devices
        shared = modes.arrayable()
        by_state = self._by_state  # self._held of each, inline
        kept = [k if (k := by_state.get(id(state))) is not None and k.state is state else None for state in states]
        before: dict[int, tuple[tuple[Any, ...], Node, Device, DeviceUsage]] = {}
        for i, k in enumerate(kept):
            if k is not None:
                continue
            state = states[i]
            node = state.node
            for g, label in enumerate(labels[i, : len(node.devices)].tolist()):
                if label not in before:
                    device, usage = node.devices[g], state.usage[g]
                    key = device_key(node, device, usage)
                    before[label] = (key, node, device, usage)
                    if device.mode in shared and key not in devices:
                        pending[key] = (node, device, usage)
        return kept, before

    def _keep_unkept(
        self,
        states: Sequence[NodeState],
        labels: np.ndarray,
        kept: list[_Kept | None],
        before: dict[int, tuple[tuple[Any, ...], Node, Device, DeviceUsage]],
    ) -> list[_Kept]:
        """``kept`` (from :meth:`_unkept`) with the states not kept yet kept now, their GPUs'
        profiles asked once per label."""
        devices = self._devices
        profile = {label: devices.get(k) or self.device_profile(n, d, u) for label, (k, n, d, u) in before.items()}
        held: list[_Kept] = []
        for i, k in enumerate(kept):
            if k is None:
                state = states[i]
                k = self._keep(state, [profile[label] for label in labels[i, : len(state.node.devices)].tolist()])
            held.append(k)
        return held

    def _too_few_beside(self, kept: _Kept, g: int, bits_g: int) -> int:
        """:meth:`_too_few` of the state's GPUs with GPU ``g`` hosting ``bits_g`` instead: a
        shape the GPU no longer hosts is counted one GPU lower, one it now hosts one higher."""
        at_least = kept.at_least
        if at_least is None:
            at_least = kept.at_least = self._counts_of(tuple([b for _, b in kept.profiles]))
        old = kept.profiles[g][1]
        fewer, more = old & ~bits_g, bits_g & ~old
        moved = fewer | more
        if not moved & self._multi_mask:  # no multi-GPU shape gains or loses a GPU: the node's own
            if kept.too_few is None:
                kept.too_few = self._too_few_of(at_least)
            return kept.too_few
        key = (id(at_least), old, bits_g)
        known = self._beside.get(key)
        if known is not None and known[0] is at_least:
            return known[1]
        found = 0
        for count, shapes in self._multi_by_count.items():
            hosted = (at_least[count] & ~moved) | (at_least[count + 1] & fewer) | (at_least[count - 1] & more)
            found |= shapes & ~hosted
        if len(self._beside) > _MEMO_LIMIT:
            self._beside.clear()
        self._beside[key] = (at_least, found)
        return found

    @staticmethod
    def _at_least(bits: tuple[int, ...], top: int) -> list[int]:
        """``[k]``: the shapes that ``k`` GPUs or more of ``bits`` can host, for k = 0..top
        (all shapes at once: each GPU moves a shape it can host from k - 1 GPUs to k)."""
        at_least = [-1] + [0] * top  # every shape is hosted by 0 GPUs or more
        for j, b in enumerate(bits):
            for k in range(min(j + 1, top), 1, -1):  # after j + 1 GPUs, at most j + 1
                at_least[k] |= at_least[k - 1] & b
            at_least[1] |= b
        return at_least

    def frag_rate_parts(self, state: NodeState) -> tuple[float, int]:
        """(fragmented milli-GPU, idle milli-GPU) of a node, for cluster-wide rates."""
        return self.node_frag(state), self.free_share(state)


class _Kept:
    """What :class:`Fragmentation` keeps of one node state: its profiles, and its F and free
    share once asked."""

    __slots__ = ("at_least", "bit_ids", "few_id", "frag", "free", "frees", "profiles", "ready", "state", "too_few")

    def __init__(self, state: NodeState, profiles: list[tuple[int, int]]) -> None:
        self.state = state
        self.profiles = profiles
        self.frees = [free for free, _ in profiles]  # each GPU's free milli-GPU
        self.frag: float | None = None
        self.at_least: list[int] | None = None  # see Fragmentation._at_least
        self.too_few: int | None = None  # see Fragmentation._too_few
        self.free: int | None = None
        self.bit_ids: list[int] | None = None  # each GPU's shapes' number, in the numbering ``ready``
        self.ready = -1  # the numbering F, the free share and bit_ids were worked out in (-1: none yet)
        self.few_id = -1  # too_few's number, in the numbering ``ready`` (with multi-GPU shapes)
