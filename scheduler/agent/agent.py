"""The node agent: makes each allocation record of its node true on the hardware, and hands it over.

**Which pod is being admitted.** ``Allocate`` names device IDs of the share resource, not
the pod. The kubelet admits pods one at a time, in the order it sees them bound, and asks
once per container that requests the resource (init containers first; an app container
may get its init container's ID again). So the agent answers, in order: a pod that already
holds one of the requested IDs; else the pod whose containers it is part-way through
(counted by Allocate calls, not IDs); else the
pod first seen bound to this node (the agent's own watch on the node's pods reports
bindings in the order the kubelet's does; pods already there at start-up are ordered by
the record's bind time, then creation time) among those with a counting record that are
not admitted yet. If none is known, it re-lists the node's pods from the API server for up
to ``admitWaitSeconds`` before failing the container. While a pod that asks for the share
waits to be admitted without a record the agent honours, the kubelet may be admitting it:
the agent then refuses every Allocate rather than guess, so no pod without a record ever
receives a device. Before its first answer a pod's record is checked against the GPUs and
the records already honoured (:mod:`scheduler.agent.records`). The race left: the kubelet sorts pods
that reach it in the same batch (its own start) by creation time, not bind time, so two
pods bound in one second around a kubelet restart can be answered crosswise. The kubelet's
pod-resources API then shows which pod holds which share ID; every tick compares it with
the answers given, and a disagreement is reported (an Event on the pod, a log line).

**MIG instances.** An instance is the agent's when a live record names its placement (GPU,
profile, start), or when the node's own inventory annotation listed it as the agent's
(``migManaged``) and the hardware still has it; every other instance on a dynamic-MIG GPU
is someone else's (``migTaken``) and is never destroyed. So after a restart (the agent's,
the kubelet's or the node's) what the agent made is found again from the hardware and the
records, with no file of its own. An instance of the agent's that no live record holds is
destroyed once no process runs on it. A GPU with MIG mode off is never given MIG work.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.core import modes
from scheduler.core.allocation import Allocation, DeviceShare, decode_record
from scheduler.core.errors import GpusliceError, InventoryError, RecordError
from scheduler.core.inventory import Node, SharingMode
from scheduler.core.k8s import inventory_annotation, parse_node
from scheduler.core.units import node_units

from .cluster import Json, NodeCluster, ObjectRef, PodResources
from .config import AgentConfig
from .gpus import GpuError, GpuInfo, Gpus
from .handover import Answer, answer
from .inventory import build_node, model_of
from .measure import Measure
from .migs import AdmitError, MigInstances, Placement
from .mps import MpsDaemons, ProcessRunner
from .pods import PodInfo, pod_info
from .procs import ProcFs, ProcReader
from .records import record_problem

log = logging.getLogger("gpuslice.agent")


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(slots=True)
class _Admission:
    """What the agent handed to one pod: answers by share ID, and how many containers asked
    (a container may reuse its init container's ID, so IDs can be fewer than containers)."""

    answers: dict[str, Answer] = field(default_factory=dict)
    calls: int = 0
    failed: str = ""


def share_ids(count: int) -> tuple[str, ...]:
    return tuple(f"share-{i:03d}" for i in range(count))


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        gpus: Gpus,
        cluster: NodeCluster,
        mps: MpsDaemons,
        runner: ProcessRunner,
        pod_resources: PodResources | None = None,
        clock: Clock | None = None,
        procs: ProcReader | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._gpus = gpus
        self._cluster = cluster
        self._mps = mps
        self._runner = runner
        self._pod_resources = pod_resources
        self._clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._pods: dict[str, PodInfo] = {}
        self._seq: dict[str, int] = {}
        self._next = 0
        self._admitted: dict[str, _Admission] = {}
        self._owner: dict[str, str] = {}  # share ID -> pod key
        self._kubelet_holds: set[str] = set()  # pods pod-resources shows holding a share
        self._migs = MigInstances(gpus, config, runner)
        self._unhealthy: dict[str, str] = {}
        self._published = ""
        self._units: int | None = None  # the GPU units of the inventory last built (see gpu_units)
        self._reported: set[str] = set()
        self.mismatches: list[str] = []  # every disagreement with the kubelet, as reported
        self.problems: list[str] = []  # the last tick's problems (one line each)
        self._logged: set[str] = set()  # the problems logged: a problem that stays is not logged again
        # measured use per share, strays and overruns (scheduler/agent/measure.py)
        self.measure = Measure(config, gpus, cluster, procs or ProcFs(config.measure.proc_root), wall)

    # ------------------------------------------------------------ start-up

    def start(self) -> None:
        """Read the node's last inventory and its pods, find what the agent made, publish."""
        previous: set[str] = set()
        taken: set[str] = set()
        node = self._cluster.get_node()
        try:
            parsed = parse_node(node, self.config.prefix)
            previous = {i.uuid for d in parsed.devices for i in d.mig_managed}
            taken = {i.uuid for d in parsed.devices for i in d.mig_taken}
        except InventoryError as exc:
            log.warning("the node's inventory annotation is unreadable (%s); starting from the hardware alone", exc)
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        intended: list[Placement] = []
        if isinstance(annotations, Mapping):
            self._published = str(annotations.get(self.config.prefix + "inventory") or "")
            intended = _placements(annotations.get(self.config.prefix + "mig-intent"))
        with self._lock:
            self._merge(self._cluster.list_pods(), batch=True)
            self._migs.adopt(self._held(), previous, intended, taken)
            self._check_kubelet()
            self._reconcile_mig()
            if self._publish() and intended:
                self._announce(None)  # what was announced is now found again (or gone): forget it

    # ------------------------------------------------------------ pods

    def _merge(self, pods: list[Json], batch: bool) -> None:
        infos = []
        for obj in pods:
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            if not isinstance(meta, Mapping) or not meta.get("name"):
                continue
            key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
            infos.append(pod_info(key, obj, self.config.node, self.config.prefix, self.config.resource))
        for info in sorted(infos, key=lambda i: i.order) if batch else infos:
            self._update(info)

    def _update(self, info: PodInfo) -> None:
        if not info.live or info.node != self.config.node:
            self._forget(info.key)
            return
        old = self._pods.get(info.key)
        if old is not None and old.uid != info.uid:
            self._forget(info.key)
        self._pods[info.key] = info
        if info.key not in self._seq and info.allocation is not None:
            self._seq[info.key] = self._next
            self._next += 1

    def _forget(self, key: str) -> None:
        self._pods.pop(key, None)
        self._seq.pop(key, None)
        self._admitted.pop(key, None)
        self._kubelet_holds.discard(key)
        for share, owner in list(self._owner.items()):
            if owner == key:
                del self._owner[share]

    def on_pod(self, key: str, obj: Json | None) -> None:
        """A pod of this node changed or went (from the cluster's watch)."""
        with self._lock:
            if obj is None:
                self._forget(key)
            else:
                self._update(pod_info(key, obj, self.config.node, self.config.prefix, self.config.resource))
            if key not in self._pods:
                self._reconcile_mig()
                self._publish()

    # ------------------------------------------------------------ MIG

    def _held(self) -> dict[Placement, str]:
        """Placement -> pod, for every MIG share of a live record on this node."""
        out = {}
        for pod in self._pods.values():
            for share in pod.allocation.shares if pod.allocation else ():
                if share.mig is not None:
                    out[Placement(share.uuid, share.mig.slices, share.mig.size, share.mig.start)] = pod.key
        return out

    def _reconcile_mig(self) -> None:
        self.problems.extend(self._migs.reconcile(self._held()))

    # ------------------------------------------------------------ Allocate

    def _choose(self, ids: tuple[str, ...]) -> PodInfo | str:
        """The pod this Allocate serves, or why the agent cannot tell ("" if no pod waits)."""
        for share in ids:
            owner = self._owner.get(share)
            if owner in self._pods:
                return self._pods[owner]
        waiting = []
        for key in sorted(self._seq, key=self._seq.__getitem__):
            pod = self._pods.get(key)
            if pod is None or pod.allocation is None or not pod.share_containers:
                continue
            done = self._admitted.get(key)
            if done is not None and done.failed:
                continue
            count = done.calls if done else 0
            if 0 < count < len(pod.share_containers):
                return pod  # part-way through this pod's containers: the kubelet admits one pod at a time
            if count == 0 and not pod.started and key not in self._kubelet_holds:
                waiting.append(pod)
        strangers = self._strangers()
        if strangers:
            # The kubelet may be admitting any of them: answering with a record would be a guess.
            return (
                f"pods {', '.join(strangers)} ask for {self.config.resource} without a record gpuslice bound "
                f"that the agent honours, so it cannot tell which pod this Allocate serves"
            )
        return waiting[0] if waiting else ""

    def _strangers(self) -> list[str]:
        """Pods on this node waiting to be admitted that ask for the share but have no record the
        agent honours (no record, one that does not count here, or one the checks refused)."""
        out = []
        for key, pod in sorted(self._pods.items()):
            if not pod.share_containers or pod.started or key in self._kubelet_holds:
                continue
            done = self._admitted.get(key)
            if pod.allocation is None or (done is not None and done.failed and not done.answers):
                out.append(key)
        return out

    def allocate(self, ids: tuple[str, ...]) -> Answer:
        """The answer for one container asking for ``ids``; AdmitError says why there is none."""
        deadline = self._clock.monotonic() + self.config.admit_wait_s
        why = ""
        while True:
            with self._lock:
                chosen = self._choose(ids)
                if isinstance(chosen, PodInfo):
                    return self._answer(chosen, ids)
                why = chosen
            if self._clock.monotonic() >= deadline:
                with self._lock:
                    self._refuse("no-record" if why else "no-pod", why)
                    for key in self._strangers() if why else ():
                        pod = self._pods[key]
                        self._cluster.event(
                            ObjectRef("Pod", pod.name, pod.namespace, pod.uid),
                            "Warning",
                            "GpusliceNoRecord",
                            f"asks for {self.config.resource} without a record gpuslice bound to "
                            f"{self.config.node}: it gets no device, and the agent refuses every Allocate "
                            "while it waits to be admitted",
                        )
                raise AdmitError(
                    why
                    or f"no pod bound to {self.config.node} by gpuslice is waiting for a share "
                    f"(asked for {', '.join(ids)}); is the pod's allocation record missing?"
                )
            try:
                fresh = self._cluster.list_pods()
            except GpusliceError as exc:
                log.warning("listing the node's pods for Allocate: %s", exc)
            else:
                with self._lock:
                    self._merge(fresh, batch=True)
                    if isinstance(self._choose(ids), PodInfo):
                        continue
            self._clock.sleep(min(0.25, max(0.0, deadline - self._clock.monotonic())))

    def _refuse(self, reason: str, message: str) -> None:
        """Count a refused Allocate and, where there is something to say, tell the node."""
        self.measure.refusals[reason] += 1
        if message and message not in self._reported:
            self._reported.add(message)
            log.warning("Allocate refused: %s", message)
            self._cluster.event(ObjectRef("Node", self.config.node), "Warning", "GpusliceAllocateRefused", message)

    def _check(self, pod: PodInfo, alloc: Allocation) -> str:
        """Why ``pod``'s record cannot be honoured ("" if it can): gpuslice's ledger of the node must
        vouch for it, and it must fit the node's GPUs beside the records honoured before it (each
        as the ledger has it, where it has it: an edit after the bind changes nothing here)."""
        where = f"gpuslice's ledger of node {self.config.node}"
        unreadable = ""
        bound: Mapping[str, tuple[str, str]] | None = None
        try:
            bound = self._cluster.bound_records()
        except GpusliceError as exc:
            unreadable = f"{where} cannot be read ({exc}), so the record cannot be checked against what gpuslice bound"
        node = build_node(
            self.config,
            self._gpus.devices(),
            {g.uuid: self._gpus.mig_instances(g.uuid) for g in self._gpus.devices() if g.mig_enabled},
            self._migs.managed,
            {},
            {},
        )[0]
        answered = [k for k in self._pods if self._admitted.get(k) is not None and self._admitted[k].answers]
        rest = sorted((k for k in self._seq if k not in answered), key=self._seq.__getitem__)
        honoured = []
        for key in [*sorted(answered, key=lambda k: self._seq.get(k, -1)), *rest]:
            other = self._pods.get(key)
            if other is None or other.allocation is None:
                continue
            entry = (bound or {}).get(key)
            if entry is not None and entry[0] == other.uid:
                with contextlib.suppress(RecordError):
                    honoured.append((key, decode_record(entry[1], key)))
                    continue
            honoured.append((key, other.allocation))
        problem = record_problem(node, honoured, pod.key, alloc) or unreadable
        if problem or bound is None:
            return problem
        return self._unvouched(pod, alloc, bound.get(pod.key), where)

    @staticmethod
    def _unvouched(pod: PodInfo, alloc: Allocation, entry: tuple[str, str] | None, where: str) -> str:
        """Why the ledger's ``entry`` does not vouch for ``pod``'s record ("" if it does). A record
        anyone can write; the ledger only gpuslice writes."""
        if entry is None or entry[0] != pod.uid:
            return f"{where} has no entry for pod {pod.key} (uid {pod.uid}): gpuslice did not bind this record"
        try:
            theirs = decode_record(entry[1], pod.key)
        except RecordError as exc:
            return f"{where}: its entry for pod {pod.key} is unreadable ({exc})"
        if theirs.node != alloc.node or theirs.shares != alloc.shares:
            return f"the pod's record differs from what gpuslice bound ({where})"
        return ""

    def _answer(self, pod: PodInfo, ids: tuple[str, ...]) -> Answer:
        assert pod.allocation is not None
        done = self._admitted.setdefault(pod.key, _Admission())
        for share in ids:
            if share in done.answers:  # a container reusing its init container's share
                done.calls += 1
                return done.answers[share]
        try:
            if not done.answers:
                problem = self._check(pod, pod.allocation)
                if problem:
                    self._refuse("record-refused", "")
                    raise AdmitError(f"record refused: {problem}")
            result = self._hand_over(pod, pod.allocation, ids)
        except (AdmitError, GpuError) as exc:
            done.failed = str(exc)
            self._publish()
            self._cluster.event(
                ObjectRef("Node", self.config.node), "Warning", "GpusliceAllocateFailed", f"pod {pod.key}: {exc}"
            )
            self._cluster.event(
                ObjectRef("Pod", pod.name, pod.namespace, pod.uid), "Warning", "GpusliceAllocateFailed", str(exc)
            )
            log.warning("Allocate for %s failed: %s", pod.key, exc)
            raise AdmitError(str(exc)) from exc
        done.calls += 1
        for share in ids:
            done.answers[share] = result
            self._owner[share] = pod.key
        log.info("Allocate %s -> %s: %s", ",".join(ids), pod.key, ", ".join(result.cdi_devices))
        return result

    def _hand_over(self, pod: PodInfo, alloc: Allocation, ids: tuple[str, ...]) -> Answer:
        gpus = {g.index: g for g in self._gpus.devices()}
        names: dict[int, str] = {}
        pipes: dict[int, str] = {}
        for share in alloc.shares:
            gpu = gpus.get(share.index)
            if gpu is None:
                raise AdmitError(f"the record names GPU {share.index}, which node {self.config.node} does not have")
            if gpu.uuid in self._unhealthy:
                raise AdmitError(f"GPU {gpu.index} is unhealthy: {self._unhealthy[gpu.uuid]}")
            if share.mode is SharingMode.MIG:
                names[share.index] = self._mig_name(gpu, share, pod.key)
                continue
            if gpu.mig_enabled:
                raise AdmitError(f"GPU {gpu.index} is in MIG mode, but the record gives a {share.mode} share of it")
            if gpu.uuid != share.uuid:
                raise AdmitError(f"GPU {gpu.index} is {gpu.uuid}, but the record names {share.uuid}")
            names[share.index] = gpu.uuid
            if modes.of(share.mode).control_daemon:
                # never a share without what enforces its caps: no daemon, no handover
                problems = self._mps.ensure([gpu.uuid])
                down = self._mps.down(gpu.uuid)
                if down:
                    self._refuse("no-mps-daemon", "")
                    raise AdmitError(f"GPU {gpu.index}: {'; '.join(problems) or down}; an MPS share needs its caps")
                pipes[share.index] = self._mps.pipe(gpu.uuid).host_directory
        if len(set(pipes.values())) > 1:
            raise AdmitError("an MPS share over several GPUs cannot reach one control daemon per GPU")
        return answer(self.config, pod.key, alloc, names, pipes, ids[0] if ids else "none")

    def _announce(self, where: Placement | None) -> None:
        """Write ahead, on the Node, the placement about to be created (None: nothing pending), so
        an agent killed between the creation and the inventory that lists it finds the instance
        again as its own. A failed write refuses the creation (AdmitError): nothing is made that a
        restart could not find."""
        value = None if where is None else json.dumps([_placement_json(where)], separators=(",", ":"))
        try:
            self._cluster.set_node_annotations({self.config.prefix + "mig-intent": value})
        except GpusliceError as exc:
            if where is not None:
                raise AdmitError(f"cannot announce the MIG instance on the Node before making it: {exc}") from exc
            self.problems.append(f"clear {self.config.prefix}mig-intent: {exc}")

    def _mig_name(self, gpu: GpuInfo, share: DeviceShare, pod: str) -> str:
        assert share.mig is not None
        if not gpu.mig_enabled:
            raise AdmitError(f"GPU {gpu.index} has MIG mode off; the agent never changes MIG mode")
        if self._migs.dynamic(gpu):
            made, fresh = self._migs.instance_for(gpu, share, pod, self._held(), self._announce)
            # before the answer: a restart from here finds the instance listed as ours (else announced)
            if fresh and self._publish():
                self._announce(None)
            if fresh:
                self.problems.extend(self._migs.refresh_cdi())
            return made.uuid
        for inst in self._gpus.mig_instances(gpu.uuid):  # static: the pre-created instance named
            if inst.uuid == share.uuid and inst.start == share.mig.start:
                return inst.uuid
        raise AdmitError(f"GPU {gpu.index}: no MIG instance {share.uuid} at slot {share.mig.start}")

    # ------------------------------------------------------------ the kubelet's view

    def _report(self, about: ObjectRef, message: str) -> None:
        if message in self._reported:
            return
        self._reported.add(message)
        self.mismatches.append(message)
        log.warning("%s", message)
        self._cluster.event(about, "Warning", "GpusliceShareMismatch", message)

    def _check_kubelet(self) -> None:
        """Compare what the kubelet handed out (pod-resources) with the answers given."""
        if self._pod_resources is None:
            return
        try:
            listing = self._pod_resources.list()
        except GpusliceError as exc:
            self.problems.append(f"pod-resources: {exc}")
            return
        self._kubelet_holds = set()
        for key, containers in sorted(listing.items()):
            pod = self._pods.get(key)
            about = ObjectRef("Pod", key.split("/", 1)[-1], key.split("/", 1)[0], pod.uid if pod else "")
            ours = [d for c in containers.values() for d in c.get(self.config.resource, ())]
            nvidia = {
                d for c in containers.values() for r, ids in c.items() if r.startswith("nvidia.com/") for d in ids
            }
            if ours:
                self._kubelet_holds.add(key)
            for share in ours:
                owner = self._owner.get(share)
                if owner is None and key in self._pods:
                    self._owner[share] = key  # after a restart: the kubelet's word is what was done
                elif owner is not None and owner != key:
                    self._report(
                        about,
                        f"kubelet gave share {share} to pod {key}, but the agent answered it with pod {owner}'s record",
                    )
            if ours and pod is not None and pod.allocation is None:  # a pod gone is no longer known
                self._report(about, f"pod {key} holds a gpuslice share but has no allocation record on this node")
            if pod is not None and pod.allocation is not None and nvidia:
                recorded = {s.uuid for s in pod.allocation.shares}
                answered = {n.split("=", 1)[-1] for a in self._admission(key) for n in a.cdi_devices}
                stray = sorted(nvidia - recorded - answered)
                if stray:
                    self._report(
                        about,
                        f"pod {key} was given {', '.join(stray)} by another device plugin; its record says "
                        f"{', '.join(sorted(recorded))}",
                    )

    def _admission(self, key: str) -> list[Answer]:
        done = self._admitted.get(key)
        return list(done.answers.values()) if done else []

    # ------------------------------------------------------------ health, MPS, inventory

    def _node(self) -> tuple[Node, list[str]]:
        gpus = self._gpus.devices()
        instances = {g.uuid: self._gpus.mig_instances(g.uuid) for g in gpus if g.mig_enabled}
        peers = {g.uuid: self._gpus.nvlink_peers(g.uuid) for g in gpus}
        return build_node(
            self.config, gpus, instances, self._migs.managed, self._unhealthy, peers, self.measure.stray_mib()
        )

    def inventory(self) -> str:
        """The inventory annotation the hardware gives now."""
        with self._lock:
            return inventory_annotation(self._node()[0])

    def gpu_units(self) -> int:
        """The GPU units the node advertises (:func:`scheduler.core.units.node_units` of the
        inventory each round builds; read from the hardware now only before the first round):
        what kube-scheduler's NodeResourcesFit checks. The units plugin asks twice a second."""
        with self._lock:
            if self._units is None:
                self._units = node_units(self._node()[0])
            return self._units

    def _publish(self) -> bool:
        """Write the inventory if it changed; a failure is a problem of this round, retried next tick."""
        try:
            self._write_inventory()
        except GpusliceError as exc:
            self.problems.append(f"publish inventory: {exc}")
            return False
        return True

    def _write_inventory(self) -> None:
        node, warnings = self._node()
        self._units = node_units(node)
        for line in warnings:
            if line not in self._reported:
                self._reported.add(line)
                log.warning("%s", line)
        text = inventory_annotation(node)
        if _same_json(text, self._published):
            return
        self._cluster.set_node_annotations({self.config.prefix + "inventory": text})
        self._published = text
        log.info("published the inventory of %s (%d GPUs)", self.config.node, len(node.devices))

    def tick(self) -> list[str]:
        """One round: health, MPS daemons, MIG instances nobody holds, the kubelet's view, the
        measured use (with its stray memory in the inventory), the inventory. Returns the
        problems met (also logged), one line each."""
        with self._lock:
            self.problems = []
            gpus = self._gpus.devices()
            by_uuid = {g.uuid: g for g in gpus}
            for event in self._gpus.health_events():
                if event.gpu_uuid in self._unhealthy or event.gpu_uuid not in by_uuid:
                    continue
                self._unhealthy[event.gpu_uuid] = event.reason
                gpu = by_uuid[event.gpu_uuid]
                message = f"GPU {gpu.index} ({gpu.uuid}, {model_of(gpu).name}) is unhealthy: {event.reason}"
                log.error("%s", message)
                self._cluster.event(ObjectRef("Node", self.config.node), "Warning", "GpusliceGpuUnhealthy", message)
            mps_gpus = [
                g.uuid
                for g in gpus
                if not g.mig_enabled and modes.of(self.config.sharing_of(g.index).mode).control_daemon
            ]
            self.problems.extend(self._mps.ensure(mps_gpus))
            self._reconcile_mig()
            self._check_kubelet()
            self.problems.extend(self.measure.round(self._pods.values(), self._clock.monotonic()))
            self._publish()
            for line in self.problems:
                if line not in self._logged:  # once, then again only if it went away and came back
                    log.warning("%s", line)
            self._logged = set(self.problems)
            return list(self.problems)

    # ------------------------------------------------------------ for tests and inspection

    def managed(self) -> set[str]:
        with self._lock:
            return set(self._migs.managed)

    def owners(self) -> dict[str, str]:
        with self._lock:
            return dict(self._owner)


def _placement_json(where: Placement) -> dict[str, Any]:
    return {"gpu": where.gpu_uuid, "slices": where.slices, "slots": where.slots, "start": where.start}


def _placements(text: object) -> list[Placement]:
    """The placements of the write-ahead annotation; anything malformed is left out (logged)."""
    if not isinstance(text, str) or not text:
        return []
    try:
        body = json.loads(text)
        return [Placement(str(p["gpu"]), int(p["slices"]), int(p["slots"]), int(p["start"])) for p in body]
    except (ValueError, TypeError, KeyError):
        log.warning("the node's mig-intent annotation is malformed; ignored: %r", text[:200])
        return []


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(b) and json.loads(a) == json.loads(b)
    except ValueError:
        return False


def describe_answer(result: Answer) -> dict[str, Any]:
    """An answer as JSON, for logs and ``--dry-run``."""
    return {
        "pod": result.pod,
        "cdiDevices": list(result.cdi_devices),
        "envs": dict(result.envs),
        "mounts": [{"containerPath": m.container_path, "hostPath": m.host_path} for m in result.mounts],
    }
