"""Logs: one line per event, with the pod and node of every decision.

Two formats of the same records: ``json`` (one object per line, for a log pipeline; the
default when stderr is not a terminal) and ``text`` (``12:00:01.250 info serve listening
url=http://127.0.0.1:8686 ...``, for a person at a terminal).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is logged.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}

LOGGER = "gpuslice"
FORMATS = ("text", "json")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """``HH:MM:SS.mmm level logger message key=value ...`` (local time), on one line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        name = record.name.removeprefix(LOGGER + ".")
        parts = [stamp, f"{record.levelname.lower():<7}", name, record.getMessage()]
        for key, value in _fields(record).items():
            if value is None:
                continue
            text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
            parts.append(f"{key}={text if text and ' ' not in text else repr(text)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def default_format(stream: Any = None) -> str:
    """``text`` when the stream (stderr) is a terminal, else ``json``."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure(level: str = "info", stream: Any = None, fmt: str | None = None) -> None:
    """Send the ``gpuslice`` loggers (and uvicorn's) to ``stream`` (stderr) in ``fmt``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    chosen = fmt or default_format(handler.stream)
    handler.setFormatter(TextFormatter() if chosen == "text" else JsonFormatter())
    for name in (LOGGER, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}")
