"""The server's own CPU a scheduling attempt, without HTTP or the machine's noise between runs:
a driver run's calls recorded once, then replayed in-process, verb by verb, against gpuslice,
the floor and the do-nothing extender; the answers compared byte for byte between two builds.

``record`` runs :mod:`extender_driver`'s kube-scheduler loop against ``gpuslice serve`` over
HTTP, exactly as the driver does, and keeps every call (path, body, answer) in the order the
server answered them (one call at a time: the binds, sent from the loop's threads, wait their
turn), with the cluster file it served::

    python benchmarks/replay_calls.py record DIR --nodes 5000 --fill 0.85 --policy fgd-reserve

``replay`` builds each server afresh from the cluster file (gpuslice as ``gpuslice serve
--cluster-file`` builds it, synced; the floor and the do-nothing extender as the driver serves
them) and hands it the recorded calls through its ASGI entry point, no socket in between. Per
verb it prints the CPU a scheduling attempt of the run (the attempts after the run, the driver's
first calls of new shapes and of pods that fit nowhere, are timed apart: the slowest are listed),
the least and the median over ``--repeat`` builds, and gpuslice's total against the floor's
(the speed issue's "x floor CPU", here without the HTTP stack both share)::

    python benchmarks/replay_calls.py replay DIR --repeat 3
    python benchmarks/replay_calls.py replay DIR --what gpuslice --save before.bin   # then, on another build:
    python benchmarks/replay_calls.py replay DIR --what gpuslice --compare before.bin

The replayed answers are gpuslice's over HTTP in the recorded run, byte for byte (the
recording keeps them; ``--compare DIR/calls.bin`` checks it), so a change that must keep every
record, reason and score can be checked on thousands of real calls, and timed on the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extender_driver as driver

VERBS = (b"/filter", b"/prioritize", b"/bind")
WHAT = ("gpuslice", "floor", "noop")
_HEADER = struct.Struct("<III")  # lengths of path, body and answer


class ReplayError(RuntimeError):
    """A recording that cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Call:
    path: bytes
    body: bytes
    answer: bytes


@dataclass(frozen=True, slots=True)
class Recording:
    policy: str
    run: int  # the calls of the run proper; those after it are the driver's first calls
    calls: list[Call]


def write_calls(path: Path, calls: Sequence[Call]) -> None:
    with path.open("wb") as out:
        for call in calls:
            out.write(_HEADER.pack(len(call.path), len(call.body), len(call.answer)))
            out.write(call.path + call.body + call.answer)


def read_calls(path: Path) -> list[Call]:
    """The calls of ``path`` (a ``calls.bin`` or a ``--save`` file); ReplayError if it is not one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read: {exc.strerror or exc}") from None
    calls: list[Call] = []
    at = 0
    while at < len(data):
        if at + _HEADER.size > len(data):
            raise ReplayError(f"{path}: truncated at byte {at}; accepted: a file written by record or --save")
        lengths = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        end = at + sum(lengths)
        if end > len(data):
            raise ReplayError(f"{path}: truncated at byte {at}; accepted: a file written by record or --save")
        a, b = at + lengths[0], at + lengths[0] + lengths[1]
        calls.append(Call(data[at:a], data[a:b], data[b:end]))
        at = end
    return calls


def load(directory: Path) -> Recording:
    meta = directory / "recording.txt"
    try:
        policy, run = meta.read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        raise ReplayError(
            f"{directory}: no recording here (recording.txt unreadable); make one with: record {directory}"
        ) from None
    if not run.isdigit() or not (directory / "cluster.json").is_file():
        raise ReplayError(f"{directory}: recording.txt or cluster.json is not what record writes")
    return Recording(policy, int(run), read_calls(directory / "calls.bin"))


def record(args: argparse.Namespace) -> None:
    directory = Path(args.directory)
    directory.mkdir(parents=True, exist_ok=True)
    cluster_file = directory / "cluster.json"
    cluster = driver.write_cluster(cluster_file, args.nodes, args.pods + args.warmup, args.seed, args.mix, args.fill)
    calls: list[Call] = []
    lock = threading.Lock()
    post = driver.Connection._post

    def recorded(self: Any, path: bytes, body: bytes) -> bytes:
        with lock:  # one call at a time: the order the server answered them is the order kept
            answer: bytes = post(self, path, body)
            calls.append(Call(path, body, answer))
            return answer

    driver.Connection._post = recorded  # type: ignore[method-assign]
    try:
        port = driver.free_port()
        command = driver.serve_command(cluster_file, port, args.policy)
        with driver.running(command, port, directory / "serve.log", None) as (_, pid):
            scheduler = driver.KubeScheduler(
                port, cluster.nodes, cluster.running, percentage=driver.SAMPLING[args.sampling]
            )
            got = scheduler.run(cluster.pending, args.warmup, pid)
            run = len(calls)
            scheduler.first_calls(got, server=pid)
    finally:
        driver.Connection._post = post  # type: ignore[method-assign]
    write_calls(directory / "calls.bin", calls)
    (directory / "recording.txt").write_text(f"{args.policy} {run}\n", encoding="utf-8")
    print(
        f"recorded {len(calls)} calls in {directory} ({run} in the run: {got.attempts} attempts measured, "
        f"{got.bound} bound); then {len(calls) - run} first calls"
    )


def build(what: str, cluster_file: Path, policy: str) -> tuple[Any, Callable[[], None]]:
    """An ASGI app serving ``cluster_file`` as ``what``, ready; and how to stop it."""
    if what == "floor":
        return driver.floor_app(cluster_file), lambda: None
    if what == "noop":
        return driver.noop_app(), lambda: None
    from scheduler.extender.app import create_app
    from scheduler.extender.config import PolicyConfig, ServeConfig
    from scheduler.extender.service import Extender
    from scheduler.filebackend import FileBackend

    config = ServeConfig(policy=PolicyConfig(name=policy), max_body_bytes=driver.BODY_CAP)
    extender = Extender(config, FileBackend(cluster_file, config.prefix))
    extender.start()
    return create_app(extender, ()), extender.stop


async def _call(app: Any, path: bytes, body: bytes) -> bytes:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path.decode(),
        "raw_path": path,
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 10260),
    }
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(sent)


@dataclass
class Timing:
    per_verb: dict[bytes, float]  # CPU ms a scheduling attempt of the run
    attempts: int
    first_calls: list[tuple[float, bytes]]  # (CPU ms, path) of the calls after the run
    answers: list[bytes]

    @property
    def total(self) -> float:
        return sum(self.per_verb.values())


def replay_once(what: str, recording: Recording, cluster_file: Path) -> Timing:
    app, stop = build(what, cluster_file, recording.policy)
    spent = dict.fromkeys(VERBS, 0.0)
    first: list[tuple[float, bytes]] = []
    answers: list[bytes] = []

    async def play() -> None:
        for k, call in enumerate(recording.calls):
            started = time.process_time()
            answers.append(await _call(app, call.path, call.body))
            took = time.process_time() - started
            if k < recording.run:
                spent[call.path] = spent.get(call.path, 0.0) + took
            else:
                first.append((took * 1000, call.path))

    gc.collect()
    gc.freeze()  # as gpuslice serve does once synced
    try:
        asyncio.run(play())
    finally:
        gc.unfreeze()
        stop()
    attempts = max(1, sum(1 for call in recording.calls[: recording.run] if call.path == b"/filter"))
    return Timing({p: s * 1000 / attempts for p, s in spent.items()}, attempts, first, answers)


def _lines(what: str, timings: Sequence[Timing]) -> Iterator[str]:
    for k, t in enumerate(timings):
        verbs = ", ".join(f"{p.decode()[1:]} {v:.3f}" for p, v in t.per_verb.items())
        yield f"{what} build {k + 1}: {verbs} | {t.total:.3f} ms an attempt ({t.attempts} attempts)"
    totals = [t.total for t in timings]
    yield f"{what}: least {min(totals):.3f}, median {statistics.median(totals):.3f} ms an attempt"


def replay(args: argparse.Namespace) -> None:
    directory = Path(args.directory)
    recording = load(directory)
    cluster_file = directory / "cluster.json"
    least: dict[str, float] = {}
    kept: list[bytes] = []
    for what in args.what:
        timings = [replay_once(what, recording, cluster_file) for _ in range(args.repeat)]
        for line in _lines(what, timings):
            print(line, flush=True)
        least[what] = min(t.total for t in timings)
        if what == "gpuslice":
            kept = timings[-1].answers
            slow = sorted(timings[-1].first_calls, reverse=True)[:5]
            if slow:
                print("  the slowest first calls: " + ", ".join(f"{ms:.1f} ms {p.decode()[1:]}" for ms, p in slow))
    if "gpuslice" in least and "floor" in least:
        print(f"gpuslice against the floor (least of each): {least['gpuslice'] / least['floor']:.2f} x")
    if args.save and kept:
        write_calls(Path(args.save), [Call(c.path, c.body, a) for c, a in zip(recording.calls, kept, strict=True)])
    if args.compare:
        if not kept:
            raise ReplayError("--compare needs gpuslice among --what: its answers are what is compared")
        other = [c.answer for c in read_calls(Path(args.compare))]
        if len(other) != len(kept):
            raise ReplayError(f"{args.compare}: {len(other)} answers, this recording has {len(kept)} calls")
        differ = [k for k, (a, b) in enumerate(zip(other, kept, strict=True)) if a != b]
        print(f"answers against {args.compare}: {len(kept) - len(differ)} of {len(kept)} the same")
        for k in differ[:3]:
            call = recording.calls[k]
            print(f"  call {k} {call.path.decode()}: was {other[k][:160]!r}, now {kept[k][:160]!r}")
        if differ:
            raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="command", required=True)
    rec = verbs.add_parser("record", help="run the driver against gpuslice serve and keep every call")
    rec.add_argument("directory")
    rec.add_argument("--nodes", type=int, default=5000)
    rec.add_argument("--fill", type=float, default=0.0)
    rec.add_argument("--policy", choices=sorted(driver.POLICIES), default="fgd-reserve")
    rec.add_argument("--mix", choices=sorted(driver.MIXES), default="many")
    rec.add_argument("--sampling", choices=sorted(driver.SAMPLING), default="default")
    rec.add_argument("--pods", type=int, default=600)
    rec.add_argument("--warmup", type=int, default=200)
    rec.add_argument("--seed", type=int, default=1)
    play = verbs.add_parser("replay", help="replay a recording in-process, verb by verb")
    play.add_argument("directory")
    play.add_argument("--what", nargs="+", choices=WHAT, default=list(WHAT))
    play.add_argument("--repeat", type=int, default=3)
    play.add_argument("--save", help="write gpuslice's answers here (for --compare on another build)")
    play.add_argument("--compare", help="a --save file (or the recording's calls.bin): report answers that differ")
    args = parser.parse_args(argv)
    for name in ("nodes", "pods", "repeat"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name} {getattr(args, name)}: accepted: 1 or more")
    if args.command == "record" and not (0 <= args.fill < 1 and args.warmup >= 0):
        parser.error(
            f"--fill {args.fill} --warmup {args.warmup}: accepted: a fill from 0 to below 1, a warmup of 0 or more"
        )
    try:
        record(args) if args.command == "record" else replay(args)
    except ReplayError as exc:
        raise SystemExit(f"replay_calls: {exc}") from None


if __name__ == "__main__":
    main()
