"""Placement policies, each in its own module, registered by config name."""

from . import bestfit, binpack, dotprod, fgd, fgdcpu, fgdreserve, gpuclustering, gpupacking, random, spread
from .base import REGISTRY, Policy, make_policy, register

__all__ = [
    "REGISTRY",
    "Policy",
    "bestfit",
    "binpack",
    "dotprod",
    "fgd",
    "fgdcpu",
    "gpuclustering",
    "gpupacking",
    "make_policy",
    "random",
    "register",
    "spread",
]
