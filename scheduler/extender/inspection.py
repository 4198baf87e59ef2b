"""``gpuslice inspect``: ask the running service what it sees and print it, the way kubectl
prints (``-o wide|json|yaml``; by default a short table that fits 80 columns).

Only the client and the text are loaded: no web framework, no numpy, so it answers at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .client import ExtenderClient
from .columns import table

OUTPUTS = ("table", "wide", "json", "yaml")
COLUMNS = ("NODE", "GPU", "MODE", "MEMORY-MIB", "FREE-MIB", "COMPUTE", "PODS")
WIDE = ("NODE", "GPU", "UUID", "MODEL", "MODE", "MEMORY-MIB", "FREE-MIB", "COMPUTE", "DETAIL", "PODS")


def fetch(url: str, node: str | None = None) -> Any:
    """``/debug/nodes`` (every node, as a list) or ``/debug/nodes/<node>`` (one, as an object);
    ServiceError if the service cannot be asked."""
    client = ExtenderClient(url)
    try:
        data = client.get(f"/debug/nodes/{node}") if node else client.get("/debug/nodes")
    finally:
        client.close()
    return data if node else list(data["nodes"])


def render(data: Any, output: str = "table") -> str:
    """What :func:`fetch` gave (a node or a list of them) as ``output`` (one of :data:`OUTPUTS`)."""
    if output == "json":
        import json

        return json.dumps(data, indent=2)
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False)).rstrip()
    nodes: Sequence[Mapping[str, Any]] = data if isinstance(data, list) else [data]
    wide = output == "wide"
    headers = WIDE if wide else COLUMNS
    rows: list[list[object]] = []
    notes: list[str] = []
    for n in nodes:
        rows.extend([row.get(h, "-") for h in headers] for row in _rows(n, wide))
        if not n.get("usable"):
            notes.append(f"{n['name']}: not served until fixed: {n.get('problem')}")
        notes.extend(f"{n['name']}: {line}" for line in attention_lines(n))
        notes.extend(f"{n['name']}: {line}" for line in stray_lines(n))
        for pod, reason in (n.get("recordErrors") or {}).items():
            notes.append(f"{n['name']}: allocation record of {pod} rejected: {reason}")
    text = table(headers, rows)
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def _rows(n: Mapping[str, Any], wide: bool) -> list[dict[str, object]]:
    """One row per GPU of the node (one row for a node without GPUs or an invalid one)."""
    name = n["name"]
    if not n.get("usable"):
        return [{"NODE": name, "MODE": "INVALID"}]
    devices = n.get("devices") or []
    if not devices:
        cpu = n.get("cpuMilli") or {}
        return [
            {"NODE": name, "MODE": "no GPUs", "DETAIL": f"cpu {cpu.get('allocated', 0)}/{cpu.get('allocatable', 0)}m"}
        ]
    holders: dict[int, list[str]] = {}
    for pod in n.get("pods") or []:
        for share in pod["shares"]:
            holders.setdefault(share["index"], []).append(holder_text(pod, share))
    rows: list[dict[str, object]] = []
    for i, d in enumerate(devices):
        pods = holders.get(d["index"], [])
        rows.append(
            {
                "NODE": name if i == 0 else "",
                "GPU": d["index"],
                "UUID": d["uuid"],
                "MODEL": d["model"],
                "MODE": d["mode"],
                "MEMORY-MIB": f"{d['memoryAllocatedMiB']}/{d['memoryMiB']}",
                "FREE-MIB": d["memoryFreeMiB"],
                "COMPUTE": f"{d['computeAllocatedMilli'] / 10:g}%",
                "DETAIL": d["detail"],
                "PODS": (", ".join(pods) or "-") if wide else len(pods),
            }
        )
    return rows


def holder_text(pod: Mapping[str, Any], share: Mapping[str, Any]) -> str:
    """A share's holder as ``gpuslice inspect`` lists it: the pod, and where the node agent
    measures it, used next to allocated (``team-a/x used 3072/8192 MiB, 41 percent``)."""
    text = str(pod["pod"]) + (" (binding)" if pod.get("inFlight") else "")
    used = share.get("usedMiB")
    if used is None:
        return text
    text += f" used {used}/{share['memoryMiB']} MiB"
    if share.get("usedComputeMilli") is not None:
        text += f", {share['usedComputeMilli'] / 10:g}/{share['computeMilli'] / 10:g} percent"
    return text + (" OVERRUN" if share.get("overrun") else "")


def attention_lines(node: Mapping[str, Any]) -> list[str]:
    """A line per unhealthy GPU and per share measured over its allocation, for ``gpuslice
    inspect``: the short table has no column for either, and neither may pass unseen."""
    lines = [
        f"GPU {d['index']} unhealthy: {d.get('unhealthyReason') or 'reported by the node agent'}"
        for d in node.get("devices") or []
        if d.get("healthy") is False
    ]
    for pod in node.get("pods") or []:
        lines.extend(f"GPU {s['index']}: {holder_text(pod, s)}" for s in pod["shares"] if s.get("overrun"))
    return lines


def stray_lines(node: Mapping[str, Any]) -> list[str]:
    """One line per stray process the node agent reported (and one for the usage annotation's
    problem, if it has one), for ``gpuslice inspect``."""
    measured = node.get("measured") or {}
    if measured.get("problem"):
        return [f"measured use unreadable: {measured['problem']}"]
    lines = [
        f"stray: GPU {s['index']} PID {s['pid']} holds {s['memoryMiB']} MiB: {s['why']}"
        for s in measured.get("stray", [])
    ]
    if measured.get("strayOmitted"):
        lines.append(f"stray: {measured['strayOmitted']} more processes not listed")
    return lines


QUOTA_COLUMNS = ("NAMESPACE", "QUOTA", "MODEL", "MEMORY", "COMPUTE", "GPUS", "OVER")


def render_quotas(quotas: Sequence[Mapping[str, Any]], output: str = "table") -> str:
    """``/debug/quotas`` as ``output``: per GPUQuota and scope (all GPUs, then each model it
    limits), used/allowed of memory, compute (GPUs' worth) and whole GPUs ("-": no limit)."""
    if output in ("json", "yaml"):
        return render(list(quotas), output)
    rows: list[list[object]] = []
    notes = []
    for q in quotas:
        if "problem" in q:
            notes.append(f"{q['namespace']}/{q['name']}: not enforced: {q['problem']}")
            continue
        limits, used = q["limits"], q["used"]
        scopes = [("*", {k: v for k, v in limits.items() if k != "models"}, used)]
        scopes += [(m, lim, used.get("models", {}).get(m, {})) for m, lim in limits.get("models", {}).items()]
        for i, (model, lim, held) in enumerate(scopes):
            rows.append(
                [
                    q["namespace"] if i == 0 else "",
                    q["name"] if i == 0 else "",
                    model,
                    f"{_mib(held.get('gpuMemory'))}/{_mib(lim.get('gpuMemory'))} MiB",
                    f"{_gpus(held.get('gpuCompute'))}/{_gpus(lim.get('gpuCompute'))}",
                    f"{held.get('gpus', 0)}/{lim.get('gpus', '-')}",
                    ("yes" if q.get("overQuota") else "no") if i == 0 else "",
                ]
            )
    text = table(QUOTA_COLUMNS, rows) if rows else "no GPUQuota objects"
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def _mib(text: object) -> str:
    return "-" if text is None else str(text).removesuffix("Mi")


def _gpus(text: object) -> str:
    """``2500m`` -> ``2.5`` (GPUs' worth); "-" for no limit."""
    if text is None:
        return "-"
    return f"{int(str(text).removesuffix('m')) / 1000:g}"


def inspect(url: str, node: str | None = None, output: str = "table", quotas: bool = False) -> str:
    """``gpuslice inspect``: the text to print (with ``quotas``, the GPUQuotas instead of the nodes)."""
    if quotas:
        client = ExtenderClient(url)
        try:
            data = client.get("/debug/quotas")
        finally:
            client.close()
        return render_quotas(list(data["quotas"]), output)
    return render(fetch(url, node), output)
