"""The extender wire protocol (k8s.io/kube-scheduler/extender/v1), as plain JSON.

Envelope keys are Go field names (PascalCase); Go matches them case-insensitively when
decoding, and so do we. The Pod and Node inside stay ordinary dicts, so fields newer
than any client library pass through untouched. Every reply key is always present,
``null`` when empty, as Go's encoder writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import numpy as np
import orjson

MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority


def go_safe(message: str) -> str:
    """``message`` as kube-scheduler shows it right: it turns an extender's ``Error`` into an
    error with ``fmt.Errorf(result.Error)``, where a ``%`` starts a verb
    (``needs 50%!c(MISSING)ompute``). A ``%`` becomes the full-width ``％``, which reads the
    same and which no Go format string eats."""
    return message.replace("%", "\uff05")


class WireError(ValueError):
    """A request body that is not what kube-scheduler sends; the message says what was wrong."""


def loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as bad:  # orjson calls every such body "surrogates not allowed"
            raise WireError(
                f"request body is not UTF-8: byte 0x{body[bad.start]:02x} at offset {bad.start} ({bad.reason}); "
                "accepted: JSON in UTF-8"
            ) from exc
        raise WireError(f"request body is not JSON: {exc}") from exc


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]``, matched case-insensitively like Go's encoding/json; None if absent."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lower:
            return value
    return None


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WireError(f"{what} must be a JSON object, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )


def node_name(node: object, where: str) -> str:
    meta = _object(node, where).get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise WireError(f"{where} has no metadata.name")
    return name


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize input. ``nodes`` is set when full Nodes came (nodeCacheCapable false);
    ``names_raw`` is the NodeNames array as its bytes came, where the body was read by splitting
    it off (see :func:`parse_args`)."""

    pod: Mapping[str, Any]
    names: Sequence[str]
    nodes: Sequence[Mapping[str, Any]] | None = None
    names_raw: bytes | None = None


class KnownLists(Protocol):
    """NodeNames arrays met lately (:class:`scheduler.extender.answers.NameLists`)."""

    def find(self, raw: bytes) -> list[str] | None: ...

    def remember(self, raw: bytes, names: list[str]) -> None: ...


_NODE_NAMES_KEY = b'"NodeNames":'


def _split_names(body: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The envelope without NodeNames, decoded, and NodeNames' array as raw bytes, when the
    body ends with the NodeNames member as Go's encoder writes ExtenderArgs; else None.

    The split is exact: the part before the last ``,"NodeNames":`` plus ``}`` must decode
    as one JSON object, which it can only do when the split falls between two of the
    envelope's own members (never inside a string or a nested object).
    """
    at = body.rfind(_NODE_NAMES_KEY)
    if at < 0:
        return None
    head = body[:at].rstrip()
    tail = body[at + len(_NODE_NAMES_KEY) :].rstrip()
    if not head.endswith(b",") or not tail.endswith(b"}"):
        return None
    raw = tail[:-1].strip()
    if not raw.startswith(b"["):  # null, or not Go's shape: the full decoding says what it is
        return None
    head = head[:-1]
    if head.rstrip().endswith(b"{"):  # '{,"NodeNames":...' is not JSON
        return None
    try:
        top = orjson.loads(head + b"}")
    except orjson.JSONDecodeError:
        return None
    # A NodeNames (any case) before the split would lose to this one in the full decoding too.
    if not isinstance(top, dict) or field(top, "Nodes") is not None:  # full Nodes win over NodeNames
        return None
    return top, raw


def parse_args(body: bytes, known: KnownLists | None = None) -> ExtenderArgs:
    """ExtenderArgs from a request body; NodeNames arrays met lately (``known``) are not decoded again."""
    if known is not None and (split := _split_names(body)) is not None:
        envelope, raw = split
        names = known.find(raw)
        if names is None:
            try:
                decoded = orjson.loads(raw)
            except orjson.JSONDecodeError:
                decoded = None
            if _strings(decoded):
                names = decoded
                known.remember(raw, names)
        if names is not None:
            return ExtenderArgs(_pod(envelope), names, names_raw=raw)
    top = _object(loads(body), "ExtenderArgs")
    pod = _pod(top)
    node_list = field(top, "Nodes")
    if node_list is not None:
        items = field(_object(node_list, "ExtenderArgs.Nodes"), "items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError(f"ExtenderArgs.Nodes.items must be an array, got {_kind(items)}")
        names = [node_name(item, f"ExtenderArgs.Nodes.items[{i}]") for i, item in enumerate(items)]
        return ExtenderArgs(pod, names, items)
    raw_names = field(top, "NodeNames")
    if raw_names is None:
        return ExtenderArgs(pod, [])
    if not _strings(raw_names):
        raise WireError("ExtenderArgs.NodeNames must be an array of strings")
    return ExtenderArgs(pod, raw_names)


def _pod(top: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = field(top, "Pod")
    if pod is None:
        raise WireError("ExtenderArgs.Pod is missing")
    return _object(pod, "ExtenderArgs.Pod")


def _strings(value: object) -> TypeGuard[list[str]]:
    if not isinstance(value, list):
        return False
    try:
        "".join(value)  # the quickest check that every item is a string: twice as fast as looking at each type
    except TypeError:
        return False
    return True


def filter_result(
    args: ExtenderArgs | None,
    passed: Sequence[int] = (),
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
    passed_names: list[str] | None = None,
    unresolvable_json: bytes | None = None,
    names_json: bytes | None = None,
    failed_json: bytes | None = None,
) -> bytes:
    """ExtenderFilterResult; ``passed`` are positions in ``args.names`` (``passed_names`` their
    names, if at hand; ``names_json`` those names already encoded). Full Nodes in, Nodes out.
    ``unresolvable_json`` and ``failed_json``, if given, are the FailedAndUnresolvableNodes and
    FailedNodes maps already encoded (``unresolvable`` and ``failed`` are then ignored)."""
    nodes = b"null"
    names = b"null"
    if args is not None:
        if args.nodes is not None:
            try:
                nodes = orjson.dumps({"metadata": {}, "items": [args.nodes[i] for i in passed]})
            except orjson.JSONEncodeError as exc:  # the Nodes are echoed back: one may nest deeper than can be encoded
                raise WireError(
                    f"ExtenderArgs.Nodes cannot be sent back: {exc}; accepted: Nodes as the API server serves them"
                ) from exc
        elif names_json is not None:
            names = names_json
        else:
            names = orjson.dumps(passed_names if passed_names is not None else [args.names[i] for i in passed])
    if unresolvable_json is None:
        unresolvable_json = orjson.dumps(dict(unresolvable) if unresolvable else None)
    return b"".join(
        (
            b'{"Nodes":',
            nodes,
            b',"NodeNames":',
            names,
            b',"FailedNodes":',
            failed_json if failed_json is not None else orjson.dumps(dict(failed) if failed else None),
            b',"FailedAndUnresolvableNodes":',
            unresolvable_json,
            b',"Error":',
            orjson.dumps(go_safe(error)),
            b"}",
        )
    )


def host_priorities(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """HostPriorityList: the top-level array ``[{"Host", "Score"}]``."""
    return orjson.dumps([{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)])


def host_entry(name: str) -> bytes:
    """One HostPriority with two bytes left for its score (see :class:`HostPriorities`)."""
    return b'{"Host":' + orjson.dumps(name) + b',"Score":  }'


_TENS = np.array([ord(" ")] * 10 + [ord("1")], dtype=np.uint8)
_ONES = np.array([ord("0") + s % 10 for s in range(MAX_PRIORITY + 1)], dtype=np.uint8)


class HostPriorities:
    """The HostPriorityList of one list of hosts, encoded once; each answer then only writes
    the scores into a copy, two bytes each: ``" 7"`` or ``"10"`` (JSON allows the space).

    Building 5,000 ``{"Host", "Score"}`` objects per answer took longer than scoring them.
    """

    __slots__ = ("_buffer", "_ones", "_tens")

    def __init__(self, entries: Sequence[bytes]) -> None:
        """``entries`` as :func:`host_entry` makes them, in answer order."""
        self._buffer = np.frombuffer(b"[" + b",".join(entries) + b"]", dtype=np.uint8)
        lengths = np.fromiter(map(len, entries), dtype=np.int64, count=len(entries))
        # entry i ends, just before its "," or the closing "]", at sum(len + 1) over entries 0..i
        self._tens = np.cumsum(lengths + 1) - 3
        self._ones = self._tens + 1

    def __len__(self) -> int:
        return len(self._tens)

    def encode(self, scores: np.ndarray) -> bytes:
        """The answer for integer ``scores`` (0..MAX_PRIORITY), one per host in entry order."""
        if len(scores) != len(self._tens):
            raise ValueError(f"{len(scores)} scores for {len(self._tens)} hosts")
        if len(scores) and (scores.min() < 0 or scores.max() > MAX_PRIORITY):
            raise ValueError(f"scores must be 0..{MAX_PRIORITY}")
        out = self._buffer.copy()
        out[self._tens] = _TENS[scores]
        out[self._ones] = _ONES[scores]
        return out.tobytes()


@dataclass(frozen=True, slots=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str


def parse_binding(body: bytes) -> BindingArgs:
    top = _object(loads(body), "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = field(top, key)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise WireError(f"ExtenderBindingArgs.{key} must be a string, got {_kind(value)}")
        values[key] = value
    for key in ("PodName", "Node"):
        if not values[key]:
            raise WireError(f"ExtenderBindingArgs.{key} is missing or empty")
    return BindingArgs(values["PodName"], values["PodNamespace"] or "default", values["PodUID"], values["Node"])


def binding_result(error: str = "") -> bytes:
    return orjson.dumps({"Error": go_safe(error)})


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """kube-scheduler's proposal for one node: the victims' UIDs, in its order, the number of
    PodDisruptionBudget violations it counted among them (not which ones), and the victims'
    ``spec.priority`` where full pods came (None for each with NodeNameToMetaVictims, or where
    a pod states none)."""

    uids: tuple[str, ...]
    pdb_violations: int
    priorities: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    victims: Mapping[str, NodeVictims]  # node -> kube-scheduler's proposal there
    meta: bool  # True when NodeNameToMetaVictims came (nodeCacheCapable); the answer's form is the same


def _priority(pod: Mapping[str, Any], where: str) -> int | None:
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}.spec.priority must be an integer, got {_kind(value)}")
    return value


def _victims(value: object, where: str, full: bool) -> NodeVictims:
    obj = _object(value, where)
    pods = field(obj, "Pods") or []
    if not isinstance(pods, list):
        raise WireError(f"{where}.Pods must be an array")
    uids: list[str] = []
    priorities: list[int | None] = []
    for i, pod in enumerate(pods):
        item = _object(pod, f"{where}.Pods[{i}]")
        if full:
            meta = item.get("metadata")
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            priorities.append(_priority(item, f"{where}.Pods[{i}]"))
        else:
            uid = field(item, "UID")
            priorities.append(None)
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}.Pods[{i}] has no UID")
        uids.append(uid)
    violations = field(obj, "NumPDBViolations") or 0
    if isinstance(violations, bool) or not isinstance(violations, int) or violations < 0:
        raise WireError(f"{where}.NumPDBViolations must be a non-negative integer")
    return NodeVictims(tuple(uids), violations, tuple(priorities))


def parse_preemption(body: bytes) -> PreemptionArgs:
    """ExtenderPreemptionArgs: NodeNameToMetaVictims (victims as UIDs, with nodeCacheCapable)
    when present, else NodeNameToVictims (full pods)."""
    top = _object(loads(body), "ExtenderPreemptionArgs")
    pod = field(top, "Pod")
    if pod is None:
        raise WireError("ExtenderPreemptionArgs.Pod is missing")
    pod = _object(pod, "ExtenderPreemptionArgs.Pod")
    meta = field(top, "NodeNameToMetaVictims")
    full = field(top, "NodeNameToVictims")
    chosen, is_meta = (meta, True) if meta is not None else (full, False)
    victims: dict[str, NodeVictims] = {}
    if chosen is not None:
        for node, value in _object(chosen, "ExtenderPreemptionArgs victims map").items():
            where = f"NodeNameTo{'Meta' if is_meta else ''}Victims[{node}]"
            victims[node] = _victims(value, where, not is_meta) if value is not None else NodeVictims((), 0, ())
    return PreemptionArgs(pod, victims, is_meta)


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> bytes:
    """ExtenderPreemptionResult: kube-scheduler reads only NodeNameToMetaVictims, in both forms of
    the call, and maps each UID back to a pod on that node (a UID it did not send fails the call)."""
    return orjson.dumps(
        {
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": n} for node, (uids, n) in victims.items()
            }
            or None
        }
    )
