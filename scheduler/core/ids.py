"""Small ints for hashable values, so that arrays can hold them and look-ups hash an int."""

from __future__ import annotations

from collections.abc import Hashable


class Ids:
    """Numbers values in the order first seen: :meth:`of` gives a value's number, ``values``
    the values by number."""

    __slots__ = ("_ids", "values")

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self.values: list[Hashable] = []

    def of(self, value: Hashable) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def __len__(self) -> int:
        return len(self.values)
