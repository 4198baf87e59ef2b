"""The demo (``gpuslice demo``, ``gpuslice serve --demo``): play kube-scheduler for the pending
pods of the cluster file, over real HTTP against the service itself, and print where each
one went and why. Scores are what prioritize answers kube-scheduler: 0..10."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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
        return Outcome(key, "", None, f"fits nowhere ({nowhere(reasons)})")
    scores = client.prioritize(pod, passed)
    best = max(scores, key=lambda hp: (hp["Score"], -passed.index(hp["Host"])))
    error = client.bind(pod, best["Host"])
    if error:
        return Outcome(key, "", None, f"bind failed: {error}")
    node = client.get(f"/debug/nodes/{best['Host']}")
    shares: list[dict[str, Any]] = next((p["shares"] for p in node.get("pods", []) if p["pod"] == key), [])
    detail = ", ".join(_share(s) for s in shares) or "no GPU (CPU and memory only)"
    return Outcome(key, best["Host"], int(best["Score"]), detail)


SHOWN_REASONS = 3  # nodes named in a "fits nowhere" line; the rest are counted


def nowhere(reasons: Mapping[str, str]) -> str:
    """Why a pod fits nowhere: the first nodes' reasons, and how many more nodes refused it."""
    if not reasons:
        return "no node to try"
    named = sorted(reasons.items())
    shown = "; ".join(f"{n}: {r}" for n, r in named[:SHOWN_REASONS])
    more = len(named) - SHOWN_REASONS
    return shown + (f"; and {more} more" if more > 0 else "")


def runnable_name(argv0: str | None = None) -> str:
    """How to run this gpuslice again from the same shell: ``gpuslice`` when PATH finds this very
    script, else the script as it was started (``.venv/bin/gpuslice`` after the README's set-up,
    which puts nothing on PATH)."""
    started = argv0 if argv0 is not None else sys.argv[0]
    if Path(started).name != "gpuslice":
        return "gpuslice"  # started another way (python -m, a test): the plain name is all there is
    found = shutil.which("gpuslice")
    if found and Path(found).resolve() == Path(started).resolve():
        return "gpuslice"
    relative = os.path.relpath(os.path.abspath(started))
    if relative.startswith(".."):
        return os.path.abspath(started)
    return relative if os.sep in relative else f".{os.sep}{relative}"


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
