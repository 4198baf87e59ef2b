"""The demo (``gpuslice demo``, ``gpuslice serve --demo``): play kube-scheduler for the pending
pods of the cluster file, over real HTTP against the service itself, and print where each
one went and why. Scores are what prioritize answers kube-scheduler: 0..10."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .client import ExtenderClient
from .columns import table
from .wire import MAX_PRIORITY


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    node: str  # "" if it was not bound
    score: int | None  # prioritize's score of the node it went to (0..10)
    detail: str  # the share it got, or why not


def schedule(client: ExtenderClient, pod: Mapping[str, Any], names: Sequence[str]) -> Outcome:
    """filter -> prioritize on the survivors -> the top score -> bind, as kube-scheduler does."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    result = client.filter(pod, names)
    if result.get("Error"):
        return Outcome(key, "", None, f"filter error: {result['Error']}")
    passed = result.get("NodeNames") or []
    if not passed:
        reasons = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
        shown = "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())[:3])
        return Outcome(key, "", None, f"fits nowhere ({shown})")
    scores = client.prioritize(pod, passed)
    best = max(scores, key=lambda hp: (hp["Score"], -passed.index(hp["Host"])))
    error = client.bind(pod, best["Host"])
    if error:
        return Outcome(key, "", None, f"bind failed: {error}")
    node = client.get(f"/debug/nodes/{best['Host']}")
    shares: list[dict[str, Any]] = next((p["shares"] for p in node.get("pods", []) if p["pod"] == key), [])
    detail = ", ".join(_share(s) for s in shares) or "no GPU (CPU and memory only)"
    return Outcome(key, best["Host"], int(best["Score"]), detail)


def _share(share: Mapping[str, Any]) -> str:
    if share.get("mig"):
        return f"GPU {share['index']} MIG {share['mig']}"
    return f"GPU {share['index']} {share['mode']} {share['memoryMiB']} MiB {share['computeMilli'] / 10:g}%"


def play(client: ExtenderClient, pods: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list[Outcome]:
    return [schedule(client, pod, names) for pod in pods]


def show(outcomes: Sequence[Outcome], policy: str) -> str:
    """The outcomes as a table under a title line."""
    rows = [
        [
            o.pod,
            o.node or "not scheduled",
            "-" if o.score is None else f"{o.score}/{MAX_PRIORITY}",
            o.detail,
        ]
        for o in outcomes
    ]
    title = f"gpuslice demo: {len(outcomes)} pending pods through filter -> prioritize -> bind, policy {policy}"
    return title + "\n\n" + table(["POD", "NODE", "SCORE", "SHARE / REASON"], rows)
