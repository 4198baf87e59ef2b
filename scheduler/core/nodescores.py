"""The policy's score of a pod on each of some nodes where its GPU request fits (what
:func:`~.select.score_node` answers node by node), from the board's columns (:mod:`.columns`):
the candidates found from the device states that host the request instead of asking every
GPU again, and handed to the policy all at once where it can take them so.

Nothing is kept here: :mod:`.scorecache` asks for the nodes whose score it does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from .allocation import Allocation, DeviceShare
from .arrays import distinct
from .capacity import DeviceUsage, Refusal
from .columns import Columns
from .fit import Fit, device_share, fit_options, gpu_fit, sharing_share
from .fragmentation import ShareCandidates
from .inventory import Device, Node, SharingMode
from .modes.shared import rows_add_share
from .policies.base import Policy, capabilities
from .request import MILLI, Demand, GpuKind, GpuRequest
from .select import NO_MOVE, Scored, firsts, score_firsts
from .state import NodeState

# nodes from which a policy's score_nodes pays (fgd-reserve on new node states: 1.1x at 16, 0.8x at 32)
_AT_ONCE_FROM = 32


def share_on(gpu: GpuRequest, node: Node, device: Device, usage: DeviceUsage, by_arrays: bool) -> DeviceShare:
    """The share ``gpu`` takes of ``device`` beside ``usage``, which hosts it (``by_arrays``: a
    state the rules of arrays answer, where the share is exactly what is asked). A whole GPU
    takes all of one in every mode but MIG, whatever its state (a MIG GPU hosts one only as an
    instance, for a pod listing mig in sharing: fit's answer)."""
    if gpu.kind is GpuKind.WHOLE and device.mode is not SharingMode.MIG:
        return DeviceShare(device.uuid, device.index, device.mode, device.memory_mib, MILLI)
    if by_arrays:
        return sharing_share(gpu, device)
    answer = device_share(gpu, node, device, usage)
    assert not isinstance(answer, Refusal), answer  # the device state hosts it
    return answer


def _as_arrays(scored: Sequence[Scored | str]) -> tuple[np.ndarray, np.ndarray]:
    """The scores and gap moves (one row per node) of nodes scored one by one."""
    assert not any(isinstance(found, str) for found in scored), scored  # fit agrees with gpu_fits' counts
    found = cast(Sequence[Scored], scored)
    values = np.array([s.score for s in found], dtype=float)
    return values, np.array([s.move for s in found], dtype=np.int64).reshape(-1, 2)


def score_nodes(
    columns: Columns, policy: Policy, demand: Demand, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~.select.score_node` of each of ``positions`` (where the GPU request fits), as
    arrays: the scores, and the gap moves (one row per position).

    A request for one share of one GPU (or one whole GPU, or one MIG instance) has one
    candidate per GPU that hosts it, and candidates on GPUs in one device state are
    equivalent (:func:`~.select.outcome`): so one candidate per distinct device state that
    hosts it, from the first GPU in that state, found from the board's device states
    instead of asking every GPU again. A policy with ``score_nodes`` scores them all at
    once when there are many (``_AT_ONCE_FROM`` nodes or more); else one with ``prepare``
    is told every candidate first. A pod without a GPU request has one placement per node,
    taking no GPU: a policy with ``score_without_gpu`` scores many such nodes at once."""
    gpu = demand.gpu
    can = capabilities(policy)
    prepare, without_gpu = can.prepare, can.score_without_gpu
    if gpu.kind is GpuKind.NONE and without_gpu is not None and len(positions) >= _AT_ONCE_FROM:
        # one placement per node, taking no GPU: no gap move
        states = list(map(columns.state, positions.tolist()))
        values = np.array(without_gpu.score_without_gpu(demand, states, columns.devs[positions]), dtype=float)
        return values, np.full((len(values), 2), NO_MOVE, dtype=np.int64)
    if gpu.kind is GpuKind.NONE or gpu.count > 1:
        found = (
            [(state, gpu_fit(demand, state)) for state in map(columns.state, positions.tolist())]
            if gpu.kind is GpuKind.NONE
            else _several_fits(columns, demand, positions)
        )
        candidates = [(state, firsts(state, got.allocations)) for state, got in found if got]
        if prepare is not None:
            prepare.prepare(demand, [(state, alloc) for state, allocs in candidates for alloc in allocs])
        scored = iter([score_firsts(policy, demand, state, allocs) for state, allocs in candidates])
        return _as_arrays([next(scored) if got else got.reason for _, got in found])
    rows = columns.devs[positions]
    hosts = columns.dev_states.hosted(gpu, rows).hosts[rows]
    at_once = can.score_nodes
    if at_once is not None and len(positions) >= _AT_ONCE_FROM:
        values, moves = at_once.score_nodes(demand, _candidates(columns, gpu, positions, rows, hosts))
        return values, moves
    # the states the rules of arrays answer take exactly what is asked where they host it
    sharing = (hosts & columns.dev_states.by_arrays(gpu, rows)).tolist()
    nodes: list[tuple[NodeState, list[Allocation]]] = []
    for i, row, hosting, asked in zip(positions.tolist(), rows.tolist(), hosts.tolist(), sharing, strict=True):
        state = columns.state(i)
        node = state.node
        seen: set[int] = set()
        mine: list[Allocation] = []
        for g, device_id in enumerate(row[: len(node.devices)]):
            if hosting[g] and device_id not in seen:
                seen.add(device_id)
                share = share_on(gpu, node, node.devices[g], state.usage[g], asked[g])
                mine.append(Allocation(node.name, (share,), demand.cpu_milli, demand.memory_mib))
        nodes.append((state, mine))
    if prepare is not None:
        prepare.prepare(demand, [(state, alloc) for state, allocs in nodes for alloc in allocs])
    return _as_arrays([score_firsts(policy, demand, state, allocs) for state, allocs in nodes])


def _several_fits(columns: Columns, demand: Demand, positions: np.ndarray) -> list[tuple[NodeState, Fit]]:
    """:func:`~.fit.gpu_fit` of a request of several GPUs on each of ``positions`` (where
    enough GPUs host one of its shares), its options found from the board's hosting table
    (one share per hosting GPU, in device order) instead of asking every GPU again."""
    gpu = demand.gpu
    rows = columns.devs[positions]
    hosts = columns.dev_states.hosted(gpu, rows).hosts[rows].tolist()
    sharing = columns.dev_states.by_arrays(gpu, rows).tolist()
    found: list[tuple[NodeState, Fit]] = []
    for i, hosting, asked in zip(positions.tolist(), hosts, sharing, strict=True):
        state = columns.state(i)
        node = state.node
        options = [
            share_on(gpu, node, device, state.usage[g], asked[g]) for g, device in enumerate(node.devices) if hosting[g]
        ]
        enough = len(options) >= gpu.count  # as gpu_fits counted; else fit's own reason
        found.append((state, fit_options(demand, node, options) if enough else gpu_fit(demand, state)))
    return found


def _candidates(
    columns: Columns, gpu: GpuRequest, positions: np.ndarray, rows: np.ndarray, hosts: np.ndarray
) -> ShareCandidates:
    """The candidates of one share of ``gpu`` on ``positions`` (whose device states are
    ``rows``, hosting it where ``hosts``) as arrays: on each node the first GPU of each
    device state that hosts it, labelled by device state, with the share placed on each
    such state."""
    dev_states = columns.dev_states
    states = cast(list[NodeState], [columns.states[i] for i in positions.tolist()])  # scored: known
    width = rows.shape[1]
    first = hosts & (rows > 0)  # a GPU of the node (0: none, past its last GPU)
    for g in range(1, width):
        first[:, g] &= (rows[:, :g] != rows[:, g : g + 1]).all(axis=1)
    node, column = np.nonzero(first)
    placed = distinct(rows[node, column])
    arrayable = dev_states.by_arrays(gpu, placed)
    shares: dict[int, DeviceShare] = {}
    for device_id in placed[~arrayable].tolist():
        host, device, usage = dev_states.entry(device_id)
        shares[device_id] = share_on(gpu, host, device, usage, False)
    after = None
    if arrayable.any():  # the others: what their states become, as rows (ShareCandidates.after)
        ids = placed[arrayable]
        usage_rows, _, memory, compute = dev_states.state_shares(gpu, ids)
        after_rows = np.column_stack([dev_states.table()[ids, 0], rows_add_share(usage_rows, memory, compute)])
        after = (ids, after_rows, np.minimum(MILLI, compute))  # share_milli of such a share
    return ShareCandidates(states, rows, node, column, shares, after, columns.cpu_free[positions])
