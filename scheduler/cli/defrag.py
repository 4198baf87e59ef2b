"""``gpuslice defrag``: a defragmentation plan for a cluster file or the live cluster, and with
``--apply`` its evictions, wired here: the extender face's cache and planner report, fed by a
cluster file (``scheduler.filebackend``) or a list of the live cluster (``scheduler.kube``),
whose Eviction API calls carry out the plan."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scheduler.core.errors import GpusliceError, UsageError

from . import _options as opt
from ._app import command

if TYPE_CHECKING:
    from scheduler.core.defrag import Plan
    from scheduler.extender.cache import ClusterCache
    from scheduler.kube import Evictor


MAX_EVICTIONS = 1000  # as defrag.max_evictions accepts


class Unreachable(GpusliceError):
    """The live cluster did not answer the lists a plan starts from."""

    exit_code = 1


def settings_with(config: Any, namespaces: list[str] | None, max_evictions: int | None) -> Any:
    """The config's defrag settings with the command line's namespaces added and its budget
    (both checked by the caller)."""
    from scheduler.extender.config import DefragSettings

    given = config.defrag.model_dump()
    given["namespaces"] = [*given["namespaces"], *(namespaces or [])]
    if max_evictions is not None:
        given["max_evictions"] = max_evictions
    return DefragSettings.model_validate(given)


def check_options(
    cluster_file: str | None,
    config_file: Path | None,
    namespaces: list[str] | None,
    max_evictions: str | None,
    apply: bool,
    kubeconfig: str | None,
    api_url: str | None,
) -> int | None:
    """Every option checked before anything is read (one line naming the option, the value and
    what is accepted); the budget given, if any."""
    from scheduler.extender.config import NAMESPACE, NAMESPACE_ACCEPTED

    if apply and cluster_file is not None:
        raise UsageError("--apply evicts pods of the live cluster; --cluster-file is a snapshot: give one or the other")
    for option, given in (("--kubeconfig", kubeconfig), ("--api-url", api_url)):
        if given is not None and cluster_file is not None:
            raise UsageError(f"{option} with --cluster-file: a cluster file needs no cluster; give one of them")
    if kubeconfig is not None and api_url is not None:
        raise UsageError("--kubeconfig with --api-url: both name the cluster; give one of them")
    if kubeconfig is not None:
        opt.readable_file("--kubeconfig", Path(kubeconfig))
    if config_file is not None:
        opt.readable_file("--config", config_file)
    if cluster_file is not None:
        opt.cluster_file("--cluster-file", Path(cluster_file))
    for name in namespaces or []:
        if not NAMESPACE.fullmatch(name):
            raise UsageError(f"--namespace {name!r}: accepted: {NAMESPACE_ACCEPTED}")
    if max_evictions is None:
        return None
    return opt.whole("--max-evictions", max_evictions, 0, MAX_EVICTIONS)


def apply_plan(
    found: Plan, cache: ClusterCache, evictor: Evictor, say: Callable[[str], None] = print
) -> list[dict[str, str]]:
    """Evict the plan's pods, one move at a time: each move's evictions are first checked with
    a dry run (PodDisruptionBudgets included), so that a move is carried out whole or not at
    all; the first refusal stops the run. Returns what happened, pod by pod."""
    from scheduler.kube import Outcome

    done: list[dict[str, str]] = []
    for number, move in enumerate(found.moves, start=1):
        with cache.lock:
            uids = {key: (cache.pods[key].uid if key in cache.pods else "") for key in move.evict}
        for key in move.evict:
            check = evictor.evict(key, uids[key], dry_run=True)
            if check.outcome is Outcome.REFUSED:
                done.append({"move": str(number), "pod": key, "outcome": "refused", "message": check.message})
                say(f"stopped at move {number}: evicting {key} is refused: {check.message}")
                return done
        for key in move.evict:
            result = evictor.evict(key, uids[key])
            done.append({"move": str(number), "pod": key, "outcome": result.outcome.value, "message": result.message})
            if result.outcome is Outcome.REFUSED:
                say(f"stopped at move {number}: evicting {key} is refused: {result.message}")
                return done
            say(f"move {number}: {key} {result.outcome.value}" + (f" ({result.message})" if result.message else ""))
    return done


@command("defrag")
def defrag(
    cluster_file: Annotated[
        str | None,
        typer.Option(
            help="Plan for a Kubernetes v1 List of nodes and pods (kubectl get nodes,pods -A -o yaml) "
            "instead of the live cluster; 'example' for the embedded example cluster, 'example-defrag' for a "
            "fragmented one."
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="The service's settings (gpuslice.yaml): policy, prefix, defrag section."),
    ] = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="A namespace whose controller-owned pods may move (repeatable; added to defrag.namespaces).",
        ),
    ] = None,
    max_evictions: Annotated[
        str | None, typer.Option(metavar="N", help=f"Pods evicted at most (default 8; 0 to {MAX_EVICTIONS}).")
    ] = None,
    policy: Annotated[
        str | None, typer.Option(help="The placement policy the cluster runs (default: the config's, fgd-reserve).")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Evict the plan's pods through the Eviction API, one move at a time; stop at the first "
            "refusal of a PodDisruptionBudget. Live cluster only.",
        ),
    ] = False,
    kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig (default: in-cluster, then ~/.kube).")] = None,
    api_url: Annotated[str | None, typer.Option(help="An API server URL, reached without credentials.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Plan defragmentation moves: which pods to evict so that pending pods fit (or fragmentation falls)."""
    from scheduler.extender.cache import ClusterCache
    from scheduler.extender.config import PLANNING_FIELDS, load_config
    from scheduler.extender.defrag import plan_cluster, plan_json, plan_lines

    budget = check_options(cluster_file, config_file, namespace, max_evictions, apply, kubeconfig, api_url)
    config = load_config(config_file, os.environ, {"policy": policy}, only=PLANNING_FIELDS)
    settings = settings_with(config, namespace, budget)
    cache = ClusterCache(config.prefix, (config.mps_compute_oversub_pct, config.ts_memory_oversub_pct))
    evictor = None
    if cluster_file is not None:
        from scheduler.filebackend import FileBackend, resolve_cluster_file

        FileBackend(resolve_cluster_file(cluster_file), config.prefix).start(cache.on_change)
    else:
        from scheduler.kube import Evictor, KubeConfigError, KubeError

        evictor = Evictor.connect(kubeconfig, api_url, prefix=config.prefix, **config.kube.options())
        cache.uses_ledgers = evictor.keeps_ledgers
        try:
            evictor.snapshot(cache.on_change)
        except KubeError as exc:
            if isinstance(exc, KubeConfigError):
                raise
            raise Unreachable(f"cannot reach the cluster: {exc}") from exc
    options = settings.options()
    found, inputs = plan_cluster(cache, config, settings.namespaces, options)
    if json_output:
        out = plan_json(found, inputs, settings.namespaces, options)
        if apply:
            assert evictor is not None
            out["applied"] = apply_plan(found, cache, evictor, say=lambda _: None)
        print(json.dumps(out, indent=2))
        return
    for line in plan_lines(found, inputs, settings.namespaces):
        print(line)
    if apply:
        assert evictor is not None
        apply_plan(found, cache, evictor)
    elif found.moves:
        print("(a plan only: --apply evicts)")


__all__ = ["apply_plan", "check_options", "defrag", "settings_with"]
