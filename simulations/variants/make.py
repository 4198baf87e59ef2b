"""Write the generated openb variants (scheduler/sim/variants.py) as pod lists.

    python simulations/variants/make.py OPENB_DIR [--out simulations/variants/data]

OPENB_DIR holds openb_pod_list_default.csv and openb_node_list_gpu_node.csv. The pod lists
are derived from a research trace and are not part of the repository: they are written to
--out (default: the git-ignored simulations/variants/data/), with the GPU node list copied
beside them so `gpuslice simulate` finds it, and a levels.csv of the levels each file has.

VARIANTS below is the record: name, generator seed, levels, and whether the variant was used
for tuning ("tune") or held out ("held-out", decided before any tuning; only reported).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

from scheduler.sim.errors import TraceError
from scheduler.sim.variants import VariantSpec, describe, make_variant, read_rooms, read_rows, write_rows

TUNE, HELD_OUT = "tune", "held-out"

# (role, spec): generator seed 1 for tuning variants, 2 and 3 for held-out ones.
VARIANTS: tuple[tuple[str, VariantSpec], ...] = (
    (TUNE, VariantSpec("gen-gpuspec30-s1", 1, gpuspec=0.30)),
    (TUNE, VariantSpec("gen-gpuspec40-s1", 1, gpuspec=0.40)),
    (TUNE, VariantSpec("gen-cpu350-s1", 1, cpu=0.35)),
    (TUNE, VariantSpec("gen-gpushare70-s1", 1, gpushare=0.70)),
    (TUNE, VariantSpec("gen-multigpu35-s1", 1, multigpu=0.35)),
    (TUNE, VariantSpec("gen-gpuspec30-cpu300-s1", 1, gpuspec=0.30, cpu=0.30)),
    (HELD_OUT, VariantSpec("gen-gpuspec15-s2", 2, gpuspec=0.15)),
    (HELD_OUT, VariantSpec("gen-gpuspec25-s2", 2, gpuspec=0.25)),
    (HELD_OUT, VariantSpec("gen-gpuspec33-s2", 2, gpuspec=0.33)),
    (HELD_OUT, VariantSpec("gen-gpuspec33-s3", 3, gpuspec=0.33)),
    (HELD_OUT, VariantSpec("gen-cpu250-s2", 2, cpu=0.25)),
    (HELD_OUT, VariantSpec("gen-cpu400-s2", 2, cpu=0.40)),
    (HELD_OUT, VariantSpec("gen-gpushare60-s2", 2, gpushare=0.60)),
    (HELD_OUT, VariantSpec("gen-gpushare100-s2", 2, gpushare=1.0)),
    (HELD_OUT, VariantSpec("gen-multigpu40-s2", 2, multigpu=0.40)),
    (HELD_OUT, VariantSpec("gen-gpuspec33-cpu250-s2", 2, gpuspec=0.33, cpu=0.25)),
    (HELD_OUT, VariantSpec("gen-gpuspec25-gpushare60-s2", 2, gpuspec=0.25, gpushare=0.60)),
    (HELD_OUT, VariantSpec("gen-gpuspec20-multigpu40-s3", 3, gpuspec=0.20, multigpu=0.40)),
    (HELD_OUT, VariantSpec("gen-gpushare60-cpu250-s3", 3, gpushare=0.60, cpu=0.25)),
    # Generator seed 4: made after the MIG rules of fgd-reserve were chosen (while choosing them,
    # gen-gpuspec20-multigpu40-s3 was looked at), run only to report.
    (HELD_OUT, VariantSpec("gen-gpuspec10-s4", 4, gpuspec=0.10)),
    (HELD_OUT, VariantSpec("gen-gpuspec33-s4", 4, gpuspec=0.33)),
    (HELD_OUT, VariantSpec("gen-cpu300-s4", 4, cpu=0.30)),
    (HELD_OUT, VariantSpec("gen-gpuspec30-gpushare50-multigpu25-s4", 4, gpuspec=0.30, gpushare=0.50, multigpu=0.25)),
    # Generator seed 5: made a sitting after the last change of fgd-reserve's rules, run only to report.
    (HELD_OUT, VariantSpec("gen-gpuspec20-s5", 5, gpuspec=0.20)),
    (HELD_OUT, VariantSpec("gen-gpuspec30-s5", 5, gpuspec=0.30)),
    (HELD_OUT, VariantSpec("gen-cpu350-s5", 5, cpu=0.35)),
    (HELD_OUT, VariantSpec("gen-gpushare90-s5", 5, gpushare=0.90)),
    (HELD_OUT, VariantSpec("gen-multigpu45-s5", 5, multigpu=0.45)),
    (HELD_OUT, VariantSpec("gen-gpuspec20-cpu200-gpushare40-s5", 5, gpuspec=0.20, cpu=0.20, gpushare=0.40)),
)
NODE_LIST = "openb_node_list_gpu_node.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("openb", type=Path, help="folder with openb_pod_list_default.csv and the GPU node list")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("data"))
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = parser.parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    known = {spec.name for _, spec in VARIANTS}
    if wanted - known:
        print(f"error: --only: unknown variant(s) {', '.join(sorted(wanted - known))}", file=sys.stderr)
        return 2
    try:
        base = read_rows(args.openb / "openb_pod_list_default.csv")
        rooms = read_rooms(args.openb / NODE_LIST)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.openb / NODE_LIST, args.out / NODE_LIST)
    levels = []
    for role, spec in VARIANTS:
        if wanted and spec.name not in wanted:
            continue
        rows = make_variant(base, rooms, spec)
        write_rows(args.out / f"openb_pod_list_{spec.name}.csv", rows)
        measured = describe(rows)
        levels.append(
            {"variant": spec.name, "role": role, "seed": spec.seed, **{k: f"{v:.4f}" for k, v in measured.items()}}
        )
        print(f"{spec.name}: {', '.join(f'{k} {v:.3f}' for k, v in measured.items())}")
    with (args.out / "levels.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(levels[0]))
        writer.writeheader()
        writer.writerows(levels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
