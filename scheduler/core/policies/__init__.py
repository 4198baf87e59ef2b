"""Placement policies, each in its own module, registered by config name (see ``base``)."""

from . import bestfit, binpack, dotprod, fgd, fgdcpu, fgdreserve, gpuclustering, gpupacking, random, spread
from .base import REGISTRY, Cluster, Context, Policy, Reads, fork, make_policy, options_of, register, tell

__all__ = [
    "REGISTRY",
    "Cluster",
    "Context",
    "Policy",
    "Reads",
    "bestfit",
    "binpack",
    "dotprod",
    "fgd",
    "fgdcpu",
    "fgdreserve",
    "fork",
    "gpuclustering",
    "gpupacking",
    "make_policy",
    "options_of",
    "random",
    "register",
    "spread",
    "tell",
]
