"""A policy's options, checked in one place: the keys here (an unknown one, at any depth, named
with the closest known one), the values by each options dataclass itself (``__post_init__``).

The faces only read the options in: the simulator from a mapping (:func:`.base.make_policy`), the
service from its configuration file, whose loader turns the values into their types first and
reports each problem by its path in the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

Loc = tuple[int | str, ...]


def unwrap(annotation: Any) -> Any:
    """The type inside ``X | None``, ``tuple[X, ...]`` and ``Annotated[X, ...]``."""
    while True:
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if (origin in (typing.Union, types.UnionType) and len(args) == 1) or origin is typing.Annotated:
            annotation = args[0]
        else:
            return annotation


def unknown_options(kind: type, values: Any, path: Loc = ()) -> list[tuple[Loc, list[str], str]]:
    """The keys of ``values`` that no field of the dataclass ``kind`` (or of a dataclass inside
    it, in a list too) names: (where, the keys accepted there, the closest one or "").

    A dataclass built from a mapping that pydantic checked ignores such keys; a misspelt option
    must not pass unseen. Keys are compared with dashes as underscores (``gpu-fraction`` is
    ``gpu_fraction``).
    """
    if not (dataclasses.is_dataclass(kind) and isinstance(values, Mapping)):
        return []
    fields = {f.name: f for f in dataclasses.fields(kind)}
    names = [n.replace("_", "-") if n.startswith(("gpu_", "mig_")) else n for n in fields]
    found: list[tuple[Loc, list[str], str]] = []
    for key, value in values.items():
        field = fields.get(str(key).replace("-", "_"))
        if field is None:
            near = difflib.get_close_matches(str(key), names, n=1)
            found.append(((*path, key), names, near[0] if near else ""))
            continue
        inner = unwrap(field.type if not isinstance(field.type, str) else typing.get_type_hints(kind)[field.name])
        if typing.get_origin(inner) in (tuple, list):
            element = unwrap(typing.get_args(inner)[0])
            for i, item in enumerate(value if isinstance(value, list | tuple) else []):
                found.extend(unknown_options(element, item, (*path, key, i)))
        else:
            found.extend(unknown_options(inner, value, (*path, key)))
    return found
