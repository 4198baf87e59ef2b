"""Crash safety: ``gpuslice serve`` SIGKILLed at every step of a bind, then started again.

The service runs as a subprocess against the fake API server of this process. Three binds
are frozen at once, each at another step (a fault delays the next API call of that bind):
just after the ledger's compare-and-set, just after the record patch (made only for a pod
that carries annotations of ours; otherwise the record travels in the Binding), just after
the Binding. The process is killed there; a new one starts. Expected: the state it rebuilds
from the API server equals the truth (nothing lost, nothing counted twice), what the
killed binds left is cleaned within stale_allocation_s + sweep_interval_s, and afterwards
every node takes exactly the shares it has room for.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from scheduler.core.errors import ConfigError
from scheduler.extender.config import load_config
from scheduler.kube.ledger import decode_entries, ledger_name

from .harness import (
    LEDGER_NAMESPACE,
    PREFIX,
    CountingApiServer,
    ServeProcess,
    audit,
    node_json,
    pod_json,
    shown_by_service,
    shown_by_state,
    truth_states,
    wait_for,
)

STALE_S = 2.0
SWEEP_S = 0.5
# Which bind freezes where: (pod, node, the call that hangs, its name, whether it takes effect first)
STEPS = (
    ("cas", "n1", ("create", "pods/binding"), "cas", False),  # ledger entry written; no Binding
    # a pod carrying an annotation of ours (LEFTOVER) is patched before its Binding:
    ("rec", "n2", ("create", "pods/binding"), "rec", False),  # record patched on the pod; no Binding
    ("bnd", "n3", ("create", "pods/binding"), "bnd", True),  # Binding done; its answer never came
)
LEFTOVER = {PREFIX + "bound-at": "2024-01-01T00:00:00Z"}  # forged, or left by an older version


def entries(api: CountingApiServer, node: str) -> dict[str, str]:
    cm = api.configmap(LEDGER_NAMESPACE, ledger_name(node))
    raw = (cm or {}).get("data", {}).get("ledger")
    return {key: e.phase for key, e in decode_entries(node, raw).items()}


def notes(api: CountingApiServer, name: str) -> dict[str, str]:
    live = api.pod("default", name)
    assert live is not None
    return {k.removeprefix(PREFIX): v for k, v in (live["metadata"].get("annotations") or {}).items()}


def test_sigkill_at_every_step_of_a_bind(api: CountingApiServer, tmp_path: Path) -> None:
    for name in ("n1", "n2", "n3"):  # one H100-80GB each, MPS; pods of 40 GiB: two per node
        api.put_node(node_json(name, gpus=1))
    pods = {}
    for name, *_ in STEPS:
        body = pod_json(name, gpu_memory="40Gi")
        if name == "rec":
            body["metadata"].setdefault("annotations", {}).update(LEFTOVER)
        pods[name] = api.put_pod(body)
    first = ServeProcess(tmp_path, api.url, "first", request_timeout_s=60, stale_allocation_s=3600)
    second = None
    try:
        first.wait_ready()
        for _, _, (verb, resource), name, applied in STEPS:
            api.fault(verb, resource, name=name, delay_s=300, status=503, apply=applied)
        results: dict[str, str] = {}

        def kube_scheduler(pod: str, node: str) -> None:
            try:
                first.client.filter(pods[pod], ["n1", "n2", "n3"])
                results[pod] = first.client.bind(pods[pod], node)
            except Exception as exc:  # the connection dies with the process
                results[pod] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=kube_scheduler, args=(pod, node)) for pod, node, *_ in STEPS]
        for thread in threads:
            thread.start()
        frozen = [("create", "pods/binding", pod) for pod in ("cas", "rec", "bnd")]
        wait_for(
            lambda: all(call in api.requests for call in frozen),
            "the three binds to freeze at their steps",
            timeout_s=30,
        )
        first.kill()
        for thread in threads:
            thread.join(timeout=20)
        assert all(results[pod].startswith("ServiceError") for pod, *_ in STEPS), results
        api.clear_faults()

        # What the killed process left: each step's half-done bind
        assert entries(api, "n1") == {"default/cas": "allocating"} and "allocation" not in notes(api, "cas")
        assert entries(api, "n2") == {"default/rec": "allocating"} and notes(api, "rec")["bind-phase"] == "allocating"
        assert entries(api, "n3") == {"default/bnd": "allocating"} and notes(api, "bnd")["bind-phase"] == "bound"
        assert [h.split(":")[0] for h in audit(api).half_written] == ["default/rec"]

        second = ServeProcess(
            tmp_path, api.url, "second", request_timeout_s=5, stale_allocation_s=STALE_S, sweep_interval_s=SWEEP_S
        )
        second.wait_ready()
        ready_at = time.monotonic()
        # The rebuilt state is the API server's truth: bnd counted once on n3, nothing on n1 and n2
        described = {n["name"]: n for n in second.client.get("/debug/nodes")["nodes"]}
        expected = {name: shown_by_state(state) for name, state in truth_states(api).items() if state}
        assert {name: shown_by_service(d) for name, d in described.items()} == expected
        assert expected["n3"] == (("default/bnd",), ((40960, 500, 1),))
        # What the killed binds left is gone within the stale interval plus one sweep
        # (+1 s: record timestamps have whole seconds; +2 s for a loaded machine)
        took = wait_for(
            lambda: audit(api).clean and entries(api, "n1") == {} and entries(api, "n2") == {},
            "the sweep to clean up",
            timeout_s=STALE_S + SWEEP_S + 3,
        )
        assert took <= STALE_S + SWEEP_S + 3
        assert entries(api, "n3") == {"default/bnd": "allocating"}  # kept: its pod is bound there
        assert "allocation" not in notes(api, "rec")
        print(f"cleaned {time.monotonic() - ready_at:.2f}s after the restart")

        # No share lost, none counted twice: kube-scheduler retries cas and rec, then fills the rest
        for pod, node in (("cas", "n1"), ("rec", "n2")):
            assert second.client.bind(pods[pod], node) == "", pod
        more = {name: api.put_pod(pod_json(name, gpu_memory="40Gi")) for name in ("x1", "x2", "x3", "y1", "y2", "y3")}
        outcomes = {}
        for name, pod in more.items():
            node = {"1": "n1", "2": "n2", "3": "n3"}[name[1]]
            second.client.filter(pod, [node])  # as kube-scheduler: the pod is known to the service from here
            outcomes[name] = second.client.bind(pod, node)
        assert [outcomes[x] for x in ("x1", "x2", "x3")] == ["", "", ""]  # each node's second half
        assert all("no share" in outcomes[y] for y in ("y1", "y2", "y3")), outcomes  # and then full
        final = audit(api)
        assert final.clean and final.shares_by_node == {"n1": 2, "n2": 2, "n3": 2}
        assert entries(api, "n3")["default/bnd"] == "bound"  # marked by n3's next write (x3's bind)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_the_cleanup_bound_is_configured_and_checked_at_start_up() -> None:
    config = load_config(env={}, flags={"kube": {"stale_allocation_s": 2, "sweep_interval_s": 0.5}})
    assert config.kube.options() == {"stale_allocation_s": 2, "sweep_interval_s": 0.5}
    with pytest.raises(ConfigError, match=r"kube\.sweep_interval_s 0: accepted: a number greater than 0"):
        load_config(env={}, flags={"kube": {"sweep_interval_s": 0}})
    with pytest.raises(ConfigError, match=r"kube\.stale: unknown key; accepted: namespace, request_timeout_s"):
        load_config(env={}, flags={"kube": {"stale": 1}})
