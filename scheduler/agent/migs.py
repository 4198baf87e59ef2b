"""The agent's MIG instances: which are its own, making one at a record's placement, destroying
those no record holds (the rule is in :mod:`scheduler.agent.agent`'s docstring).

Only instances in :attr:`MigInstances.managed` are ever destroyed or handed over as made by
the agent; every other instance on the GPU is someone else's and stays as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from scheduler.core.allocation import DeviceShare
from scheduler.core.errors import GpusliceError

from .config import AgentConfig
from .gpus import GpuError, GpuInfo, Gpus, MigInfo
from .mps import ProcessRunner

log = logging.getLogger("gpuslice.agent.mig")


class AdmitError(GpusliceError):
    """A container cannot be given its share; the kubelet fails the pod with this message."""


@dataclass(frozen=True, slots=True)
class Placement:
    gpu_uuid: str
    slices: int
    slots: int
    start: int


def placement(inst: MigInfo) -> Placement:
    return Placement(inst.gpu_uuid, inst.compute_slices, inst.memory_slots, inst.start)


class MigInstances:
    def __init__(self, gpus: Gpus, config: AgentConfig, runner: ProcessRunner) -> None:
        self._gpus = gpus
        self._config = config
        self._runner = runner
        self.managed: set[str] = set()  # UUIDs of the instances the agent made

    def dynamic(self, gpu: GpuInfo) -> bool:
        return gpu.mig_enabled and self._config.sharing_of(gpu.index).mig_strategy == "dynamic"

    def adopt(
        self,
        held: Mapping[Placement, str],
        previous: set[str],
        intended: Collection[Placement] = (),
        taken: Collection[str] = (),
    ) -> None:
        """At start: the agent's are those a live record names, or its last inventory listed, or
        that sit at a placement it had announced it was about to create (``intended``: a kill
        between the creation and the inventory that lists it) unless that inventory listed the
        instance as someone else's (``taken``)."""
        for gpu in self._gpus.devices():
            if self.dynamic(gpu):
                for inst in self._gpus.mig_instances(gpu.uuid):
                    where = placement(inst)
                    if where in held or inst.uuid in previous or (where in intended and inst.uuid not in taken):
                        self.managed.add(inst.uuid)

    def reconcile(self, held: Mapping[Placement, str]) -> list[str]:
        """Destroy the agent's instances that no live record holds and nothing runs on; the problems."""
        problems = []
        changed = False
        for gpu in self._gpus.devices():
            if not self.dynamic(gpu):
                continue
            busy = {p.instance_uuid for p in self._gpus.processes(gpu.uuid)}
            for inst in self._gpus.mig_instances(gpu.uuid):
                if inst.uuid not in self.managed or placement(inst) in held or inst.uuid in busy:
                    continue
                try:
                    self._gpus.destroy_mig(gpu.uuid, inst.uuid)
                except GpuError as exc:
                    problems.append(f"destroy {inst.uuid}: {exc}")
                    continue
                log.info("destroyed MIG instance %s on GPU %d (no pod holds it)", inst.uuid, gpu.index)
                self.managed.discard(inst.uuid)
                changed = True
        on_hardware = {i.uuid for g in self._gpus.devices() if g.mig_enabled for i in self._gpus.mig_instances(g.uuid)}
        self.managed &= on_hardware
        if changed:
            problems.extend(self.refresh_cdi())
        return problems

    def instance_for(
        self,
        gpu: GpuInfo,
        share: DeviceShare,
        pod: str,
        held: Mapping[Placement, str],
        announce: Callable[[Placement], None] = lambda _: None,
    ) -> tuple[MigInfo, bool]:
        """The instance at exactly the record's placement, and whether it was made just now: the
        agent's own if there, else made after destroying the agent's unheld instances in the way.
        ``announce`` is told the placement before anything is made (and may refuse by raising)."""
        assert share.mig is not None
        want = Placement(gpu.uuid, share.mig.slices, share.mig.size, share.mig.start)
        end = share.mig.start + share.mig.size
        for inst in self._gpus.mig_instances(gpu.uuid):
            if placement(inst) == want and inst.uuid in self.managed:
                return inst, False
            if not (inst.start < end and share.mig.start < inst.start + inst.memory_slots):
                continue
            if inst.uuid not in self.managed:
                raise AdmitError(
                    f"GPU {gpu.index}: slot {share.mig.start} of {share.mig.profile} is taken by MIG instance "
                    f"{inst.uuid}, which gpuslice did not create; it is left alone"
                )
            holder = held.get(placement(inst))
            if holder is not None and holder != pod:
                raise AdmitError(f"GPU {gpu.index}: slot {share.mig.start} is held by pod {holder}")
            self._gpus.destroy_mig(gpu.uuid, inst.uuid)  # the agent's, and nobody's any more
            self.managed.discard(inst.uuid)
        announce(want)
        try:
            made = self._gpus.create_mig(gpu.uuid, share.mig.slices, share.mig.size, share.mig.start)
        except GpuError as exc:
            raise AdmitError(f"cannot create MIG {share.mig.profile} at slot {share.mig.start}: {exc}") from exc
        self.managed.add(made.uuid)
        log.info(
            "created MIG %s at slot %d on GPU %d for %s: %s", share.mig.profile, made.start, gpu.index, pod, made.uuid
        )
        return made, True

    def refresh_cdi(self) -> list[str]:
        """Run ``cdiRefresh`` (the CDI specification must name what was made or destroyed)."""
        command = self._config.cdi_refresh
        if not command:
            return []
        try:
            self._runner.run(command, {}, "")
        except Exception as exc:  # the runner's OSError / CalledProcessError: reported, not fatal
            return [f"cdiRefresh {' '.join(command)}: {exc}"]
        return []
