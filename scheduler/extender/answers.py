"""What the HTTP layer remembers of its own answers, in bytes: the one home of byte-level caching.

kube-scheduler sends filter the same list of node names pod after pod, and prioritize the
names filter passed. Worked out once per list, and kept while the board's ``layout`` (which
names sit at which positions) stays: each name's board position, the list's JSON, the
prioritize answer's template, the lists of survivors filter passed from it. Per list and
kind of pod, the FailedNodes and FailedAndUnresolvableNodes maps are kept as JSON and made
again only when an outcome changed. The NodeNames arrays met lately are kept as their bytes
(:class:`NameLists`), so that a body listing them again is not decoded again. Nothing here
decides anything: every answer is made from the board's outcomes and scores of the call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from scheduler.core.board import Board, Outcomes, Status

from . import wire


class NameLists:
    """The NodeNames arrays met lately, each as its JSON bytes and as the list of names.

    kube-scheduler sends filter the same 5,000 names for pod after pod, and prioritize the
    names filter passed: comparing bytes is far cheaper than decoding them again, and the
    same list object then lets the service recognise the list at once. Not thread-safe:
    the verbs that use it run on the event loop.
    """

    __slots__ = ("_lists", "_size")

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._lists: list[tuple[bytes, list[str]]] = []  # most recent first

    def find(self, raw: bytes) -> list[str] | None:
        """The names of the array encoded as ``raw``, if met lately."""
        for i, (seen, names) in enumerate(self._lists):
            if seen == raw:
                self._to_front(i)
                return names
        return None

    def encode(self, names: list[str], raw: bytes | None = None) -> bytes:
        """``names`` as a JSON array (``raw`` if given, else encoded), remembered as the most
        recent; the very list object is looked for first, and keeps the bytes it came with."""
        for i, (seen, known) in enumerate(self._lists):
            if known is names:
                self._to_front(i)
                return seen
        if raw is None:
            raw = wire.dumps(names)
        self.remember(raw, names)
        return raw

    def remember(self, raw: bytes, names: list[str]) -> None:
        self._lists.insert(0, (raw, names))
        del self._lists[self._size :]

    def _to_front(self, i: int) -> None:
        if i:
            self._lists.insert(0, self._lists.pop(i))


class NodeOrder:
    """kube-scheduler's own order of the nodes, learned from the filter lists it sends, so that a
    list that is a stretch of that order is placed on the board from its bytes alone.

    With node sampling (``percentageOfNodesToScore``), each scheduling cycle lists the next
    stretch of kube-scheduler's node order, starting where the last cycle stopped and wrapping
    around (at 5,000 nodes, 500 a cycle). Placing 500 names one dictionary lookup each is most
    of a filter's bookkeeping once the machine's caches have gone cold between calls (about
    0.2 ms); a stretch of a known order costs one comparison of bytes.

    What is learned is a guess: per board position, the position listed after it, within a list
    and from one list's last name to the next list's first. Once every node has one and they
    make one cycle, the cycle is taken as the order. A list is read as a stretch of it only
    when its bytes are exactly those of the stretch that starts at its first name (no escapes,
    Go's spacing), so a wrong guess costs a miss, never a wrong position. Not thread-safe:
    callers hold the cluster cache's lock.
    """

    __slots__ = ("_blob", "_failed", "_last", "_layout", "_misses", "_next", "_offsets", "_place", "_ring")

    def __init__(self) -> None:
        self._reset(-1)

    def _reset(self, layout: int) -> None:
        self._layout = layout
        self._next = np.zeros(0, dtype=np.int64)  # per position: the position listed after it (-1 none yet)
        self._last = -1  # the last position of the list before
        self._misses = 0  # lists learned from since the order was last made (or tried)
        self._failed = False  # the links were last found not to make one cycle
        self._ring: np.ndarray | None = None  # the order's positions, twice (a stretch may wrap)
        self._place = np.zeros(0, dtype=np.int64)  # per position: its place in the order
        self._blob = b""  # the order's names as JSON strings joined by commas, twice
        self._offsets = np.zeros(0, dtype=np.int64)  # where each place's name starts in the blob

    def match(self, raw: bytes, board: Board) -> np.ndarray | None:
        """The positions of the names of the JSON array ``raw``, if it is a stretch of the
        order learned (on the board's current layout); else None."""
        ring = self._ring
        if ring is None or self._layout != board.layout or len(raw) < 4:
            return None
        if not (raw.startswith(b'["') and raw.endswith(b'"]')) or b"\\" in raw:
            return None
        try:
            first = raw[2 : raw.index(b'"', 2)].decode()
        except UnicodeDecodeError:
            return None
        at = int(board.positions([first])[0])
        if at < 0 or at >= len(self._place) or (k := int(self._place[at])) < 0:
            return None
        count = raw.count(b'","') + 1  # no escapes: every '","' parts two names
        if count > len(ring) // 2:
            return None
        offsets = self._offsets
        if raw[1:-1] != self._blob[offsets[k] : offsets[k + count] - 1]:
            return None
        self._last = int(ring[k + count - 1])
        return ring[k : k + count]

    def learn(self, positions: np.ndarray, board: Board, entries: Entries) -> None:
        """A filter list that was not a stretch of the order: the links it shows are kept, and
        the order is made again from them once every node has one (after a failed try or once
        made, a turn's worth of such lists later: each try walks every node)."""
        if self._layout != board.layout:
            self._reset(board.layout)
        size = len(board.names())
        if len(self._next) < size:
            self._next = np.concatenate([self._next, np.full(size - len(self._next), -1, dtype=np.int64)])
        if not len(positions) or positions.min() < 0:
            self._last = -1
            return
        if self._last >= 0:
            self._next[self._last] = positions[0]
        self._next[positions[:-1]] = positions[1:]
        self._last = int(positions[-1])
        self._misses += 1
        waited = self._misses * len(positions) >= len(board)
        if (waited or (self._ring is None and not self._failed)) and not (self._next[board.everyone()] < 0).any():
            self._make(board, entries)

    def _make(self, board: Board, entries: Entries) -> None:
        """The order, if the links (one per node) make one cycle through every node; else none."""
        self._misses = 0
        alive = board.everyone()
        links = self._next.tolist()
        start = int(alive[0])
        order = [start]
        at = links[start]
        while at != start and len(order) <= len(alive):
            order.append(at)
            at = links[at]
        self._failed = at != start or len(order) != len(alive)
        if self._failed:
            self._ring = None
            return
        encoded = [key[:-1] for key in entries.keys[order].tolist()]  # '"name":' without its colon
        lengths = np.array([len(e) + 1 for e in encoded] * 2, dtype=np.int64)  # each with its comma
        self._blob = b",".join(encoded + encoded)
        self._offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        self._ring = np.array(order + order, dtype=np.int64)
        self._ring.flags.writeable = False  # listings hold slices of it
        self._place = np.full(len(links), -1, dtype=np.int64)
        self._place[order] = np.arange(len(order))


class Listing:
    """One list of node names as it came, and what is worked out from it once."""

    __slots__ = ("_keys", "_maps", "_survivors", "_template", "all_known", "layout", "names", "positions", "raw")

    _MAX_MAPS = 64
    _MAX_SURVIVORS = 32

    def __init__(self, layout: int, names: list[str], positions: np.ndarray) -> None:
        self.layout = layout
        self.names = names
        self.positions = positions
        self.all_known = bool(len(positions) == 0 or positions.min() >= 0)
        self.raw: bytes | None = None  # the names as a JSON array, once made
        self._template: wire.HostPriorities | None = None
        self._keys: np.ndarray | None = None
        self._maps: OrderedDict[Hashable, _Failures] = OrderedDict()
        self._survivors: OrderedDict[bytes, Listing] = OrderedDict()

    def survivors(self, fits: np.ndarray, entries: Entries) -> Listing:
        """The listed nodes where ``fits``, as a listing (itself if all fit), kept per outcome.

        Filter passes the same nodes for pod after pod of a kind (a node drops out only when
        it fills up): the passed names, their JSON and prioritize's encoded answer are then
        reused instead of made again. ``entries`` are the board's, of this listing's layout.
        """
        if fits.all():
            return self
        key = np.packbits(fits).tobytes()
        found = self._survivors.get(key)
        if found is not None:
            self._survivors.move_to_end(key)
            return found
        at = np.flatnonzero(fits)
        known = self.all_known
        passed = entries.names[self.positions[at]].tolist() if known else [self.names[i] for i in at.tolist()]
        found = self._survivors[key] = Listing(self.layout, passed, self.positions[at])
        if len(self._survivors) > self._MAX_SURVIVORS:
            self._survivors.popitem(last=False)
        return found

    def template(self, entries: Entries) -> wire.HostPriorities:
        """The prioritize answer for these names, scores left blank (``entries``: the board's,
        of this listing's layout)."""
        if self._template is None:
            if self.all_known:
                self._template = wire.HostPriorities(entries.encoded[self.positions].tolist())
            else:
                self._template = wire.HostPriorities([wire.host_entry(n) for n in self.names])
        return self._template

    def keys(self, entries: Entries) -> np.ndarray:
        """Each listed name as a JSON object key (``"name":``)."""
        if self._keys is None:
            if self.all_known:
                self._keys = entries.keys[self.positions]
            else:
                self._keys = np.empty(len(self.names), dtype=object)
                self._keys[:] = [wire.dumps(n) + b":" for n in self.names]
        return self._keys

    def failures(self, key: Hashable) -> _Failures:
        """The failure maps of one kind of pod (``key``) on this list."""
        found = self._maps.get(key)
        if found is None:
            found = self._maps[key] = _Failures(len(self.names))
            if len(self._maps) > self._MAX_MAPS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(key)
        return found


class _Failures:
    """FailedNodes and FailedAndUnresolvableNodes of one kind of pod on one list, as JSON,
    made again only when an outcome changed (each made at once from arrays of encoded names
    and reasons, never entry by entry in Python)."""

    __slots__ = ("encoded", "reason", "status")

    def __init__(self, size: int) -> None:
        self.status = np.full(size, -1, dtype=np.int8)
        self.reason = np.zeros(size, dtype=np.int32)
        self.encoded: tuple[bytes | None, bytes | None] = (None, None)

    def update(self, outcomes: Outcomes, keys: np.ndarray, texts: np.ndarray) -> tuple[bytes | None, bytes | None]:
        """The two maps as JSON (None when empty). ``keys``: each listed name as ``"name":``;
        ``texts``: each reason (by text id) as a JSON string."""
        if not np.array_equal(outcomes.status, self.status) or not np.array_equal(outcomes.reason, self.reason):
            self.encoded = (
                _map(outcomes, Status.UNSCHEDULABLE, keys, texts),
                _map(outcomes, Status.UNRESOLVABLE, keys, texts),
            )
            self.status = outcomes.status.copy()
            self.reason = outcomes.reason.copy()
        return self.encoded


def _map(outcomes: Outcomes, status: Status, keys: np.ndarray, texts: np.ndarray) -> bytes | None:
    at = np.flatnonzero(outcomes.status == status)
    if not len(at):
        return None
    return b"{" + b",".join((keys[at] + texts[outcomes.reason[at]]).tolist()) + b"}"


class Entries:
    """Per board position, the node's name and its encoded HostPriority (``wire.host_entry``),
    as arrays: a listing's names and prioritize template are gathered from them."""

    __slots__ = ("encoded", "keys", "layout", "names")

    def __init__(self, board: Board) -> None:
        names = board.names()
        self.layout = board.layout
        self.names = np.empty(len(names), dtype=object)
        self.names[:] = names
        self.encoded = np.empty(len(names), dtype=object)
        self.encoded[:] = [wire.host_entry(n) for n in names]
        self.keys = np.empty(len(names), dtype=object)
        self.keys[:] = [wire.dumps(n) + b":" for n in names]


class Answers:
    """The listings met lately, per slot (what filter got; what prioritize will most likely get)."""

    def __init__(self) -> None:
        self._slots: dict[str, Listing] = {}
        self._entries: Entries | None = None
        self._texts: tuple[Sequence[str] | None, np.ndarray] = (None, np.empty(0, dtype=object))
        self._order = NodeOrder()

    def texts(self, outcomes: Outcomes) -> np.ndarray:
        """The board's reasons (by text id) as JSON strings, encoded once each."""
        known, encoded = self._texts
        texts = outcomes.texts
        if known is not texts:  # the board started its table of reasons afresh
            encoded = np.empty(0, dtype=object)
        if len(encoded) < len(texts):
            more = np.empty(len(texts) - len(encoded), dtype=object)
            more[:] = [wire.dumps(t) for t in texts[len(encoded) :]]
            encoded = np.concatenate([encoded, more])
        self._texts = (texts, encoded)
        return encoded

    def entries(self, board: Board) -> Entries:
        """The board's :class:`Entries`, made again when its layout changes."""
        if self._entries is None or self._entries.layout != board.layout:
            self._entries = Entries(board)
        return self._entries

    def listing(self, names: Sequence[str], board: Board, slot: str, raw: bytes | None = None) -> Listing:
        """``names`` with their board positions, kept per ``slot`` while the same list comes again.
        ``raw``, the names' JSON array as it came, is given for filter's lists: kube-scheduler's
        order of the nodes is learned from them (:class:`NodeOrder`)."""
        last = self._slots.get(slot)
        if last is not None and last.layout == board.layout and (last.names is names or last.names == names):
            return last
        positions = self._order.match(raw, board) if raw is not None else None
        if positions is None:
            positions = board.positions(names)
            if raw is not None:
                self._order.learn(positions, board, self.entries(board))
        made = Listing(board.layout, names if isinstance(names, list) else list(names), positions)
        self._slots[slot] = made
        return made

    def expect(self, slot: str, listing: Listing) -> None:
        """``listing`` is what ``slot`` will most likely be asked about next."""
        self._slots[slot] = listing


def tally(outcomes: Outcomes) -> Mapping[str, int]:
    """How many listed nodes failed for each reason."""
    failing = outcomes.reason[outcomes.status != Status.FITS]
    if not len(failing):
        return {}
    # the reasons met, not every text the board knows (reasons name numbers: it knows many)
    ids, counts = np.unique(failing, return_counts=True)
    texts = outcomes.texts
    return {texts[r]: n for r, n in zip(ids.tolist(), counts.tolist(), strict=True)}
