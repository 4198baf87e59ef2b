"""The rules of a GPU shared by processes side by side (MPS and time-slicing), written once
over arrays: the scalar question of one share on one GPU is the same rules over one row.

A GPU state is read as a row of integers (:func:`~scheduler.core.capacity.usage_row`): whether
these rules answer for it, the GPU's memory, its memory and compute caps and its client or
replica limit (its mode's :meth:`~.base.Mode.caps`), the memory, compute and shares it holds,
whether a whole share holds it, and the memory stray processes hold. :func:`broken` lists the
rules a share of (``m`` MiB, ``c`` milli-GPU) breaks, in the order they are asked; everything
else here reads that list.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..allocation import DeviceShare
from ..inventory import Device, Node
from ..request import MILLI
from .base import (
    DeviceUsage,
    Mode,
    Refusal,
    compute_short_text,
    free_mib,
    held,
    no_such_share,
    not_free,
    not_mig,
    refused,
)

# The rules of arrays, in the order they are asked (the refusal's rules, then the stray rule).
NO_SUCH_SHARE, NOT_FREE, NO_CLIENT, COMPUTE_SHORT, MEMORY_SHORT, STRAY_SHORT = range(6)
NO_CAP = 1 << 62  # no bound (time-slicing does not divide compute)


def broken(columns: Any, m: Any, c: Any) -> tuple[Any, ...]:
    """Per rule (:data:`NO_SUCH_SHARE` .. :data:`STRAY_SHORT`), whether a share of ``m`` MiB and
    ``c`` milli-GPU breaks it on the GPU state ``columns`` (a usage row's ten columns): Python
    integers and booleans for one share on one state, arrays that broadcast for many."""
    _, total, memory_cap, compute_cap, limit, used_memory, used_compute, shares, whole, stray = columns
    room = memory_cap - used_memory
    return (
        (m < 0) | (c < 0) | (m > total) | (c > MILLI),  # no share of this GPU at all
        (whole != 0) | ((shares != 0) & (m >= total) & (c >= MILLI)),  # a whole share only alone
        shares >= limit,  # no client or replica left
        used_compute + c > compute_cap,
        m > room,  # memory past the cap
        (stray > 0) & (m > room - stray) & (m > 0),  # memory past what stray processes leave of it
    )


def rows_fit(rows: np.ndarray | tuple[Any, ...], memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """Per share (``memory_mib[i]``, ``compute_milli[i]``): whether it fits the GPU state of
    ``rows[i]`` (an array of usage rows, one per share), or of ``rows`` (one row as a tuple, for
    every share; or a tuple of columns that broadcast against the shares, such as every
    state's column as ``(states, 1)`` for every state and share at once): no rule of
    :func:`broken` broken. Only for rows whose first column is 1."""
    columns = rows.T if isinstance(rows, np.ndarray) else rows
    first, *others = broken(columns, memory_mib, compute_milli)
    bad = first
    for rule in others:
        bad = bad | rule
    fits: np.ndarray = ~bad
    return fits


def rows_refused_rule(rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): the
    first rule of :func:`broken` it breaks. Meaningless where the share fits."""
    rules = broken(rows.T, memory_mib, compute_milli)
    rule: np.ndarray = np.select(rules[:STRAY_SHORT], list(range(STRAY_SHORT)), STRAY_SHORT)
    return rule


def rows_add_share(rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray) -> np.ndarray:
    """The usage rows (one per GPU state) once one share of ``memory_mib[i]`` and
    ``compute_milli[i]`` (not a MIG instance) is added to each, as
    :func:`~scheduler.core.capacity.add_share` adds it. A share of the whole GPU marks it whole."""
    after = rows.copy()
    after[:, 5] += memory_mib
    after[:, 6] += compute_milli
    after[:, 7] += 1
    after[:, 8] |= ((memory_mib >= rows[:, 1]) & (compute_milli >= MILLI)).astype(after.dtype)
    return after


def _room(columns: Any) -> Any:
    return columns[2] - columns[5]


def rows_refused_free(
    rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray, rule: np.ndarray | None = None
) -> np.ndarray:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): the free
    memory (MiB) its :class:`~.base.Refusal` reports; the first rule the share breaks
    (:func:`rows_refused_rule`, or ``rule`` if given) decides which. Meaningless where the
    share fits."""
    columns = rows.T
    total, used_memory, stray = columns[1], columns[5], columns[9]
    device_free = np.maximum(0, total - used_memory)
    room = _room(columns)
    by_rule = [device_free, 0, device_free, device_free, np.maximum(0, room), np.maximum(0, room - stray)]
    broken_rule = rows_refused_rule(rows, memory_mib, compute_milli) if rule is None else rule
    free: np.ndarray = np.choose(broken_rule, by_rule)
    return free


SHORT_MEMORY, SHORT_COMPUTE = 1, 2  # what rows_shortages finds short (0: another rule broken)
_SHORT_OF_RULE = np.array([0, 0, 0, SHORT_COMPUTE, SHORT_MEMORY, SHORT_MEMORY])  # by rule


def rows_shortages(
    rows: np.ndarray, memory_mib: np.ndarray, compute_milli: np.ndarray, rule: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per share that does not fit the GPU state of ``rows[i]`` (see :func:`rows_fit`): what
    its :class:`~.base.Refusal` says is short, as numbers, where the rule it breaks names no
    GPU: :data:`SHORT_MEMORY` (memory past the cap or past what stray processes leave) and the
    MiB asked; :data:`SHORT_COMPUTE` and the milli-GPU asked; 0 where it breaks another rule.
    A node's reason is written from these (see :func:`~scheduler.core.fit.short_reason`), once
    per distinct pair. ``rule``: :func:`rows_refused_rule`'s answer, if known."""
    if rule is None:
        rule = rows_refused_rule(rows, memory_mib, compute_milli)
    what = _SHORT_OF_RULE[rule]
    need = np.where(what == SHORT_COMPUTE, compute_milli, memory_mib) * (what > 0)
    return what, need


def free_share(
    total: Any, used_memory: Any, used_compute: Any, stray: Any, divides_compute: bool, maximum: Any, minimum: Any
) -> Any:
    """The free share (milli-GPU) of a GPU state (the columns of its usage row) that has a client
    or replica left and no whole share: its free memory as a share of the GPU, and where shares
    divide the compute (MPS) no more than its free compute. Python integers with ``max`` and
    ``min``; arrays with ``np.maximum`` and ``np.minimum``."""
    memory_share = maximum(0, total - (used_memory + stray)) * MILLI // total
    return maximum(0, minimum(MILLI - used_compute, memory_share)) if divides_compute else memory_share


def rows_free_milli(rows: np.ndarray, divides_compute: bool) -> np.ndarray:
    """The free share (milli-GPU) of healthy GPU states of an arrayable mode (``divides_compute``:
    MPS), from their usage rows (one per state), as :meth:`SharedMode.amounts` works it out."""
    _, total, _, _, limit, used_memory, used_compute, shares, whole, stray = rows.T
    share = free_share(total, used_memory, used_compute, stray, divides_compute, np.maximum, np.minimum)
    free: np.ndarray = np.where((shares >= limit) | (whole != 0), 0, share)
    return free


class SharedMode(Mode):
    """A mode whose GPUs hold shares side by side, answered by :func:`broken`."""

    arrayable = True

    def amounts(self, node: Node, device: Device, usage: DeviceUsage) -> tuple[int, int, int]:
        memory_cap, compute_cap, limit = self.caps(node, device)
        if usage.shares >= limit or usage.whole:
            return 0, 0, 0
        used, stray, divides = usage.memory_mib, device.stray_memory_mib, self.divides_compute
        memory = max(0, memory_cap - used - stray)
        compute = max(0, (compute_cap if divides else MILLI) - usage.compute_milli)
        return memory, compute, free_share(device.memory_mib, used, usage.compute_milli, stray, divides, max, min)

    def no_client(self, device: Device) -> str:
        """The text of :data:`NO_CLIENT`."""
        raise NotImplementedError

    def refusal(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        return self._first(node, device, usage, share, STRAY_SHORT)

    def stray_refusal(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        row = self.row(node, device, usage)
        if not broken(row, share.memory_mib, share.compute_milli)[STRAY_SHORT]:
            return None
        return self._refused(device, usage, share, row, STRAY_SHORT)

    def why_not(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare) -> Refusal | None:
        return self._first(node, device, usage, share, STRAY_SHORT + 1)

    def _first(self, node: Node, device: Device, usage: DeviceUsage, share: DeviceShare, rules: int) -> Refusal | None:
        """The refusal of the first of the first ``rules`` rules of :func:`broken` that
        ``share`` breaks (None if none)."""
        row = self.row(node, device, usage)
        found = broken(row, share.memory_mib, share.compute_milli)
        rule = next((r for r in range(rules) if found[r]), None)
        if rule == NO_SUCH_SHARE:
            return no_such_share(device, usage, share.memory_mib, share.compute_milli)
        if share.mig is not None:
            return not_mig(device, usage)
        return None if rule is None else self._refused(device, usage, share, row, rule)

    def _refused(self, device: Device, usage: DeviceUsage, share: DeviceShare, row: Any, rule: int) -> Refusal:
        """The refusal of ``share`` on the GPU state ``row`` that breaks ``rule`` (past
        :data:`NO_SUCH_SHARE`)."""
        m = share.memory_mib
        if rule == NOT_FREE:
            return not_free(device)
        if rule == NO_CLIENT:
            return refused(device, usage, self.no_client(device))
        if rule == COMPUTE_SHORT:
            return Refusal(compute_short_text(share.compute_milli), free_mib(device, usage))
        if rule == MEMORY_SHORT:
            left = max(0, _room(row))
            return Refusal(f"needs {m} MiB on one GPU, free {left} MiB", left, m)
        stray = device.stray_memory_mib
        left = max(0, _room(row) - stray)
        return Refusal(f"needs {m} MiB on one GPU, free {left} MiB ({held(stray)})", left, m)

    def note(self, device: Device) -> str:
        """The stray memory, as :meth:`detail` appends it."""
        stray = device.stray_memory_mib
        return f"; stray {stray} MiB" if stray else ""
