"""Reading the documents: code blocks, inline code, the commands they quote, Markdown tables."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "simulations" / "README.md",
    REPO / "simulations" / "fgd-cpu" / "README.md",
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Block:
    path: Path
    language: str
    text: str


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


def blocks(path: Path) -> list[Block]:
    return [Block(path, m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def prose(path: Path) -> str:
    """The document without its fenced blocks."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def spans(path: Path) -> list[str]:
    """Inline code of the prose and of the tables."""
    return SPAN.findall(prose(path))


def shell_lines(text: str) -> list[str]:
    """A shell block's commands, continuation lines joined, split at ``&&``, ``;`` and ``|``."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: list[str] = []
    for line in joined.splitlines():
        for part in re.split(r"&&|;|\|", line):
            part = part.strip()
            if part and not part.startswith("#"):
                out.append(part)
    return out


def gpuslice_commands(path: Path) -> list[list[str]]:
    """Every ``gpuslice ...`` command quoted, as its arguments (after ``gpuslice``)."""
    lines = [line for b in blocks(path) if b.language in ("", "bash", "sh") for line in shell_lines(b.text)]
    lines += [s for s in spans(path) if re.match(r"(\.venv/bin/)?gpuslice( |$)", s)]
    commands = []
    for line in lines:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # half a command quoted in prose
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
            words = words[1:]
        if words and (words[0] == "gpuslice" or words[0].endswith("/gpuslice")):
            if len(words) > 1 and words[1].endswith(":"):
                continue  # an error message quoted ("gpuslice serve: --port ..."), not a command
            commands.append(words[1:])
    return commands


def tables(path: Path) -> list[list[list[str]]]:
    """Every Markdown table: rows of cells (the header first, the ``---`` row left out)."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def table_after(path: Path, heading: str) -> list[list[str]]:
    """The first table whose header row starts with the cells ``heading`` (``" | a"``: an empty one, then a)."""
    want = [h.strip() for h in heading.split("|")]
    for table in tables(path):
        if table[0][: len(want)] == want:
            return table
    raise AssertionError(f"{name(path)}: no table with the header {heading}")
