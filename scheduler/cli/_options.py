"""Options as the command line gives them (text), checked before any work starts.

Typer converts nothing but flags and text here: a number, a file or a folder is read by
these functions, so that every rejected value gets the same one-line message, naming the
option, the value and what is accepted (``--inflate 'inf': accepted: 0 (as given) or a
ratio up to 10, such as 1.3``), and so that an output folder that cannot be written is
found before a long run, not after it.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from scheduler.core.errors import UsageError


def whole(option: str, text: str, low: int, high: int, accepted: str = "") -> int:
    """``text`` as a whole number in ``low..high``."""
    what = accepted or f"a whole number from {low} to {high}"
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{option} {text!r}: accepted: {what}") from None
    if not low <= value <= high:
        raise UsageError(f"{option} {text!r}: accepted: {what}")
    return value


def ratio(option: str, text: str, low: float, high: float, accepted: str) -> float:
    """``text`` as a finite number in ``low..high`` (``inf`` and ``nan`` are refused)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"{option} {text!r}: accepted: {accepted}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise UsageError(f"{option} {text!r}: accepted: {accepted}")
    return value


def readable_file(option: str, path: Path) -> Path:
    """``path``, a file this process can read (``option``: the option, or "input" for an argument)."""
    if not path.exists():
        raise UsageError(f"{option} {str(path)!r}: no such file")
    if not path.is_file():
        raise UsageError(f"{option} {str(path)!r}: not a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{option} {str(path)!r}: cannot read it (permission denied)")
    return path


EXAMPLE = "example"  # in place of an input file: the package's example of that input


def cluster_file(option: str, path: Path) -> Path:
    """``path``, a file this process can read; ``example`` (where no such file is) names the
    example cluster shipped with the package, as every command that takes a cluster accepts
    (``example-defrag``: the fragmented one)."""
    from scheduler.filebackend import resolve_cluster_file

    return readable_file(option, resolve_cluster_file(str(path)))


def example_or_file(option: str, path: Path, shipped: str) -> Path:
    """``path``, a file this process can read; ``example`` (where no such file is) names the
    package's example file ``shipped`` (in ``scheduler/examples``)."""
    if str(path) == EXAMPLE and not path.exists():
        import importlib.resources

        return Path(str(importlib.resources.files("scheduler") / "examples" / shipped))
    return readable_file(option, path)


def readable_folder(option: str, path: Path) -> Path:
    """``path``, a folder this process can read."""
    if not path.is_dir():
        raise UsageError(f"{option} {str(path)!r}: no such folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"{option} {str(path)!r}: cannot read it (permission denied)")
    return path


def writable_folder(option: str, path: Path) -> Path:
    """``path``, a folder this process can write files in (created if absent).

    Checked by writing (and removing) a file there: permissions, a read-only file system
    and a full disk all show, which ``os.access`` alone would not tell.
    """
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {str(path)!r}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpuslice-write-check-"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {str(path)!r}: cannot write there: {exc.strerror or exc}") from None
    return path


def service_url(option: str, text: str) -> str:
    """``text`` as the URL of a running ``gpuslice serve`` (``http://host:port``)."""
    accepted = "a URL such as http://127.0.0.1:8686 (http or https, a host, an optional port)"
    try:
        parts = urlsplit(text.strip())
        port = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        raise UsageError(f"{option} {text!r}: accepted: {accepted}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise UsageError(f"{option} {text!r}: accepted: {accepted}")
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        raise UsageError(f"{option} {text!r}: accepted: {accepted}, without a path")
    return text.strip().rstrip("/")


def node_name(option: str, text: str) -> str:
    """``text`` as a Kubernetes node name (a DNS subdomain, RFC 1123)."""
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    if len(text) > 253 or not re.fullmatch(rf"{label}(\.{label})*", text):
        raise UsageError(f"{option} {text!r}: accepted: a node name (lower-case letters, digits, '-' and '.')")
    return text


def choice(option: str, text: str, accepted: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value not in accepted:
        raise UsageError(f"{option} {text!r}: accepted: {', '.join(accepted)}")
    return value


__all__ = [
    "choice",
    "cluster_file",
    "example_or_file",
    "node_name",
    "ratio",
    "readable_file",
    "readable_folder",
    "service_url",
    "whole",
    "writable_folder",
]
