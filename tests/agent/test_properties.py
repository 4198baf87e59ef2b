"""Random sequences of binds, admissions, deletions, hand-made instances and agent restarts on fake
GPUs, scheduled by the real extender. After every step:

* the MIG instances the agent made are exactly the placements of the live records it admitted;
* every instance made by hand is still there;
* no device is handed to two live pods (a MIG instance or a whole GPU), and each pod's answer
  names the instance at its record's placement.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.agent.agent import Agent
from scheduler.agent.cluster import PodResources
from scheduler.agent.fake import FakeGpus
from scheduler.agent.handover import Answer
from scheduler.agent.migs import AdmitError
from scheduler.core import mig
from scheduler.core.allocation import MigSlot
from scheduler.core.catalog import CATALOG
from scheduler.core.inventory import SharingMode
from tests.agent.kit import SHARE, Cluster, fake_gpus, make_agent

HAND = "MIG-hand-1g-at-6"
REQUESTS = [
    {"mig_profile": "1g.10gb"},
    {"mig_profile": "2g.20gb"},
    {"mig_profile": "3g.40gb"},
    {"mig_profile": "4g.40gb"},
    {"mig_profile": "7g.80gb"},
    {"gpu_fraction": "0.25", "sharing": "mps"},
    {"gpu_count": "1", "sharing": "exclusive"},
]
OPS = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, len(REQUESTS) - 1)),
    st.tuples(st.just("admit"), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("restart"), st.integers(-1, 20)),  # >= 0: a pod is deleted while the agent is down
    st.tuples(st.just("hand"), st.integers(0, 6)),
    st.tuples(st.just("tick"), st.just(0)),
)


def hardware() -> FakeGpus:
    return fake_gpus(
        {"model": "A100-80GB", "uuid": "GPU-m0", "mig": True},
        {
            "model": "A100-80GB",
            "uuid": "GPU-m1",
            "mig": True,
            "instances": [{"profile": "1g.10gb", "start": 6, "uuid": HAND}],
        },
        {"model": "L4", "uuid": "GPU-l4"},
        {"model": "H100-80GB", "uuid": "GPU-h100"},
    )


@dataclass
class World:
    tmp: Path
    gpus: FakeGpus
    cluster: Cluster
    agent: Agent
    hand: set[str] = field(default_factory=lambda: {HAND})
    bound: list[str] = field(default_factory=list)  # bound, not yet admitted, in bind order
    admitted: dict[str, Answer] = field(default_factory=dict)
    shares: dict[str, str] = field(default_factory=dict)  # pod -> share ID the kubelet gave it
    made: int = 0

    def restart(self) -> None:
        self.agent = start(self.tmp, self.gpus, self.cluster, self)

    def list(self) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
        """The kubelet's pod-resources view: which pod holds which share ID."""
        return {key: {"main0": {SHARE: (share,)}} for key, share in self.shares.items()}

    def forget(self, key: str) -> None:
        self.admitted.pop(key, None)
        self.shares.pop(key, None)
        if key in self.bound:
            self.bound.remove(key)

    def live(self) -> list[str]:
        return sorted([*self.bound, *self.admitted])


def start(tmp: Path, gpus: FakeGpus, cluster: Cluster, kubelet: PodResources | None) -> Agent:
    return make_agent(tmp, gpus, cluster, kubelet, gpus={"2": {"mode": "mps"}})


def step(world: World, op: str, arg: int) -> None:
    cluster = world.cluster
    if op == "bind":
        world.made += 1
        key = cluster.create_pod(f"p{world.made}", **REQUESTS[arg])
        if cluster.filter(key)["NodeNames"]:
            cluster.schedule(key)
            world.bound.append(key)
        else:
            cluster.delete(key)
    elif op == "admit" and world.bound:
        key = world.bound.pop(0)
        free = next(f"share-{i:03d}" for i in range(128) if f"share-{i:03d}" not in world.shares.values())
        try:
            answer = world.agent.allocate((free,))
        except AdmitError as exc:
            cluster.fail_pod(key, "UnexpectedAdmissionError", str(exc))
            world.forget(key)
            return
        assert answer.pod == key, (answer.pod, key)
        world.admitted[key] = answer
        world.shares[key] = free
    elif op == "delete" and world.live():
        key = world.live()[arg % len(world.live())]
        cluster.delete(key)
        world.forget(key)
    elif op == "restart":
        cluster.stop()
        if arg >= 0 and world.live():
            key = world.live()[arg % len(world.live())]
            cluster.delete(key)
            world.forget(key)
        world.restart()
    elif op == "hand":
        layout = CATALOG["A100-80GB"].mig
        assert layout is not None
        profile = layout.profiles[0]  # 1g.10gb
        used = tuple(
            MigSlot(i.start, i.memory_slots, i.compute_slices, f"{i.compute_slices}g{i.memory_slots}")
            for i in world.gpus.mig_instances("GPU-m0")
        )
        if mig.why_not(layout, used, profile, arg) is None:
            world.hand.add(world.gpus.make_by_hand(0, "1g.10gb", arg).uuid)
    world.agent.tick()


def check(world: World) -> None:
    on_hardware = {i.uuid: i for g in ("GPU-m0", "GPU-m1") for i in world.gpus.mig_instances(g)}
    assert world.hand <= set(on_hardware), "an instance made by hand was destroyed"
    made = {(i.gpu_uuid, i.start, i.memory_slots): u for u, i in on_hardware.items() if u not in world.hand}
    wanted = {}
    whole: list[str] = []
    for key, answer in world.admitted.items():
        (share,) = world.cluster.record(key).shares
        if share.mig is not None:
            wanted[(share.uuid, share.mig.start, share.mig.size)] = key
            uuid = made.get((share.uuid, share.mig.start, share.mig.size))
            assert answer.cdi_devices == (f"nvidia.com/gpu={uuid}",), (key, answer, made)
        elif share.mode is SharingMode.EXCLUSIVE:
            whole.append(share.uuid)
    assert set(made) == set(wanted), (made, wanted)
    names = [n for a in world.admitted.values() for n in a.cdi_devices]
    exclusive = [n for a in world.admitted.values() for n in a.cdi_devices if "MIG" in n or "h100" in n]
    assert len(exclusive) == len(set(exclusive)), names
    assert len(whole) == len(set(whole))


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=25))
def test_instances_follow_the_records_and_nothing_is_handed_out_twice(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        gpus = hardware()
        cluster = Cluster(tmp)
        world = World(tmp, gpus, cluster, start(tmp, gpus, cluster, None))
        world.restart()  # the agent that reads the kubelet's view (the world)
        for op, arg in ops:
            step(world, op, arg)
            check(world)
