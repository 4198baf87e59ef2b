"""The sharing modes, one module each, registered here.

A mode's module holds its capacity rules (fit and refusal texts), what is free on a GPU of
it, its form for the rules of arrays where it has one (:mod:`.shared`), and the facts the node
agent and the admission webhook read of it (:class:`.base.Mode`). Everything else asks
:func:`of` for the mode of a GPU, and lists the modes with :func:`registered`: adding a mode
is its module and one line in :data:`_BUILT_IN` (and its name in
:class:`~scheduler.core.inventory.SharingMode`, the type the records carry).
"""

from __future__ import annotations

from ..inventory import SharingMode
from .base import Mode
from .exclusive import Exclusive
from .mig import Mig
from .mps import Mps
from .timeslicing import TimeSlicing

_REGISTRY: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Make ``mode`` the rules of GPUs of its name (listed after those registered before)."""
    _REGISTRY[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    """Forget the mode of ``name`` (a test's own)."""
    _REGISTRY.pop(name, None)


def of(name: SharingMode) -> Mode:
    """The rules of GPUs in mode ``name``."""
    return _REGISTRY[name]


def registered() -> tuple[Mode, ...]:
    """Every mode, in the order registered."""
    return tuple(_REGISTRY.values())


def arrayable() -> frozenset[str]:
    """The names of the modes whose healthy GPUs the rules of arrays answer."""
    return frozenset(name for name, mode in _REGISTRY.items() if mode.arrayable)


def accepted() -> str:
    """The modes' names, as an error message lists what is accepted."""
    return ", ".join(m.name for m in _REGISTRY.values())


def parse(text: str) -> SharingMode | None:
    """The mode named ``text`` exactly, or None."""
    mode = _REGISTRY.get(text)
    return None if mode is None else mode.name


_BUILT_IN = (Exclusive(), Mps(), TimeSlicing(), Mig())
for _mode in _BUILT_IN:
    register(_mode)

__all__ = ["Mode", "accepted", "arrayable", "of", "parse", "register", "registered", "unregister"]
