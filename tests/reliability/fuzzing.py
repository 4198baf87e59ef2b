"""Hostile input for every HTTP endpoint of the service, and the judge of each answer.

:func:`probes` is a hypothesis strategy of requests for one endpoint: random JSON, Go-shaped
bodies (kube-scheduler's ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs; the API
server's AdmissionReview) with a field mutated (wrong type, huge number, deep nesting,
deleted), annotations holding every kind of malformed quantity, bodies over the size cap
(sent, or only declared), invalid UTF-8, odd paths, methods and query strings.

:class:`FuzzTarget` sends one probe over real HTTP with a client timeout and judges the
answer: never a 5xx, never a hang, never a change of allocation state (the API server's
resourceVersion and the cache's node states before and after; a bind can only ever be
garbage here, since every pod of the fuzz cluster is already bound), never the catch-all
"internal error" reply, and a message whenever the request is refused.
"""

from __future__ import annotations

import copy
import http.client
import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import hypothesis.strategies as st

from scheduler.core.request import OUTPUT_KEYS, REQUEST_KEYS, SELECTOR_KEYS

from .harness import PREFIX, CountingApiServer, Replica, cache_view, node_json, pod_json

ENDPOINTS = ("filter", "prioritize", "bind", "preempt", "mutate", "validate", "debug", "metrics", "healthz", "readyz")
VERBS = ("filter", "prioritize", "bind", "preempt")
BODY_CAP = 64 * 1024  # the target's max_body_bytes: over-cap bodies stay cheap to send
WEBHOOK_CAP = 16 * 1024 * 1024  # scheduler.webhook.routes.MAX_BODY_BYTES
TIMEOUT_S = 10.0

# ---------------------------------------------------------------- strategies

MALFORMED = (
    "", " ", "-1", "-0", "0", "0.0", "1e309", "-1e309", "1e-400", "nan", "NaN", "inf", "-inf", "Infinity", "0x10",
    "1.5.5", "1..", ".", "1/2", "½", "١٢", "1_000", "+1", "1 ", " 1", "10Qi", "10gi", "10GB", "10 Gi", "Gi", "1Ki",
    "1e3Gi", "9" * 400, "0." + "0" * 300 + "1", "1e18", "18446744073709551617", "-9223372036854775809", "true",
    "null", "[]", "{}", "\x00", "1\n2", "0.5;rm -rf /", "%s%s%s", "${jndi:ldap://x}", "\ud7ff", "a" * 5000,
    "mig", "mps|", "|", "||", "any|mig|mps|time-slicing|exclusive|x", "7g.80gb", "7g.80gb.1", "0g.0gb",
    "99999999g.99999999gb", "1g.-10gb", "1c.10gb", "3g.40gb|1g.10gb", "binpack", "fgd", "random", "__init__",
)  # fmt: skip


def texts(min_size: int = 0, max_size: int = 20) -> st.SearchStrategy[str]:
    """Unicode text without lone surrogates (those are JSON that no decoder accepts; ``_invalid_utf8`` covers them)."""
    return st.text(st.characters(exclude_categories=("Cs",)), min_size=min_size, max_size=max_size)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | texts(max_size=20)
        | st.sampled_from(MALFORMED)
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(max_size=10), inner, max_size=4),
        max_leaves=max_leaves,
    )


VALID = ("0.5", "0.25", "1", "2", "20Gi", "20480", "30", "1g.10gb", "3g.40gb", "7g.80gb", "mps", "mig", "time-slicing",
         "exclusive", "any", "mps|time-slicing", "H100-80GB", "A100-80GB|L4", "binpack", "fgd", "spread")  # fmt: skip


def quantities() -> st.SearchStrategy[Any]:
    numeric = st.from_regex(
        r"[-+]?[0-9]{0,25}(\.[0-9]{0,8})?([eE][-+]?[0-9]{1,4})?(Ki|Mi|Gi|Ti|Pi|m|k|M|G|Qi)?", fullmatch=True
    )
    return st.one_of(
        st.sampled_from(VALID),
        st.sampled_from(MALFORMED),
        numeric,
        texts(max_size=30),
        st.integers(),
        st.floats(),
        json_values(4),
    )


ANNOTATION_KEYS = (
    *(PREFIX + k for k in (*REQUEST_KEYS, *SELECTOR_KEYS, *sorted(OUTPUT_KEYS))),
    PREFIX + "gpu-fractions",
    PREFIX,
    "GPUSLICE.IO/gpu-fraction",
    "nvidia.com/gpu",
)
RESOURCE_NAMES = (
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-7g.80gb",
    "nvidia.com/mig-x",
)


def annotations() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(ANNOTATION_KEYS) | texts(max_size=15), quantities(), max_size=5)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Go-shaped Pod with annotations and resources of every kind, valid or not."""
    pod = pod_json(draw(texts(min_size=1, max_size=12)), draw(st.sampled_from(["default", "team-a", ""])))
    pod["metadata"]["uid"] = draw(texts(max_size=12))
    pod["metadata"]["resourceVersion"] = draw(st.sampled_from(["1", "2", ""]))
    pod["metadata"]["annotations"] = draw(annotations())
    resources = draw(st.dictionaries(st.sampled_from(RESOURCE_NAMES), quantities(), max_size=3))
    section = draw(st.sampled_from(["requests", "limits"]))
    pod["spec"]["containers"][0]["resources"] = {section: resources}
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": dict(resources)}}]
    return pod


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """``base`` with one field replaced (random JSON, huge number, deep nesting, wrong type) or deleted."""
    obj = copy.deepcopy(draw(base))  # st.just values are shared between draws: never change them
    if not draw(st.integers(0, 3)):
        return obj  # unmutated: the well-formed case must hold too
    path = draw(st.sampled_from(_paths(obj)))
    if not path:
        return draw(json_values())
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    how = draw(st.sampled_from(["value", "huge", "deep", "delete", "null", "string"]))
    if how == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = {
            "value": lambda: draw(json_values()),
            "huge": lambda: draw(st.sampled_from([2**64, -(2**63) - 1, 10**30, 1e308, -1e308])),
            "deep": lambda: _nested(draw(st.integers(50, 800)), draw(json_values(2))),
            "null": lambda: None,
            "string": lambda: draw(texts(max_size=50)),
        }[how]()
    return obj


@dataclass(frozen=True)
class Context:
    """What the fuzz cluster holds, so Go-shaped bodies can name real nodes and pods."""

    nodes: tuple[str, ...]
    bound: tuple[tuple[str, str], ...]  # (pod name, node) of the pods bound in the fuzz cluster
    uids: tuple[str, ...]


def extender_args(ctx: Context) -> st.SearchStrategy[Any]:
    names = st.lists(st.sampled_from(ctx.nodes) | texts(max_size=20), max_size=8)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        pod = draw(pods())
        if draw(st.booleans()):
            return {"Pod": pod, "Nodes": None, "NodeNames": draw(names)}
        items = [node_json(n, gpus=draw(st.integers(0, 2))) for n in draw(names)]
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}

    return build()


def binding_args(ctx: Context) -> st.SearchStrategy[Any]:
    pod_names = st.sampled_from([p for p, _ in ctx.bound]) | texts(max_size=20)
    return st.fixed_dictionaries(
        {
            "PodName": pod_names,
            "PodNamespace": st.sampled_from(["default", "", "kube-system"]) | texts(max_size=10),
            "PodUID": st.sampled_from(ctx.uids) | texts(max_size=20),
            "Node": st.sampled_from(ctx.nodes) | texts(max_size=20),
        }
    )


def preemption_args(ctx: Context) -> st.SearchStrategy[Any]:
    victims = st.fixed_dictionaries(
        {
            "Pods": st.lists(st.fixed_dictionaries({"UID": st.sampled_from(ctx.uids) | texts(max_size=8)})),
            "NumPDBViolations": st.integers(-(2**40), 2**40),
        }
    )
    by_node = st.dictionaries(st.sampled_from(ctx.nodes) | texts(max_size=8), victims, max_size=3)
    return st.fixed_dictionaries(
        {"Pod": pods(), "NodeNameToVictims": st.none(), "NodeNameToMetaVictims": by_node | st.none()}
    )


def admission_reviews() -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["admission.k8s.io/v1"] * 5 + ["admission.k8s.io/v1beta1", "v1"]),
            "kind": st.just("AdmissionReview"),
            "request": st.fixed_dictionaries(
                {
                    "uid": st.uuids().map(str) | texts(max_size=12),
                    "kind": st.just({"group": "", "version": "v1", "kind": "Pod"}),
                    "resource": st.just({"group": "", "version": "v1", "resource": "pods"}),
                    "operation": st.sampled_from(["CREATE"] * 3 + ["UPDATE"] * 2 + ["DELETE", "CONNECT", "PATCH"]),
                    "namespace": texts(max_size=10),
                    "userInfo": st.fixed_dictionaries(
                        {"username": texts(max_size=20), "groups": st.lists(texts(max_size=15), max_size=3)}
                    ),
                    "object": pods(),
                    "oldObject": pods() | st.none(),
                }
            ),
        }
    )


@dataclass(frozen=True)
class Probe:
    endpoint: str
    method: str
    path: str
    body: bytes | None = None
    declared_length: int | None = None  # a Content-Length over the cap, with no body sent
    headers: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        body = "" if self.body is None else f" body[{len(self.body)}]={self.body[:160]!r}"
        declared = f" Content-Length: {self.declared_length}" if self.declared_length else ""
        return f"{self.method} {self.path[:100]}{declared}{body}"


def _bytes(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def _invalid_utf8(draw: st.DrawFn, body: st.SearchStrategy[bytes]) -> bytes:
    data = draw(body)
    at = draw(st.integers(0, len(data)))
    junk = draw(
        st.sampled_from(
            [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\x00", b'"\\ud800"']
        )
    )
    return data[:at] + junk + data[at:]


def probes(endpoint: str, ctx: Context, url_prefix: str = "") -> st.SearchStrategy[Probe]:
    """Requests for one endpoint."""
    if endpoint in VERBS or endpoint in ("mutate", "validate"):
        shaped = {
            "filter": extender_args(ctx),
            "prioritize": extender_args(ctx),
            "bind": binding_args(ctx),
            "preempt": preemption_args(ctx),
            "mutate": admission_reviews(),
            "validate": admission_reviews(),
        }[endpoint]
        path = f"{url_prefix}/{endpoint}" if endpoint in VERBS else f"/{endpoint}"
        cap = BODY_CAP if endpoint in VERBS else WEBHOOK_CAP
        go_shaped = mutated(shaped).map(_bytes)
        deep = st.integers(500, 100_000).map(lambda n: b"[" * n + b"]" * n)
        bodies = st.one_of(
            *[go_shaped] * 8,  # most bodies look like kube-scheduler's or the API server's
            json_values(30).map(_bytes),
            _invalid_utf8(go_shaped),
            deep,
            st.binary(max_size=200),
            st.just(b""),
            st.integers(cap + 1, cap + 4096).map(lambda n: b'{"Pod": "' + b"x" * n + b'"}'),
        )
        sent = st.builds(Probe, st.just(endpoint), st.just("POST"), st.just(path), bodies)
        declared = st.builds(
            Probe,
            st.just(endpoint),
            st.just("POST"),
            st.just(path),
            st.just(None),
            st.integers(cap + 1, 2**40),
        )
        wrong_method = st.builds(
            Probe, st.just(endpoint), st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]), st.just(path)
        )
        return st.one_of(sent, sent, sent, sent, sent, sent, declared, wrong_method)
    text = texts(max_size=40).map(lambda t: quote(t, safe="")) | st.sampled_from(
        ["%ff%fe", "%00", "..%2f..%2fetc%2fpasswd", "%e2%82", "%", "a%2", "..", ".", "nodes/", "%2e%2e"]
    )
    query = st.dictionaries(texts(max_size=8), texts(max_size=8), max_size=3).map(
        lambda q: "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in q.items()) if q else ""
    )
    if endpoint == "debug":
        paths = st.one_of(
            st.just("/debug/nodes"),
            st.sampled_from(ctx.nodes).map(lambda n: f"/debug/nodes/{n}"),
            text.map(lambda t: f"/debug/nodes/{t}"),
            text.map(lambda t: f"/debug/{t}"),
        )
    else:
        paths = st.just(f"/{endpoint}")
    methods = st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"])
    accept = st.sampled_from([(), (("Accept", "application/openmetrics-text; version=1.0.0"),), (("Accept", "*/*"),)])
    return st.builds(
        Probe,
        st.just(endpoint),
        methods,
        st.builds(lambda p, q: p + q, paths, query),
        st.one_of(st.none(), st.binary(max_size=100)),
        st.none(),
        accept,
    )


# ---------------------------------------------------------------- the target and the judge


def fuzz_cluster(api: CountingApiServer) -> list[tuple[str, dict[str, Any]]]:
    """Nodes in the four sharing modes and pods for them (to bind before fuzzing)."""
    api.put_node(node_json("mps-a", gpus=2, mode="mps"))
    api.put_node(node_json("ts-b", gpus=2, model="L4", mode="time-slicing", replicas=4))
    api.put_node(node_json("mig-c", gpus=1, mode="mig"))
    api.put_node(node_json("whole-d", gpus=2, mode="exclusive"))
    broken = node_json("broken-e")
    broken["metadata"]["annotations"][PREFIX + "inventory"] = "{not json"
    api.put_node(broken)
    plan = [
        ("mps-a", pod_json("s1", gpu_fraction="0.5")),
        ("mps-a", pod_json("s2", gpu_memory="10Gi", gpu_compute="20")),
        ("ts-b", pod_json("t1", gpu_fraction="0.25", sharing="time-slicing")),
        ("mig-c", pod_json("m1", mig_profile="3g.40gb")),
        ("whole-d", pod_json("w1", gpu_count="1")),
    ]
    for _, pod in plan:
        api.put_pod(pod)
    return plan


@dataclass
class Verdict:
    status: int = 0
    seconds: float = 0.0
    refused: bool = False  # answered with an error message (the request was not taken)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class EndpointStats:
    tried: int = 0
    refused: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0
    state_changes: int = 0
    hangs: int = 0
    internal_errors: int = 0
    unexplained: int = 0
    max_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def add(self, probe: Probe, verdict: Verdict) -> None:
        self.tried += 1
        self.refused += verdict.refused
        self.statuses[verdict.status] += 1
        self.max_seconds = max(self.max_seconds, verdict.seconds)
        for problem in verdict.problems:
            kind = problem.split(":", 1)[0]
            if kind == "5xx":
                self.server_errors += 1
            elif kind == "state changed":
                self.state_changes += 1
            elif kind == "hang":
                self.hangs += 1
            elif kind == "internal error":
                self.internal_errors += 1
            else:
                self.unexplained += 1
        if verdict.problems and len(self.failures) < 5:
            self.failures.append(f"{'; '.join(verdict.problems)} <- {probe.describe()}")


class FuzzTarget:
    """A replica over a fuzz cluster whose every pod is bound, and the judge of each answer."""

    def __init__(self, api: CountingApiServer, make_replica: Callable[..., Replica]) -> None:
        self.api = api
        plan = fuzz_cluster(api)
        self.replica = make_replica(serve={"max_body_bytes": BODY_CAP})
        self.nodes = tuple(sorted(n["metadata"]["name"] for n in api.nodes()))
        client = self.replica.client
        for node, pod in plan:
            key = f"default/{pod['metadata']['name']}"
            deadline = time.monotonic() + 10
            while key not in self.replica.extender.cache.pods and time.monotonic() < deadline:
                time.sleep(0.01)
            client.filter(pod, [node])
            error = client.bind(pod, node)
            if error:
                raise AssertionError(f"fuzz cluster: binding {key} to {node}: {error}")
        self.context = Context(
            self.nodes,
            tuple((p["metadata"]["name"], node) for node, p in plan),
            tuple(p["metadata"]["uid"] for _, p in plan),
        )
        host, port = self.replica.url.removeprefix("http://").split(":")
        self._address = (host, int(port))
        self._conn: http.client.HTTPConnection | None = None
        self.stats: dict[str, EndpointStats] = {e: EndpointStats() for e in ENDPOINTS}

    def state(self) -> tuple[int, Any]:
        return self.api.resource_version, cache_view(self.replica.extender, self.nodes)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    # ------------------------------------------------------------ sending

    def _send(self, probe: Probe) -> tuple[int, Mapping[str, str], bytes]:
        if probe.declared_length is not None:
            return self._send_raw(probe)
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(*self._address, timeout=TIMEOUT_S)
            try:
                headers = dict(probe.headers)
                if probe.body is not None:
                    headers.setdefault("Content-Type", "application/json")
                self._conn.request(probe.method, probe.path, body=probe.body, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self._conn.close()
                    self._conn = None
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _send_raw(self, probe: Probe) -> tuple[int, Mapping[str, str], bytes]:
        """A request that declares a body over the cap and sends none: it must be answered at once."""
        with socket.create_connection(self._address, timeout=TIMEOUT_S) as sock:
            head = (
                f"{probe.method} {probe.path} HTTP/1.1\r\nHost: gpuslice\r\nContent-Type: application/json\r\n"
                f"Content-Length: {probe.declared_length}\r\n\r\n"
            )
            sock.sendall(head.encode())
            response = http.client.HTTPResponse(sock, method=probe.method)
            response.begin()
            data = response.read(1 << 20) if response.length is None else response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    # ------------------------------------------------------------ judging

    def check(self, probe: Probe) -> Verdict:
        before = self.state()
        verdict = Verdict()
        started = time.perf_counter()
        try:
            status, headers, data = self._send(probe)
        except TimeoutError as exc:
            verdict.seconds = time.perf_counter() - started
            verdict.problems.append(f"hang: no answer within {TIMEOUT_S:g}s ({exc})")
            self.close()
            self._conn = None
            self.stats[probe.endpoint].add(probe, verdict)
            return verdict
        except OSError as exc:
            verdict.problems.append(f"5xx: connection failed: {type(exc).__name__}: {exc}")
            self._conn = None
            self.stats[probe.endpoint].add(probe, verdict)
            return verdict
        verdict.seconds = time.perf_counter() - started
        verdict.status = status
        if status >= 500:
            verdict.problems.append(f"5xx: HTTP {status}: {data[:200]!r}")
        after = self.state()
        if after != before:
            verdict.problems.append(
                f"state changed: resourceVersion {before[0]} -> {after[0]}, cache equal {before[1] == after[1]}"
            )
        verdict.refused = status >= 400 or "x-gpuslice-error" in headers or b'"allowed":false' in data
        verdict.problems.extend(self._explained(probe, status, headers, data))
        self.stats[probe.endpoint].add(probe, verdict)
        return verdict

    def _explained(self, probe: Probe, status: int, headers: Mapping[str, str], data: bytes) -> list[str]:
        """A refusal must say what was wrong; the catch-all reply (a bug caught) is a failure."""
        text = data.decode("utf-8", "replace")
        if "internal error in gpuslice" in text or "internal error in the gpuslice webhook" in text:
            return [f"internal error: {text[:300]}"]
        if probe.method == "HEAD" or status >= 500:
            return []
        if status in (404, 405, 422, 400) and probe.endpoint not in ("mutate", "validate"):
            return [] if text.strip() else [f"no message: HTTP {status} with an empty body"]
        if probe.endpoint in VERBS and status == 200 and probe.method == "POST":
            header = headers.get("x-gpuslice-error", "")
            reply = json.loads(data)
            error = reply.get("Error", "") if isinstance(reply, dict) else ""
            if probe.endpoint in ("filter", "bind") and header and header[:100] != _header(error)[:100]:
                return [f"no message: header {header[:80]!r} but Error {error[:80]!r}"]
            if probe.endpoint == "bind" and not error and not self._legit_bind(probe):
                return [f"no message: a garbage bind answered no Error: {text[:200]}"]
            return []
        if probe.endpoint in ("mutate", "validate") and probe.method == "POST" and status in (200, 400):
            response = json.loads(data).get("response") or {}
            message = (response.get("status") or {}).get("message", "")
            if not response.get("allowed") and not message:
                return ["no message: denied without a status message"]
            if status == 400 and response.get("allowed"):
                return ["no message: a 400 that allows"]
        return []

    def _legit_bind(self, probe: Probe) -> bool:
        """Whether the bind names a pod of the fuzz cluster and the node it is already bound to."""
        try:
            args = json.loads(probe.body or b"")
        except ValueError:
            return False
        if not isinstance(args, dict):
            return False
        lowered = {str(k).lower(): v for k, v in args.items()}
        return (lowered.get("podname"), lowered.get("node")) in self.context.bound


def _header(text: str) -> str:
    return text.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")


def totals(stats: Mapping[str, EndpointStats]) -> EndpointStats:
    out = EndpointStats()
    for s in stats.values():
        out.tried += s.tried
        out.refused += s.refused
        out.statuses.update(s.statuses)
        out.server_errors += s.server_errors
        out.state_changes += s.state_changes
        out.hangs += s.hangs
        out.internal_errors += s.internal_errors
        out.unexplained += s.unexplained
        out.max_seconds = max(out.max_seconds, s.max_seconds)
    return out


def table(stats: Mapping[str, EndpointStats]) -> str:
    rows = [
        (
            "endpoint",
            "bodies",
            "refused",
            "statuses",
            "5xx",
            "state changes",
            "hangs",
            "internal",
            "unexplained",
            "max s",
        )
    ]
    for name, s in [*stats.items(), ("total", totals(stats))]:
        codes = " ".join(f"{code}x{n}" for code, n in sorted(s.statuses.items()))
        rows.append(
            (
                name,
                str(s.tried),
                str(s.refused),
                codes,
                str(s.server_errors),
                str(s.state_changes),
                str(s.hangs),
                str(s.internal_errors),
                str(s.unexplained),
                f"{s.max_seconds:.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def failures(stats: Mapping[str, EndpointStats]) -> Sequence[str]:
    return [f"{name}: {f}" for name, s in stats.items() for f in s.failures]
