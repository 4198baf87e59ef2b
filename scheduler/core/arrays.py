"""Distinct values of integer arrays, as numpy's ``unique`` answers them, faster where it is slow.

numpy 2.x answers ``np.unique(a)`` (values only) by hashing: at the sizes the board asks
about (hundreds to thousands of device state ids, node kinds or text ids a call) that costs
5-7 times one sort. :func:`distinct` sorts instead; :func:`unique_rows` groups rows with one
sort of the columns; :func:`unique_inverse` of small non-negative ids marks them in a table
instead of sorting. All answer exactly as ``np.unique`` does (property tests hold them to it).
"""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values`` (any shape, flattened), ascending: ``np.unique(values)``."""
    ranked = np.sort(values, axis=None)
    if len(ranked) < 2:
        return ranked
    new = np.empty(len(ranked), dtype=bool)
    new[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    kept: np.ndarray = ranked[new]
    return kept


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D integer array (in ascending order), the index of each one's
    first occurrence, and each row's place among them: ``np.unique(rows, axis=0,
    return_index=True, return_inverse=True)``, by one sort of the columns (numpy's sorts
    rows as opaque records, several times slower)."""
    order = np.lexsort(rows.T[::-1])
    ranked = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ranked[new], order[new], inverse


def unique_inverse(values: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``values`` (integers in ``0 .. bound - 1``, any shape), ascending,
    and each value's place among them (in ``values``' shape): ``np.unique(values,
    return_inverse=True)``, its inverse in ``values``' shape. Where ``bound`` is small beside the
    number of values, by marking each value in a table of ``bound`` and counting, not sorting."""
    if bound > 4 * values.size + 1024:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.reshape(values.shape)
    seen = np.zeros(bound, dtype=bool)
    seen[values] = True
    place = np.cumsum(seen) - 1
    return np.flatnonzero(seen), place[values]
