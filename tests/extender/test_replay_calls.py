"""benchmarks/replay_calls.py: a recorded driver run, replayed in-process, answers exactly as
``gpuslice serve`` answered it over HTTP (so that the same calls can time two builds and hold a
speed change to the same records, reasons and scores), and a changed answer is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.driver import benchmark

replay_calls = benchmark("replay_calls")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("recording")
    replay_calls.main(
        ["record", str(directory), "--nodes", "60", "--pods", "30", "--warmup", "5", "--fill", "0.5", "--seed", "4"]
    )
    return directory


def test_a_replay_answers_every_call_as_the_server_did_over_http(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = replay_calls.load(recorded)
    paths = {call.path for call in recording.calls}
    assert {b"/filter", b"/prioritize", b"/bind"} <= paths and 0 < recording.run < len(recording.calls)
    timing = replay_calls.replay_once("gpuslice", recording, recorded / "cluster.json")
    assert timing.answers == [call.answer for call in recording.calls]
    assert timing.attempts >= 30 and all(v > 0 for v in timing.per_verb.values())
    assert len(timing.first_calls) == len(recording.calls) - recording.run

    replay_calls.main(["replay", str(recorded), "--repeat", "1", "--compare", str(recorded / "calls.bin")])
    out = capsys.readouterr().out
    n = len(recording.calls)
    assert f"answers against {recorded / 'calls.bin'}: {n} of {n} the same" in out
    for what in ("gpuslice", "floor", "noop"):
        assert f"{what}: least " in out
    assert "gpuslice against the floor (least of each): " in out


def test_an_answer_that_changed_is_reported_and_fails_the_comparison(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = replay_calls.read_calls(recorded / "calls.bin")
    k = next(i for i, call in enumerate(calls) if call.path == b"/prioritize")
    calls[k] = replay_calls.Call(calls[k].path, calls[k].body, b"[]")
    before = tmp_path / "before.bin"
    replay_calls.write_calls(before, calls)
    with pytest.raises(SystemExit) as exited:
        replay_calls.main(["replay", str(recorded), "--what", "gpuslice", "--repeat", "1", "--compare", str(before)])
    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert f"{len(calls) - 1} of {len(calls)} the same" in out
    assert f"call {k} /prioritize: was b'[]'" in out


def test_a_file_that_is_not_a_recording_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "calls.bin"
    bad.write_bytes(b"\x05\x00\x00\x00\x09")
    with pytest.raises(replay_calls.ReplayError, match=r"calls.bin: truncated at byte 0; accepted: a file written by"):
        replay_calls.read_calls(bad)
    with pytest.raises(SystemExit, match=r"no recording here \(recording.txt unreadable\); make one with: record"):
        replay_calls.main(["replay", str(tmp_path)])
