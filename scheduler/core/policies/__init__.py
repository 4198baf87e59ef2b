"""Placement policies, each in its own module, registered by config name (see ``base``)."""

from . import bestfit, binpack, dotprod, fgd, fgdcpu, fgdreserve, gpuclustering, gpupacking, random, spread
from .base import (
    REGISTRY,
    Cluster,
    Context,
    Learned,
    Policy,
    Reads,
    make_policy,
    options_of,
    over_a_copy,
    register,
    tell,
)

__all__ = [
    "REGISTRY",
    "Cluster",
    "Context",
    "Learned",
    "Policy",
    "Reads",
    "bestfit",
    "binpack",
    "dotprod",
    "fgd",
    "fgdcpu",
    "fgdreserve",
    "gpuclustering",
    "gpupacking",
    "make_policy",
    "options_of",
    "over_a_copy",
    "random",
    "register",
    "spread",
    "tell",
]
