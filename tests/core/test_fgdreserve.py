"""fgd-reserve: fgd-cpu plus the price of GPU groups pinned pods need, and stranding that stands
down when CPU will run out. Cases by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.core.board import Board
from scheduler.core.catalog import ProfileSpec
from scheduler.core.fit import fit
from scheduler.core.fragmentation import Shape
from scheduler.core.policies import make_policy, tell
from scheduler.core.policies.fgdreserve import FgdReserve, FgdReserveOptions
from scheduler.core.request import Demand, GpuKind, GpuRequest
from scheduler.core.select import Gaps, finish, gap_histogram, rank
from scheduler.core.state import NodeState
from tests.builders import make_state

ONE_GPU = (Shape(1.0, cpu=1, gpu_count="1"),)  # the typical pod: one whole GPU, one core
HALF = (Shape(1.0, cpu=1, gpu_fraction="0.5"),)
QUARTER = (Shape(1.0, cpu=1, gpu_fraction="0.25"),)


def whole(models: tuple[str, ...] = ()) -> Demand:
    return Demand(1_000, 0, GpuRequest(GpuKind.WHOLE, 1, models=models))


def half() -> Demand:
    return Demand(1_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=500))


def quarter() -> Demand:
    return Demand(1_000, 0, GpuRequest(GpuKind.SHARE, 1, fraction_milli=250))


def seven() -> Demand:
    return Demand(1_000, 0, GpuRequest(GpuKind.MIG, 1, profile=ProfileSpec.parse("7g.80gb")))


def cluster() -> list[NodeState]:
    """Two groups of two idle GPUs each: T4 (listed first: it wins ties) and L4; 32 cores a node."""
    return [
        make_state(name="t4", gpus=2, model="T4", cpu_milli=32_000),
        make_state(name="l4", gpus=2, model="L4", cpu_milli=32_000),
    ]


def policy(**options: object) -> FgdReserve:
    made = make_policy("fgd-reserve", {"workload": ONE_GPU, "learn": False, **options})
    assert isinstance(made, FgdReserve)
    return made


def test_a_flexible_pod_leaves_the_group_pinned_pods_will_fill() -> None:
    # Seen: one pod pinned to T4 (1000 milli-GPU) and one that may go anywhere (1000): V = 2000.
    # Free: T4 2000, L4 2000, R = 4000. Pinned load on T4: 1000 x 2000 / 2000 = 1000, 0.5 of V,
    # on 0.5 of the free GPU: rho_T4 = 1.0 -> price ramp(1.0) = (1.0 - 0.5) / 0.5 = 1; rho_L4 = 0.
    # A flexible one-GPU pod: fgd-cpu scores 50 on both (one idle GPU left: a typical pod still
    # fits, no CPU stranded). On T4 it pays 4 x 1 x 1000 milli-GPU x 50 / 2000 = 100 points:
    # 50 - 100 = -50, squashed to 1 / (2 - (-50)) = 1/52. On L4: 50.
    reserve = policy()
    reserve.learned.observe(whole(("T4",)))
    reserve.learned.observe(whole())
    board = Board(cluster(), {"t4": 0, "l4": 1})
    scores = board.scores(reserve, whole())
    assert scores.tolist() == pytest.approx([1 / 52, 50.0])
    choice = board.best(reserve, whole())
    assert choice is not None and choice.node == "l4"
    # fgd-cpu, the same rule without the price: a tie, and T4 wins it on node order
    plain = make_policy("fgd-cpu", {"workload": ONE_GPU, "learn": False})
    taken = Board(cluster(), {"t4": 0, "l4": 1}).best(plain, whole())
    assert taken is not None and taken.node == "t4"


def test_a_pinned_pod_pays_the_same_wherever_it_may_go() -> None:
    # The pinned pod itself fits T4 only: L4 is -inf, and T4 keeps a finite score (it still wins).
    reserve = policy()
    reserve.learned.observe(whole(("T4",)))
    reserve.learned.observe(whole())
    board = Board(cluster())
    scores = board.scores(reserve, whole(("T4",)))
    assert scores[1] == -np.inf and scores[0] > -np.inf
    choice = board.best(reserve, whole(("T4",)))
    assert choice is not None and choice.node == "t4"


def test_no_price_while_pinned_demand_leaves_room() -> None:
    # One pinned pod and five flexible: V = 6000; pinned load on T4 1000 -> 1/6 of V on 1/2 of
    # the free GPU: rho = 1/3, below the start 0.5: no price, fgd-cpu's scores unchanged.
    reserve = policy()
    reserve.learned.observe(whole(("T4",)))
    for _ in range(5):
        reserve.learned.observe(whole())
    assert Board(cluster()).scores(reserve, whole()).tolist() == [50.0, 50.0]


def test_the_board_and_the_plain_answer_see_the_same_groups() -> None:
    reserve = policy()
    reserve.learned.observe(whole(("T4",)))
    reserve.learned.observe(whole())
    states = cluster()
    ranked = {p.node: p.score for p in rank(reserve, whole(), states).placements}
    assert [ranked["t4"], ranked["l4"]] == pytest.approx(Board(states).scores(reserve, whole()).tolist())


def test_stranding_stands_down_as_the_mix_asks_for_all_the_cpu() -> None:
    # kappa = CPU per GPU seen x GPUs / CPU of the cluster. Cluster: 4 GPUs, 64 cores.
    # Seen: one 1-core GPU pod and CPU-only pods of 15 cores: 16000 / 1000 x 4000 / 64000 = 1.0.
    # With low 0.9, high 1.1 the stranding weight is 4 x (1.1 - 1.0) / 0.2 = 2.0 (in eighths: 0.5).
    states = cluster()
    view = Gaps(gap_histogram(states), np.full((2, 2), -1), states, states)
    reserve = policy()
    reserve.learned.observe(whole())
    reserve.learned.observe(Demand(15_000, 0))
    assert reserve.learned.kappa(view) == pytest.approx(1.0)
    version = reserve.learned.version
    # a node with 500 milli-CPU left beside its two idle GPUs strands S = 2000 - 500 = 1500
    squeezed = NodeState(states[0].node, states[0].usage, 31_500)
    cpu_pod = fit(Demand(100, 0), squeezed).allocations[0]
    kept = reserve._costs(squeezed, cpu_pod)
    reserve.adjust(whole(), np.array([50.0, 50.0]), view)
    assert reserve.stranding_weight == 4.0  # adjust only reads: kappa is worked out as the learned object follows
    finish(reserve, whole(), np.array([50.0, 50.0]), view)
    assert reserve.stranding_weight == pytest.approx(2.0)
    assert reserve.learned.version == version + 1  # cached scores of the old weight are not reused
    # nor the costs kept for a placement: C before falls by (4 - 2) x 1500
    assert reserve._costs(squeezed, cpu_pod)[0] == pytest.approx(kept[0] - 2.0 * 1500)
    # kappa 1.2 or more: no stranding at all; 0.9 or less: the full weight
    more = policy()
    more.learned.observe(whole())
    more.learned.observe(Demand(18_200, 0))  # 19200 / 1000 x 0.0625 = 1.2
    finish(more, whole(), np.array([50.0, 50.0]), view)
    assert more.stranding_weight == 0.0
    light = policy()
    light.learned.observe(whole())
    light.learned.observe(Demand(13_000, 0))  # 14000 / 1000 x 0.0625 = 0.875
    finish(light, whole(), np.array([50.0, 50.0]), view)
    assert light.stranding_weight == 4.0 and light.learned.version == 0


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="cpu_bound_low and cpu_bound_high"):
        FgdReserveOptions(cpu_bound_low=1.2, cpu_bound_high=1.1)
    with pytest.raises(ValueError, match="reserve_start"):
        FgdReserveOptions(reserve_start=1.0)


def test_the_balance_stands_down_as_pods_leave() -> None:
    # Free GPU from call to call, in hundredths: 400 (first sight), 200 (placements took 200),
    # 250 (a departure gave 50 back): held 200 - 50 = 150, freed / held = 1/3 -> balance
    # 75 x (1 - 1/3) = 50; 300 (another 50): freed 100 = held 100 -> 0.
    # Pods that only arrive (the FGD protocol) never give any back: the full weight.
    reserve = policy()

    def seen(*levels: int) -> None:
        gaps = np.bincount(np.array(levels), minlength=101)
        finish(reserve, whole(), np.array([50.0]), Gaps(gaps, np.full((2, 1), -1)))

    seen(100, 100, 100, 100)
    assert reserve.balance_weight == 75.0
    seen(100, 100, 0, 0)
    assert reserve.balance_weight == 75.0
    seen(100, 100, 50, 0)
    assert reserve.balance_weight == pytest.approx(50.0)
    seen(100, 100, 100, 0)
    assert reserve.balance_weight == 0.0


def _take_whole(state: NodeState, count: int) -> NodeState:
    for k in range(count):
        found = fit(whole(), state)
        assert found
        state = state.apply(f"whole-{k}", found.allocations[0])
    return state


def test_a_pod_pays_only_for_classes_more_constrained_than_its_own() -> None:
    # Three groups of two H100s: MIG (profiles and fractions), MPS (fractions and whole GPUs),
    # exclusive (whole GPUs; both taken). Seen: a 7g.80gb (MIG only: 1000 milli), a half GPU
    # (MIG or MPS: 500), two whole GPUs (MPS or exclusive: 2000). V = 3500, free MIG 2000,
    # MPS 2000, exclusive 0: R = 4000.
    # A half GPU pod counts only the class inside its own, MIG only: L_MIG = 1000,
    # rho_MIG = (1000 / 3500) / (2000 / 4000) = 4/7, price (4/7 - 1/2) / (1/2) = 1/7, cost
    # 500 / 7 milli-GPU, 4 x 500/7 x 50 / 2000 = 50/7 points. Its fgd-cpu scores (workload: the
    # half GPU; no balance, no stranding): on MPS nothing is fragmented (50); on MIG it takes a
    # 4g.40gb instance and leaves 3 slices where no 4g fits: F rises by 3/7 GPU,
    # 50 + 50 tanh(-428.6 / 2000) -> 39. So MIG 39 - 50/7, MPS 50: it goes to MPS.
    # Counting every pinned class instead (the whole GPUs' need of MPS among them) gives
    # L_MIG = 1000 + 250, L_MPS = 250 + 2000, prices 3/7 and 1: MIG 39 - 21.4, MPS 50 - 50,
    # and half GPUs go onto the GPUs the profiles need (the MIG scenario's trap).
    states = [
        make_state(name="mig", gpus=2, mode="mig", cpu_milli=32_000),
        make_state(name="mps", gpus=2, mode="mps", cpu_milli=32_000),
        _take_whole(make_state(name="train", gpus=2, mode="exclusive", cpu_milli=32_000), 2),
    ]
    reserve = policy(workload=HALF, balance_weight=0.0, stranding_weight=0.0)
    for demand in (seven(), half(), whole(), whole()):
        reserve.learned.observe(demand)
    board = Board(states)
    scores = board.scores(reserve, half())
    assert scores.tolist() == pytest.approx([39 - 50 / 7, 50.0, -np.inf])
    choice = board.best(reserve, half())
    assert choice is not None and choice.node == "mps"
    # a whole GPU has no class inside its own (MPS or exclusive): no price anywhere
    assert board.scores(reserve, whole()).tolist()[1] == 50.0


def test_the_balance_leaves_mig_gpus_out() -> None:
    # A MIG GPU holding a 2g.20gb (a quarter GPU's instance) has 5 of 7 slices free: level 71,
    # class 0.25 for fgd-cpu, whose balance counts it as a hole a quarter GPU could fill. A quarter
    # GPU on an idle MPS GPU then makes a second class-0.25 hole: rise (2 x 1 + 1) = 3, 75 x 3 / 3
    # GPUs = 75 points off 50: 0. fgd-reserve counts no MIG GPU (what a MIG hole admits depends on
    # its slots, not its size): rise 1, 50 - 25 = 25. The MIG placement itself is left out of the
    # balance, which must not prefer it either: it rises as much as the counted placement that
    # rises most, the MPS one (1): 50 - 25 = 25, no better than MPS. (Left at a rise of 0, it
    # scored 50 and drew shares onto MIG GPUs, into the slots and cores profiles need.)
    mig = make_state(name="mig", gpus=1, mode="mig", cpu_milli=32_000)
    found = fit(quarter(), mig)
    assert found
    mig = mig.apply("q", found.allocations[0])
    assert mig.gap_levels() == [71]
    states = [mig, make_state(name="mps", gpus=2, mode="mps", cpu_milli=32_000)]
    plain = make_policy("fgd-cpu", {"workload": QUARTER, "learn": False, "stranding_weight": 0.0})
    reserve = policy(workload=QUARTER, reserve_weight=0.0, stranding_weight=0.0)
    tell(plain, quarter())
    reserve.learned.observe(quarter())
    assert Board(states).scores(plain, quarter()).tolist() == [50.0, 0.0]
    assert Board(states).scores(reserve, quarter()).tolist() == [25.0, 25.0]


def balance_only() -> FgdReserve:
    """fgd-reserve with only its balance (workload a quarter GPU), told of a quarter and a half GPU."""
    made = policy(workload=QUARTER, reserve_weight=0.0, stranding_weight=0.0)
    made.learned.observe(quarter())
    made.learned.observe(half())
    return made


def test_a_share_on_a_mig_node_rises_as_much_as_the_counted_placement_that_rises_most() -> None:
    # Counted GPUs: mps-a's GPU 0 holds a quarter (level 75, class 0.25; the share sizes seen are
    # 0.25 and 0.5, so a gap of 0.75 counts in class 0.5), mps-b two idle GPUs: counts N[0.5] = 1.
    # A quarter GPU on mps-a fills that hole to 0.5 free: class 0.5 -> 0.5, no rise (0).
    # On mps-b it opens an idle GPU (no class) into a 0.75 gap, class 0.5: rise 2 x 1 + 1 = 3,
    # 75 x 3 / 5 GPUs = 45 points. On the MIG node (two idle GPUs: it opens one, F as on MPS) the
    # rise is the largest of the counted ones, 3: 45 points too. fgd-cpu scores 50 everywhere
    # (workload: a quarter; nothing stranded): mps-a 50, mps-b 5, mig 5.
    mps_a = make_state(name="mps-a", gpus=1, mode="mps", cpu_milli=32_000)
    found = fit(quarter(), mps_a)
    assert found
    mps_a = mps_a.apply("q", found.allocations[0])
    states = [
        make_state(name="mig", gpus=2, mode="mig", cpu_milli=32_000),
        mps_a,
        make_state(name="mps-b", gpus=2, mode="mps", cpu_milli=32_000),
    ]
    reserve = balance_only()
    assert Board(states).scores(reserve, quarter()).tolist() == [5.0, 50.0, 5.0]
    # mps-c's GPU holds a half (gap 0.5, class 0.5: N[0.5] = 2 now, 6 GPUs): a quarter there
    # moves it to class 0.25, rise (2 x 0 + 1) - (2 x 2 - 1) = -2, 50 + 75 x 2 / 6 = 75; mps-b
    # rises 2 x 2 + 1 = 5, 50 - 62.5, kept at 0; the MIG node takes the largest rise, 5: 0.
    mps_c = make_state(name="mps-c", gpus=1, mode="mps", cpu_milli=32_000)
    found = fit(half(), mps_c)
    assert found
    mps_c = mps_c.apply("h", found.allocations[0])
    fresh = balance_only()  # a new board: a policy that has seen no GPU freed
    assert Board([*states, mps_c]).scores(fresh, quarter()).tolist() == [0.0, 50.0, 0.0, 75.0]
    # A node the pod does not fit (too little CPU) may still carry a GPU's move (idle -> 0.75,
    # class 0.5: rise 3); it is no placement, so it does not count: beside mps-c alone (0.5 ->
    # 0.25: class 0.5 -> 0.25, rise (2 x 0 + 1) - (2 x 1 - 1) = 0) the MIG node rises by 0.
    short = make_state(name="short", gpus=2, mode="mps", cpu_milli=500)
    fresh = balance_only()
    assert Board([states[0], mps_c, short]).scores(fresh, quarter()).tolist() == [50.0, 50.0, -np.inf]
    # with no counted placement that moves a class, the MIG placement rises by 0
    alone = [states[0], states[1]]
    assert Board(alone).scores(reserve, quarter()).tolist() == [50.0, 50.0]


def cpu_only() -> Demand:
    return Demand(8_000, 0, GpuRequest())


def test_a_pod_without_gpus_is_not_priced_on_mig_nodes() -> None:
    # A MIG node and an MPS node, both idle with 32 cores; the pod asks 8 cores and no GPU.
    # fgd-cpu's score is 50 on both (no stranding, nothing fragmented by its CPU), and stays so
    # once a pod that only MIG GPUs can take (a profile) has been seen: the rule that priced
    # MIG nodes' CPU for such pods moved the held-out MIG replays by less than their seeds'
    # spread and was removed (simulations/fgd-reserve/ablation.md).
    states = [
        make_state(name="mig", gpus=1, mode="mig", cpu_milli=32_000),
        make_state(name="mps", gpus=1, mode="mps", cpu_milli=32_000),
    ]
    reserve = policy(workload=QUARTER, stranding_weight=0.0)
    reserve.learned.observe(quarter())
    reserve.learned.observe(seven())
    assert Board(states).scores(reserve, cpu_only()).tolist() == [50.0, 50.0]


def test_a_pod_without_gpus_keeps_off_gpu_nodes_while_a_node_without_gpus_can_take_it() -> None:
    # An MPS node and a node without GPUs, both idle with 32 cores; the pod asks 8 cores and no
    # GPU. fgd-cpu's score is 50 on both (no stranding, nothing fragmented by its CPU); the GPU
    # node loses gpu_cpu_price points (30): 20 against 50, and the pod goes where no GPU waits
    # for the cores. A node without GPUs that cannot take it (4 cores) prices nothing: 50.
    mps = make_state(name="mps", gpus=1, mode="mps", cpu_milli=32_000)
    room = make_state(name="cpu", gpus=0, cpu_milli=32_000)
    reserve = policy(workload=QUARTER, stranding_weight=0.0)
    reserve.learned.observe(quarter())
    assert Board([mps, room]).scores(reserve, cpu_only()).tolist() == [20.0, 50.0]
    choice = Board([mps, room]).best(reserve, cpu_only())
    assert choice is not None and choice.node == "cpu"
    full = make_state(name="cpu", gpus=0, cpu_milli=4_000)
    assert Board([mps, full]).scores(reserve, cpu_only()).tolist() == [50.0, -np.inf]
    off = policy(workload=QUARTER, stranding_weight=0.0, gpu_cpu_price=0.0)
    off.learned.observe(quarter())
    assert Board([mps, room]).scores(off, cpu_only()).tolist() == [50.0, 50.0]
    with pytest.raises(ValueError, match="gpu_cpu_price must be in 0 <= x <= 100"):
        FgdReserveOptions(gpu_cpu_price=101.0)


def test_the_rules_option_names_rules_it_knows() -> None:
    from_file: Any = ["reservation"]  # a list, as a configuration file gives it: kept as a tuple
    assert FgdReserveOptions(rules=from_file).rules == ("reservation",)
    for bad in (["mig-cpu"], ["balance"]):
        with pytest.raises(ValueError, match=r"unknown rule .*; accepted: reservation, cpu-bound, departures"):
            FgdReserveOptions(rules=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rules must be a list of rule names"):
        FgdReserveOptions(rules="reservation")  # type: ignore[arg-type]


def test_gpu_pods_seen_before_any_gpu_node_joins_are_classed_once_one_does() -> None:
    # The service may see GPU pods while no GPU node has joined yet: with no GPU group to
    # class them by, they wait (they were averaged over no group: NaN, and a warning), and once
    # GPU nodes join they are classed as in the first test: T4 priced, L4 wins.
    reserve = policy()
    reserve.learned.observe(whole(("T4",)))
    reserve.learned.observe(whole())
    board = Board([make_state(name="cpu", gpus=0, cpu_milli=32_000)])
    assert board.scores(reserve, whole()).tolist() == [-np.inf]
    for state in cluster():
        board.put(state)
    assert board.scores(reserve, whole()).tolist() == pytest.approx([-np.inf, 1 / 52, 50.0])
