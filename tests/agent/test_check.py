"""The read-only device check, on fake GPUs: what it prints, that it finds its own process, and that
it never calls a method that changes a GPU."""

from __future__ import annotations

import io
import os
import runpy
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.check import CHECK_MIB, CudaUnavailable, run
from scheduler.agent.fake import FakeGpus
from scheduler.agent.gpus import MigInfo
from scheduler.agent.procs import ProcFs
from tests.agent.kit import no_nvml_library


class ReadOnly(FakeGpus):
    """The packaged example, where any change fails the test."""

    def create_mig(self, *args: Any) -> MigInfo:
        raise AssertionError("the check created a MIG instance")

    def destroy_mig(self, *args: Any) -> None:
        raise AssertionError("the check destroyed a MIG instance")


def example() -> ReadOnly:
    loaded = FakeGpus.load("example")
    return ReadOnly(loaded._gpus)


class Probe:
    """A CUDA allocation on the fake: this process appears on ``index`` with the memory."""

    def __init__(self, gpus: FakeGpus, index: int, pid: int | None = None) -> None:
        self.gpus, self.index, self.pid = gpus, index, pid
        self.released = False

    def allocate(self, mib: int) -> str:
        self.gpus.add_process(self.index, self.pid or os.getpid(), mib + 300)  # plus the context
        return self.gpus.devices()[self.index].uuid

    def release(self) -> None:
        self.released = True


def check(gpus: FakeGpus, probe: Any, procs: Any = None) -> tuple[int, str]:
    out = io.StringIO()
    return run(gpus, lambda: probe, out, settle_s=0, procs=procs), out.getvalue()


def proc_of_this_process(tmp: Path, cgroup: str = "0::/user.slice/user-0.slice/session-1.scope") -> ProcFs:
    base = tmp / str(os.getpid())
    base.mkdir(parents=True)
    (base / "cgroup").write_text(cgroup + "\n")
    (base / "comm").write_text("nvml-check\n")
    return ProcFs(tmp)


def test_it_prints_the_hardware_and_finds_its_own_process(tmp_path: Path) -> None:
    gpus = example()
    probe = Probe(gpus, 1)
    problems, text = check(gpus, probe, proc_of_this_process(tmp_path))
    assert problems == 0, text
    assert '"migTaken"' in text  # the inventory
    assert "GPU 0 GPU-5d3c1a2e-a100-0000-0000-000000000000 NVIDIA A100-80GB (A100-80GB): 81920 MiB" in text
    assert "MIG mode on" in text and "slots 6+1" in text
    assert "process 4242 in MIG-0b9f6a1c-hand-made-0000-000000000006: 2048 MiB" in text
    assert f"FOUND: PID {os.getpid()} on GPU 1" in text and f"using {CHECK_MIB + 300} MiB" in text
    # the agent's sampling finds it too, under its PID, with its memory: stray use of a host process
    assert (
        f"SAMPLED: PID {os.getpid()} on GPU 1 (GPU-7e2b90d4-l4-0000-0000-000000000001) holds {CHECK_MIB + 300} MiB, "
        "SM n/a, as stray use: host process nvml-check"
    ) in text
    assert probe.released


def test_run_inside_a_pod_the_sampling_names_the_pod(tmp_path: Path) -> None:
    uid = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    gpus = example()
    procs = proc_of_this_process(tmp_path, f"0::/kubepods/besteffort/pod{uid}/{'ab' * 32}")
    problems, text = check(gpus, Probe(gpus, 1), procs)
    assert problems == 0, text
    assert f"as stray use: pod UID {uid}, not a live pod on this node" in text


def test_a_sampling_that_misses_the_process_is_reported(tmp_path: Path) -> None:
    gpus = example()
    problems, text = check(gpus, Probe(gpus, 1), ProcFs(tmp_path))  # no /proc entry for this PID
    assert problems == 1
    assert f"NOT SAMPLED: the agent's sampling does not find PID {os.getpid()}" in text


def test_a_process_nvml_does_not_list_under_our_pid_is_reported() -> None:
    gpus = example()
    problems, text = check(gpus, Probe(gpus, 2, pid=1))
    assert problems == 2  # NVML does not list it, so neither does the sampling
    assert "NOT FOUND: NVML does not list this PID" in text and "1 on GPU 2" in text
    assert "NOT SAMPLED" in text


def test_without_cuda_the_allocation_check_is_skipped_with_one_line() -> None:
    def no_cuda() -> Any:
        raise CudaUnavailable("libcuda.so.1 cannot be loaded (not found)")

    out = io.StringIO()
    assert run(example(), no_cuda, out, settle_s=0) == 0
    assert out.getvalue().splitlines()[-1] == (
        "CUDA: libcuda.so.1 cannot be loaded (not found); the allocation check is skipped"
    )


def test_the_real_probe_says_clearly_when_there_is_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    from scheduler.agent.check import DriverApiProbe

    def missing(name: str) -> None:  # as ctypes fails on a machine without the driver
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    with pytest.raises(CudaUnavailable) as raised:
        DriverApiProbe()
    assert str(raised.value) == (
        "libcuda.so.1 cannot be loaded (libcuda.so.1: cannot open shared object file: No such file or directory)"
    )


def test_the_script_without_nvml_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "nvml-check.py"
    no_nvml_library(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "nvml-check: NVML is not available (no NVIDIA driver here?): NVML Shared Library Not Found"
    ]
