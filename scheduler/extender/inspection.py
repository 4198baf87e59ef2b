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
            holders.setdefault(share["index"], []).append(pod["pod"] + (" (binding)" if pod.get("inFlight") else ""))
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


def inspect(url: str, node: str | None = None, output: str = "table") -> str:
    """``gpuslice inspect``: the text to print."""
    return render(fetch(url, node), output)
