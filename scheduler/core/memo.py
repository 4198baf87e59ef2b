"""Keys for the per-state memo (``NodeState.memo``).

A node state is immutable and replaced on every change, so anything computed from it
alone may be stored in its memo and can never go stale. Keys are interned to small
ints so a lookup hashes an int rather than a request.
"""

from __future__ import annotations

import itertools

_keys: dict[object, int] = {}
_next_id = itertools.count(1)
_LIMIT = 100_000


def intern(key: object) -> int:
    """A small int standing for ``key``.

    Ids are never reused (the table may be cleared, the counter never restarts), so a
    memo entry can only ever be found by the key it was stored under.
    """
    value = _keys.get(key)
    if value is None:
        if len(_keys) > _LIMIT:
            _keys.clear()
        value = _keys[key] = next(_next_id)
    return value
