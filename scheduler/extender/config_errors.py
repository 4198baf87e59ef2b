"""pydantic's validation errors said the way an operator reads them.

pydantic says ``Extra inputs are not permitted`` and ``Input should be less than or equal
to 65535``; an operator needs where the value came from (``--port``, ``GPUSLICE_PORT`` or
``gpuslice.yaml: port``), the value, and what is accepted: the keys of that section for an
unknown key (with the closest one when it looks misspelt), the range for a number, the
choices for a fixed set. Everything here is read from the models' fields, so a new
setting is described without a line added here.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from scheduler.core.policies.options import Loc, unwrap


def dotted(loc: Loc) -> str:
    """``policy.workload[1].gpu-fraction``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith(("function-", "tagged-")):
            out += ("." if out else "") + part
    return out or "(the file)"


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def keys(model: type[BaseModel]) -> list[str]:
    """The keys a section accepts, as they are written in the file."""
    return [info.alias or name for name, info in model.model_fields.items()]


def section(root: type[BaseModel], loc: Loc) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the last key of ``loc``, and that key's field."""
    model: type[BaseModel] | None = root
    info: FieldInfo | None = None
    for i, part in enumerate(loc):
        if model is None:
            return None, None
        if isinstance(part, int):
            continue  # an item of a list: the same model
        info = _field(model, part)
        if info is None:
            return model, None
        if i == len(loc) - 1:
            return model, info
        inner = unwrap(info.annotation)
        if typing.get_origin(inner) is tuple:
            inner = unwrap(typing.get_args(inner)[0])
        model = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
    return model, info


def _number(value: Any) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _bounds(info: FieldInfo) -> str:
    low = high = ""
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"from {_number(item.ge)}"
        elif isinstance(item, annotated_types.Gt):
            low = f"greater than {_number(item.gt)}"
        elif isinstance(item, annotated_types.Le):
            high = f"to {_number(item.le)}" if low.startswith("from") or not low else f"up to {_number(item.le)}"
        elif isinstance(item, annotated_types.Lt):
            high = f"below {_number(item.lt)}"
    if low and high:
        return f"{low} {high}" if low.startswith("from") else f"{low}, {high}"
    if low.startswith("from"):
        return low.replace("from ", "") + " or more"
    if high.startswith("to"):
        return "up " + high
    return low or high


def accepted(info: FieldInfo | None) -> str:
    """What a field accepts, in words: ``a whole number from 0 to 65535``."""
    if info is None:
        return ""
    kind = unwrap(info.annotation)
    origin = typing.get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(kind))
    if origin in (typing.Union, types.UnionType):
        kinds = {unwrap(a) for a in typing.get_args(kind) if a is not type(None)}
        kind = int if kinds <= {int, str} else kind  # a quantity: 4 or "500m"
    if origin is tuple:
        return "a list"
    words = {int: "a whole number", float: "a number", str: "text", bool: "true or false", Path: "a file path"}
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return "a mapping with the keys " + ", ".join(keys(kind))
    text = words.get(kind, "") if isinstance(kind, type) else ""
    bounds = _bounds(info)
    return f"{text} {bounds}".strip() if text else bounds


def explain(error: ErrorDetails, root: type[BaseModel], where: str) -> str:
    """One error as a line: ``<where> <value>: accepted: ...`` or ``<where>: <why>``."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if not where:  # a rule across fields (tls_cert and tls_key): the message names them
        return str((error.get("ctx") or {}).get("error", error["msg"]))
    value = error.get("input")
    model, info = section(root, loc)
    if kind == "extra_forbidden" and model is not None:
        known = keys(model)
        near = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return f"{where}: unknown key{hint}; accepted: {', '.join(known)}"
    if kind == "missing":
        return f"{where}: required; accepted: {accepted(info) or 'a value'}"
    if kind in ("value_error", "assertion_error"):
        ctx = error.get("ctx") or {}
        return f"{where}: {ctx.get('error', error['msg'])}"
    if kind == "literal_error":
        expected = str((error.get("ctx") or {}).get("expected", "")).replace("'", "")
        return f"{where} {value!r}: accepted: {expected}"
    words = accepted(info)
    if words:
        shown = "" if isinstance(value, Mapping) else f" {value!r}"
        return f"{where}{shown}: accepted: {words}"
    return f"{where}: {error['msg']}"


__all__ = ["accepted", "dotted", "explain", "keys", "section"]
