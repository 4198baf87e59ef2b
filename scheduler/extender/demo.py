"""``gpuslice serve --demo``: play kube-scheduler for the pending pods of the cluster file,
over real HTTP against the service itself, and print where each one went and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from .client import ExtenderClient


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    node: str  # "" if it was not bound
    detail: str  # the share it got, or why not


def schedule(client: ExtenderClient, pod: Mapping[str, Any], names: Sequence[str], prefix: str) -> Outcome:
    """filter -> prioritize on the survivors -> the top score -> bind, as kube-scheduler does."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    result = client.filter(pod, names)
    if result.get("Error"):
        return Outcome(key, "", f"filter error: {result['Error']}")
    passed = result.get("NodeNames") or []
    if not passed:
        reasons = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
        shown = "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())[:3])
        return Outcome(key, "", f"fits nowhere ({shown})")
    scores = client.prioritize(pod, passed)
    best = max(scores, key=lambda hp: (hp["Score"], -passed.index(hp["Host"])))
    error = client.bind(pod, best["Host"])
    if error:
        return Outcome(key, "", f"bind failed: {error}")
    node = client.get(f"/debug/nodes/{best['Host']}")
    shares: list[dict[str, Any]] = next((p["shares"] for p in node.get("pods", []) if p["pod"] == key), [])
    detail = ", ".join(_share(s) for s in shares) or "no GPU (CPU and memory only)"
    return Outcome(key, best["Host"], f"score {best['Score']}/10; {detail}")


def _share(share: Mapping[str, Any]) -> str:
    if share.get("mig"):
        return f"GPU {share['index']} MIG {share['mig']}"
    return f"GPU {share['index']} {share['mode']} {share['memoryMiB']} MiB {share['computeMilli'] / 10:g}%"


def play(client: ExtenderClient, pods: Sequence[Mapping[str, Any]], names: Sequence[str], prefix: str) -> list[Outcome]:
    return [schedule(client, pod, names, prefix) for pod in pods]


def show(outcomes: Sequence[Outcome], console: Console | None = None) -> None:
    table = Table(title="gpuslice demo: pending pods through filter -> prioritize -> bind")
    table.add_column("pod")
    table.add_column("node")
    table.add_column("share / reason")
    for o in outcomes:
        table.add_row(o.pod, o.node or "[red]not scheduled[/red]", o.detail)
    (console or Console()).print(table)
