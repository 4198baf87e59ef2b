"""Log lines: text for a person at a terminal, JSON lines for a pipeline; the same fields."""

from __future__ import annotations

import io
import json
import re

from scheduler import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def emit(stream: io.StringIO, fmt: str | None) -> str:
    logs.configure("info", stream, fmt)
    logs.get("serve").info("listening", extra={"url": "http://127.0.0.1:8686", "verbs": ["/filter"], "node": None})
    return stream.getvalue()


def test_text_on_a_terminal_json_elsewhere(restore_logging: None) -> None:
    text = emit(Terminal(), None)
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3} info    serve listening url=http://127.0.0.1:8686 verbs=\[\"/filter\"\]\n", text
    )
    line = json.loads(emit(io.StringIO(), None))
    assert (line["level"], line["logger"], line["msg"], line["url"]) == (
        "info",
        "gpuslice.serve",
        "listening",
        "http://127.0.0.1:8686",
    )


def test_the_format_asked_for_wins(restore_logging: None) -> None:
    assert json.loads(emit(Terminal(), "json"))["msg"] == "listening"
    assert " serve listening " in emit(io.StringIO(), "text")


def test_a_text_value_with_spaces_is_quoted(restore_logging: None) -> None:
    stream = Terminal()
    logs.configure("info", stream, "text")
    logs.get("cache").warning("node unusable", extra={"node": "bad", "reason": "unknown key 'mdoe'"})
    assert stream.getvalue().rstrip().endswith("node=bad reason=\"unknown key 'mdoe'\"")
