"""The texts a board answers with (reasons, problems), each kept once and named by a small int.

Tables of reasons are then arrays of ints, and an answer (:class:`~.board.Outcomes`) carries the
list of texts its ids index. Reasons name numbers (free memory, counts), so the list would grow
without end on a long-lived board: past :attr:`Texts.MAX` it starts afresh, and whatever holds
ids of the old list is told (:meth:`Texts.on_forget`) so that it forgets them or numbers them
again. An answer keeps the list it was made with; a new list is a new object, which is how a
caller sees that its ids no longer hold.
"""

from __future__ import annotations

from collections.abc import Callable


class Texts:
    MAX = 100_000

    __slots__ = ("_ids", "_listeners", "values")

    def __init__(self) -> None:
        self.values: list[str] = [""]  # by id; 0: "" (no reason)
        self._ids: dict[str, int] = {"": 0}
        self._listeners: list[Callable[[list[str]], None]] = []

    def on_forget(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener`` with the old list each time the texts start afresh (before the text
        that made them start afresh is numbered), in the order the listeners came."""
        self._listeners.append(listener)

    def of(self, text: str) -> int:
        """The id of ``text`` (a new one if new)."""
        found = self._ids.get(text)
        if found is None:
            if len(self.values) > self.MAX:
                old = self.values
                self.values, self._ids = [""], {"": 0}
                for listener in self._listeners:
                    listener(old)
            found = self._ids[text] = len(self.values)
            self.values.append(text)
        return found
