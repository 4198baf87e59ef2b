"""The packing core: pure, typed, no I/O. The extender and the simulator both call it.

Layering inside the core (lower never imports higher):
errors, quantity -> catalog -> inventory -> request -> allocation -> mig -> capacity
-> state -> fit -> (preempt, fragmentation) -> policies -> select -> (board, defrag).
"""

from .allocation import Allocation, DeviceShare, MigSlot, decode_record, encode_record
from .board import Board, Outcomes, Status
from .catalog import CATALOG, GpuModel, lookup_model
from .errors import ConfigError, GpusliceError, InventoryError, RecordError, RequestError
from .fit import Fit, fit
from .fragmentation import DEFAULT_WORKLOAD, Fragmentation, TypicalWorkload
from .inventory import Device, MigInstance, Node, SharingMode
from .policies import REGISTRY, Context, Policy, make_policy
from .request import DEFAULT_PREFIX, Demand, GpuKind, GpuRequest, PodRequest, parse_pod
from .select import Placement, Ranking, best, evaluate, rank
from .state import NodeState, rebuild

__all__ = [
    "CATALOG",
    "DEFAULT_PREFIX",
    "DEFAULT_WORKLOAD",
    "REGISTRY",
    "Allocation",
    "Board",
    "ConfigError",
    "Context",
    "Demand",
    "Device",
    "DeviceShare",
    "Fit",
    "Fragmentation",
    "GpuKind",
    "GpuModel",
    "GpuRequest",
    "GpusliceError",
    "InventoryError",
    "MigInstance",
    "MigSlot",
    "Node",
    "NodeState",
    "Outcomes",
    "Placement",
    "PodRequest",
    "Policy",
    "Ranking",
    "RecordError",
    "RequestError",
    "SharingMode",
    "Status",
    "TypicalWorkload",
    "best",
    "decode_record",
    "encode_record",
    "evaluate",
    "fit",
    "lookup_model",
    "make_policy",
    "parse_pod",
    "rank",
    "rebuild",
]
