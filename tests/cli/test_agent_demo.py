"""``gpuslice agent --demo``: the node agent tried without a cluster, and a problem that stays
(no MPS daemon on fake GPUs) logged once, not every round."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.agent.agent import Agent
from scheduler.agent.config import load_config
from scheduler.agent.demo import LocalCluster, example_config
from scheduler.agent.fake import FakeGpus
from scheduler.agent.mps import MpsDaemons, SubprocessRunner

SCRIPT = Path(sys.executable).with_name("gpuslice")
T4 = "GPU-31c7aa05-t4-0000-0000-000000000002"


def test_the_agent_demo_shows_the_inventory_an_admission_with_its_cdi_device_and_metrics() -> None:
    done = subprocess.run([str(SCRIPT), "agent", "--demo"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "published on the Node (gpuslice.io/inventory):" in out
    assert f"GPU 2  T4         time-slicing  {T4}" in out
    # three GPUs, none larger than the reference nor time-slicing oversubscribed: 3 x 100 units
    assert "advertised to the kubelet (gpuslice.io/gpu-units, a second device plugin): 300" in out
    assert f"CDI device  nvidia.com/gpu={T4}" in out
    assert "env         GPUSLICE_POD=demo/notebook" in out
    # the share's series, its pod named by UID (the agent names pods only with metrics.podNames)
    assert 'gpuslice_share_memory_allocated_mib{gpu="2"' in out and 'pod="5e0d7c00-0004-4f00-8000-000000000001"' in out
    assert 'pod="notebook"' not in out
    assert len(done.stderr.splitlines()) <= 1, done.stderr  # the missing MPS daemon, once at most


def test_a_problem_that_stays_is_logged_once_not_every_round(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(example_config(), "", {})
    gpus = FakeGpus.load("example")
    runner = SubprocessRunner()
    mps = MpsDaemons(config.mps, runner)
    agent = Agent(config, gpus, LocalCluster(config.node), mps, runner)
    agent.start()
    with caplog.at_level(logging.WARNING, logger="gpuslice.agent"):
        for _ in range(3):
            assert any("MPS control daemon" in line for line in agent.tick())  # still a problem each round
    logged = [r.getMessage() for r in caplog.records if "MPS control daemon" in r.getMessage()]
    assert len(logged) == 1, logged
    mps.stop()
    gpus.close()
