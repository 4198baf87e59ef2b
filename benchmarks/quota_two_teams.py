"""Two teams sharing a cluster, with and without GPU quotas (docs/quotas.md records the figures).

Runs docs/quotas/two-teams.yaml (no quotas) and two-teams-quotas.yaml (each team held to 16
GPUs of compute) through the simulator, for each seed and policy, and prints per team: the
pods placed, the pods held back by the team's quota, the pods that fit nowhere, and the GPU
compute the team holds at the end (in GPUs).

    python benchmarks/quota_two_teams.py [--seeds 42-46] [--policy binpack]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.sim.engine import simulate
from scheduler.sim.scenario import read_scenario

DOCS = Path(__file__).resolve().parents[1] / "docs" / "quotas"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", default="42-46", help="first-last, such as 42-46")
    parser.add_argument("--policy", default="binpack")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    print("scenario            team    placed  held-by-quota  fit-nowhere  GPUs-held")
    for name in ("two-teams", "two-teams-quotas"):
        trace = read_scenario(DOCS / f"{name}.yaml")
        # each workload is one team's, of one shape: a pod's team and size follow from its name
        teams = {g.name: (g.namespace, g.shapes[0].demand.gpu.total_milli(0) / 1000) for g in trace.generators}
        totals: dict[str, list[float]] = {}
        for seed in seeds:
            result = simulate(trace, args.policy, seed)
            for pod, node in result.placements:
                team, gpus = teams[pod.rsplit("-", 1)[0]]
                row = totals.setdefault(team, [0, 0, 0, 0.0])
                if node is not None:
                    row[0] += 1
                    row[3] += gpus
            for kind, n in result.failed_by_kind.items():  # "<kind> (<team>)", "held by quota (<team>)"
                row = totals.setdefault(kind.rsplit("(", 1)[-1].rstrip(")"), [0, 0, 0, 0.0])
                row[1 if kind.startswith("held by quota") else 2] += n
        k = len(seeds)
        for team, (placed, held, nowhere, gpus) in sorted(totals.items()):
            print(f"{name:<19} {team:<7} {placed / k:>6.1f}  {held / k:>13.1f}  {nowhere / k:>11.1f}  {gpus / k:>9.2f}")


if __name__ == "__main__":
    main()
