"""The top lines of cProfile files (``serve_probe.py --profile``) as Markdown tables.

    python benchmarks/profile_table.py /tmp/p/binpack-5000-0.85-default-0.prof --top 15

Per file two tables, by own time (``tottime``) and by time with callees (``cumtime``): calls,
own and cumulative seconds, their share of the profile's total, and the function (paths
shortened to the package). The profile's total and the calls of ``/filter``, ``/prioritize``
and ``/bind`` it covers head each file's tables, so that per-call figures can be read off.
"""

from __future__ import annotations

import argparse
import pstats
import re
from pathlib import Path

FuncKey = tuple[str, int, str]
VERBS = {"filter": "do_filter", "prioritize": "do_prioritize", "bind": "do_bind"}


def short(key: FuncKey) -> str:
    path, line, name = key
    if path == "~":
        return name
    path = re.sub(r"^.*/(site-packages|python3\.\d+)/", "", path)
    path = re.sub(r"^.*/(scheduler|benchmarks)/", r"\1/", path)
    return f"{path}:{line}({name})"


def tables(path: Path, top: int) -> str:
    stats = pstats.Stats(str(path))
    raw = stats.stats  # type: ignore[attr-defined]
    total = max(stats.total_tt, 1e-9)  # type: ignore[attr-defined]
    calls = {verb: sum(v[1] for k, v in raw.items() if k[2] == fn) for verb, fn in VERBS.items()}
    out = [
        f"`{path.name}`: {total:.3f} s in all; calls: " + ", ".join(f"{verb} {n}" for verb, n in calls.items()) + "\n"
    ]
    for column, label in ((2, "tottime"), (3, "cumtime")):
        rows = sorted(raw.items(), key=lambda kv: kv[1][column], reverse=True)[:top]
        out.append(
            f"\nby {label}:\n\n| calls | tottime s | cumtime s | % of all ({label}) | function |\n|---|---|---|---|---|"
        )
        for key, (_, ncalls, tt, ct, _) in rows:
            share = (tt if column == 2 else ct) / total * 100
            out.append(f"| {ncalls} | {tt:.3f} | {ct:.3f} | {share:.1f} | `{short(key)}` |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    for path in args.files:
        if not path.exists():
            raise SystemExit(f"{path}: no such profile; accepted: files written by serve_probe.py --profile")
        print(tables(path, args.top))


if __name__ == "__main__":
    main()
