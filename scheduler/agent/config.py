"""The agent's settings, checked once at start-up: a bad field stops it with the field's path.

node: gpu-1                        # default: --node, else $NODE_NAME
prefix: gpuslice.io/
resource: gpuslice.io/share        # the extended resource the webhook adds to gpuslice pods
shareSlots: 128                    # devices advertised for it (>= GPU containers on the node)
unitsResource: gpuslice.io/gpu-units   # the node's GPU units ("": not advertised; match GPUSLICE_UNITS_RESOURCE)
unitsSocketName: gpuslice-units.sock
devicePluginDir: /var/lib/kubelet/device-plugins
socketName: gpuslice.sock
podResourcesSocket: /var/lib/kubelet/pod-resources/kubelet.sock   # "" : not used
cdiKind: nvidia.com/gpu            # CDI names handed over: <cdiKind>=<GPU or MIG UUID>
sharing:                           # every GPU's mode, unless the NVIDIA device plugin's
  mode: exclusive                  # sharing config (nvidiaDevicePluginConfig) or gpus: say
  replicas: 4                      #   otherwise; MIG mode on the hardware means mig
  mpsClientLimit: 48
  migStrategy: dynamic             # dynamic: the agent creates instances; static: uses those there
  migProfiles: []                  # profiles it may create (empty: all)
gpus: {"0": {mode: mps}}           # per GPU index, the same keys as sharing
nvidiaDevicePluginConfig: ""       # the NVIDIA device plugin's config file (sharing.timeSlicing / mps)
oversubscription: {mpsComputePct: 100, timeSlicingMemoryPct: 100}
mps:
  daemon: auto                     # auto | agent | external
  externalPipeDirectory: /run/nvidia/mps/nvidia.com/gpu/pipe
  root: /run/gpuslice/mps          # the agent's daemons: <root>/<GPU UUID>/{pipe,log}
  containerPipeDirectory: /run/gpuslice/mps-pipe
  defaultThreadPercentage: 100     # the daemon's defaults: a client can only go lower
  defaultPinnedMemoryMiB: 0        # 0: no default limit
cdiRefresh: []                     # a command run after a MIG instance is made or destroyed
pollSeconds: 2
admitWaitSeconds: 5                # how long Allocate waits for the pod to show up bound
metrics:                           # /metrics, /healthz, /readyz; port 0: not served
  address: 127.0.0.1               # loopback unless set (0.0.0.0 for Prometheus and the kubelet's probes)
  port: 9402
  podNames: false                  # true: the share series name their pod (pod="name"); else its UID
measure:                           # use per share, sampled every round (scheduler/agent/sampling.py)
  procRoot: /proc                  # the host's /proc (hostPID): PID -> pod through its cgroup
  publishSeconds: 30               # the usage annotation at most this often, and only on change
  strayRoundMiB: 256               # stray memory published for the extender, rounded up to this
  strayGraceSeconds: 30            # a stray process this long before its Warning Event on the Node
  strayEventSeconds: 3600          # the same GPU and owner's Event at most this often
overrun:                           # memory above the share (scheduler/agent/guard.py)
  graceSeconds: 60                 # for longer than this: an Event, a metric and the action
  toleranceMiB: 0                  # above the share by more than this
  action: report                   # report | evict: for namespaces not listed below
  namespaces: {batch: evict}       # per namespace
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.core import modes
from scheduler.core.errors import ConfigError
from scheduler.core.inventory import DEFAULT_MPS_CLIENTS, SharingMode
from scheduler.core.request import DEFAULT_PREFIX

DEFAULT_RESOURCE = "gpuslice.io/share"
DEFAULT_UNITS_RESOURCE = "gpuslice.io/gpu-units"
UNITS_SOCKET_NAME = "gpuslice-units.sock"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
SOCKET_NAME = "gpuslice.sock"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
CDI_KIND = "nvidia.com/gpu"
MIG_STRATEGIES = ("dynamic", "static")
OVERRUN_ACTIONS = ("report", "evict")
_MEASURE_KEYS = ("procRoot", "publishSeconds", "strayRoundMiB", "strayGraceSeconds", "strayEventSeconds")
_OVERRUN_KEYS = ("graceSeconds", "toleranceMiB", "action", "namespaces")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MPS_DAEMONS = ("auto", "agent", "external")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
_TOP_KEYS = (
    "node",
    "prefix",
    "resource",
    "shareSlots",
    "unitsResource",
    "unitsSocketName",
    "devicePluginDir",
    "socketName",
    "podResourcesSocket",
    "cdiKind",
    "sharing",
    "gpus",
    "nvidiaDevicePluginConfig",
    "oversubscription",
    "mps",
    "cdiRefresh",
    "pollSeconds",
    "admitWaitSeconds",
    "metrics",
    "measure",
    "overrun",
)
_SHARING_KEYS = ("mode", "replicas", "mpsClientLimit", "migStrategy", "migProfiles")
_MPS_KEYS = (
    "daemon",
    "externalPipeDirectory",
    "root",
    "containerPipeDirectory",
    "defaultThreadPercentage",
    "defaultPinnedMemoryMiB",
)


@dataclass(frozen=True, slots=True)
class Sharing:
    """How one GPU is shared (the mode applies when its MIG mode is off)."""

    mode: SharingMode = SharingMode.EXCLUSIVE
    replicas: int = 1
    mps_client_limit: int = DEFAULT_MPS_CLIENTS
    mig_strategy: str = "dynamic"
    mig_profiles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MpsSettings:
    daemon: str = "auto"
    external_pipe_directory: str = "/run/nvidia/mps/nvidia.com/gpu/pipe"
    root: str = "/run/gpuslice/mps"
    container_pipe_directory: str = "/run/gpuslice/mps-pipe"
    default_thread_percentage: int = 100
    default_pinned_memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    address: str = "127.0.0.1"
    port: int = 9402  # 0: no HTTP endpoint
    pod_names: bool = False  # the share series' pod label: the pod's name if True, else its UID


@dataclass(frozen=True, slots=True)
class MeasureSettings:
    proc_root: str = "/proc"
    publish_s: float = 30.0
    stray_round_mib: int = 256
    stray_grace_s: float = 30.0
    stray_event_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class OverrunSettings:
    grace_s: float = 60.0
    tolerance_mib: int = 0
    action: str = "report"
    namespaces: Mapping[str, str] = field(default_factory=dict)

    def action_for(self, namespace: str) -> str:
        return self.namespaces.get(namespace, self.action)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    prefix: str = DEFAULT_PREFIX
    resource: str = DEFAULT_RESOURCE
    share_slots: int = 128
    device_plugin_dir: str = DEVICE_PLUGIN_DIR
    socket_name: str = SOCKET_NAME
    units_resource: str = DEFAULT_UNITS_RESOURCE  # "": the GPU units are not advertised
    units_socket_name: str = UNITS_SOCKET_NAME
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    cdi_kind: str = CDI_KIND
    sharing: Sharing = field(default_factory=Sharing)
    gpus: Mapping[int, Sharing] = field(default_factory=dict)
    mps_compute_oversub_pct: int = 100
    ts_memory_oversub_pct: int = 100
    mps: MpsSettings = field(default_factory=MpsSettings)
    cdi_refresh: tuple[str, ...] = ()
    poll_s: float = 2.0
    admit_wait_s: float = 5.0
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    overrun: OverrunSettings = field(default_factory=OverrunSettings)

    def sharing_of(self, index: int) -> Sharing:
        return self.gpus.get(index, self.sharing)


# ---------------------------------------------------------------- reading


def _keys(path: str, raw: object, accepted: tuple[str, ...]) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: must be a mapping")
    unknown = sorted(str(k) for k in set(raw) - set(accepted))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown key; accepted: {', '.join(accepted)}")
    return raw


def _int(path: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{path}: must be a whole number {span}, got {value!r}")
    return value


def _str(path: str, value: object, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise ConfigError(f"{path}: must be a {'' if empty else 'non-empty '}string, got {value!r}")
    return value


def _seconds(path: str, value: object, high: float = 600) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
        raise ConfigError(f"{path}: must be a number of seconds in (0, {high:g}], got {value!r}")
    return float(value)


def _action(path: str, value: object) -> str:
    if value not in OVERRUN_ACTIONS:
        raise ConfigError(f"{path}: {value!r}; accepted: {', '.join(OVERRUN_ACTIONS)}")
    return str(value)


def _metrics(raw: object) -> MetricsSettings:
    body = _keys("agent.metrics", raw, ("address", "port", "podNames"))
    base = MetricsSettings()
    names = body.get("podNames", base.pod_names)
    if not isinstance(names, bool):
        raise ConfigError(f"agent.metrics.podNames: {names!r}; accepted: true or false")
    return MetricsSettings(
        _str("agent.metrics.address", body.get("address", base.address)),
        _int("agent.metrics.port", body.get("port", base.port), 0, 65535),
        names,
    )


def _measure(raw: object) -> MeasureSettings:
    body = _keys("agent.measure", raw, _MEASURE_KEYS)
    base = MeasureSettings()
    return MeasureSettings(
        _str("agent.measure.procRoot", body.get("procRoot", base.proc_root)),
        _seconds("agent.measure.publishSeconds", body.get("publishSeconds", base.publish_s), 3600),
        _int("agent.measure.strayRoundMiB", body.get("strayRoundMiB", base.stray_round_mib), 1, 65536),
        _seconds("agent.measure.strayGraceSeconds", body.get("strayGraceSeconds", base.stray_grace_s), 86400),
        _seconds("agent.measure.strayEventSeconds", body.get("strayEventSeconds", base.stray_event_s), 86400),
    )


def _overrun(raw: object) -> OverrunSettings:
    body = _keys("agent.overrun", raw, _OVERRUN_KEYS)
    base = OverrunSettings()
    namespaces = body.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise ConfigError("agent.overrun.namespaces: must be a mapping of namespace to report or evict")
    for name in namespaces:
        if not isinstance(name, str) or not _NAMESPACE.match(name):
            raise ConfigError(f"agent.overrun.namespaces: {name!r} is not a namespace name")
    return OverrunSettings(
        _seconds("agent.overrun.graceSeconds", body.get("graceSeconds", base.grace_s), 86400),
        _int("agent.overrun.toleranceMiB", body.get("toleranceMiB", base.tolerance_mib), 0),
        _action("agent.overrun.action", body.get("action", base.action)),
        {n: _action(f"agent.overrun.namespaces.{n}", a) for n, a in namespaces.items()},
    )


def _sharing(path: str, raw: object, base: Sharing) -> Sharing:
    body = _keys(path, raw, _SHARING_KEYS)
    mode = body.get("mode", base.mode.value)
    parsed = modes.parse(mode) if isinstance(mode, str) else None
    if parsed is None:
        raise ConfigError(f"{path}.mode: {mode!r}; accepted: {modes.accepted()}")
    strategy = body.get("migStrategy", base.mig_strategy)
    if strategy not in MIG_STRATEGIES:
        raise ConfigError(f"{path}.migStrategy: {strategy!r}; accepted: {', '.join(MIG_STRATEGIES)}")
    profiles = body.get("migProfiles", list(base.mig_profiles))
    if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
        raise ConfigError(f"{path}.migProfiles: must be a list of MIG profile names such as 1g.10gb")
    return Sharing(
        parsed,
        _int(f"{path}.replicas", body.get("replicas", base.replicas), 1, 64),
        _int(f"{path}.mpsClientLimit", body.get("mpsClientLimit", base.mps_client_limit), 1, 48),
        str(strategy),
        tuple(profiles),
    )


def _device_plugin_sharing(path: str, base: Sharing) -> dict[str, Sharing]:
    """The NVIDIA device plugin's sharing config (``sharing.timeSlicing`` / ``sharing.mps``, resource
    ``nvidia.com/gpu``) as per-GPU sharing: ``{"*": ...}`` for all GPUs, else by index or UUID."""
    try:
        body = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"nvidiaDevicePluginConfig: cannot read {path}: {exc}") from exc
    sharing = body.get("sharing") if isinstance(body, Mapping) else None
    out: dict[str, Sharing] = {}
    if not isinstance(sharing, Mapping):
        return out
    for key, mode in (("timeSlicing", SharingMode.TIME_SLICING), ("mps", SharingMode.MPS)):
        section = sharing.get(key)
        resources = section.get("resources") if isinstance(section, Mapping) else None
        for k, res in enumerate(resources or []):
            where = f"nvidiaDevicePluginConfig: sharing.{key}.resources[{k}]"
            if not isinstance(res, Mapping) or res.get("name") != "nvidia.com/gpu":
                continue
            replicas = _int(f"{where}.replicas", res.get("replicas"), 1, 64)
            one = Sharing(mode, replicas, max(replicas, 1) if mode is SharingMode.MPS else base.mps_client_limit)
            devices = res.get("devices", "all")
            for device in devices if isinstance(devices, list) else ["*"]:
                out[str(device)] = one
    return out


def load_config(path: str | None, node: str, environ: Mapping[str, str]) -> AgentConfig:
    """The configuration file (None: defaults) with the node name from ``node``, the file or
    ``$NODE_NAME``; every problem is a ConfigError naming the field."""
    raw: object = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"agent config {path}: cannot read: {exc}") from exc
    body = _keys("agent", raw, _TOP_KEYS)
    name = node or body.get("node") or environ.get("NODE_NAME", "")
    if not name:
        raise ConfigError("agent.node: no node name; give --node, node: in the config, or $NODE_NAME")
    prefix = _str("agent.prefix", body.get("prefix", DEFAULT_PREFIX))
    resource = _str("agent.resource", body.get("resource", DEFAULT_RESOURCE))
    if not _RESOURCE.match(resource):
        raise ConfigError(f"agent.resource: {resource!r} must be an extended resource name such as {DEFAULT_RESOURCE}")
    units = _str("agent.unitsResource", body.get("unitsResource", DEFAULT_UNITS_RESOURCE), empty=True)
    if units and (not _RESOURCE.match(units) or units == resource):
        raise ConfigError(
            f"agent.unitsResource: {units!r} must be an extended resource name other than agent.resource, "
            f'such as {DEFAULT_UNITS_RESOURCE} (or "" not to advertise GPU units)'
        )
    units_socket = _str("agent.unitsSocketName", body.get("unitsSocketName", UNITS_SOCKET_NAME))
    sharing = _sharing("agent.sharing", body.get("sharing"), Sharing())
    per_gpu: dict[int, Sharing] = {}
    plugin_file = _str("agent.nvidiaDevicePluginConfig", body.get("nvidiaDevicePluginConfig", ""), empty=True)
    if plugin_file:
        from_plugin = _device_plugin_sharing(plugin_file, sharing)
        sharing = from_plugin.pop("*", sharing)
        for key, value in from_plugin.items():
            if key.isdigit():
                per_gpu[int(key)] = value
    gpus = body.get("gpus") or {}
    if not isinstance(gpus, Mapping):
        raise ConfigError("agent.gpus: must be a mapping of GPU index to sharing settings")
    for key, value in gpus.items():
        if not str(key).isdigit():
            raise ConfigError(f"agent.gpus.{key}: keys are GPU indices (0, 1, ...)")
        per_gpu[int(key)] = _sharing(f"agent.gpus.{key}", value, per_gpu.get(int(key), sharing))
    over = _keys("agent.oversubscription", body.get("oversubscription"), ("mpsComputePct", "timeSlicingMemoryPct"))
    mps = _keys("agent.mps", body.get("mps"), _MPS_KEYS)
    daemon = mps.get("daemon", "auto")
    if daemon not in MPS_DAEMONS:
        raise ConfigError(f"agent.mps.daemon: {daemon!r}; accepted: {', '.join(MPS_DAEMONS)}")
    defaults = MpsSettings()
    refresh = body.get("cdiRefresh") or []
    if not isinstance(refresh, list) or not all(isinstance(a, str) and a for a in refresh):
        raise ConfigError("agent.cdiRefresh: must be a command as a list of strings, such as [nvidia-ctk, cdi, ...]")
    poll = body.get("pollSeconds", 2)
    wait = body.get("admitWaitSeconds", 5)
    for key, value in (("pollSeconds", poll), ("admitWaitSeconds", wait)):
        _seconds(f"agent.{key}", value)
    return AgentConfig(
        node=_str("agent.node", name),
        prefix=prefix,
        resource=resource,
        share_slots=_int("agent.shareSlots", body.get("shareSlots", 128), 1, 4096),
        device_plugin_dir=_str("agent.devicePluginDir", body.get("devicePluginDir", DEVICE_PLUGIN_DIR)),
        socket_name=_str("agent.socketName", body.get("socketName", SOCKET_NAME)),
        units_resource=units,
        units_socket_name=units_socket,
        pod_resources_socket=_str(
            "agent.podResourcesSocket", body.get("podResourcesSocket", POD_RESOURCES_SOCKET), empty=True
        ),
        cdi_kind=_str("agent.cdiKind", body.get("cdiKind", CDI_KIND)),
        sharing=sharing,
        gpus=per_gpu,
        mps_compute_oversub_pct=_int("agent.oversubscription.mpsComputePct", over.get("mpsComputePct", 100), 100),
        ts_memory_oversub_pct=_int(
            "agent.oversubscription.timeSlicingMemoryPct", over.get("timeSlicingMemoryPct", 100), 100
        ),
        mps=MpsSettings(
            str(daemon),
            _str("agent.mps.externalPipeDirectory", mps.get("externalPipeDirectory", defaults.external_pipe_directory)),
            _str("agent.mps.root", mps.get("root", defaults.root)),
            _str(
                "agent.mps.containerPipeDirectory",
                mps.get("containerPipeDirectory", defaults.container_pipe_directory),
            ),
            _int("agent.mps.defaultThreadPercentage", mps.get("defaultThreadPercentage", 100), 1, 100),
            _int("agent.mps.defaultPinnedMemoryMiB", mps.get("defaultPinnedMemoryMiB", 0), 0),
        ),
        cdi_refresh=tuple(refresh),
        poll_s=float(poll),
        admit_wait_s=float(wait),
        metrics=_metrics(body.get("metrics")),
        measure=_measure(body.get("measure")),
        overrun=_overrun(body.get("overrun")),
    )
