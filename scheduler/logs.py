"""Structured logs: one JSON object per line, with the pod and node of every decision."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is logged.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}

LOGGER = "gpuslice"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def configure(level: str = "info", stream: Any = None) -> None:
    """Send the ``gpuslice`` loggers (and uvicorn's) to ``stream`` as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in (LOGGER, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}")
