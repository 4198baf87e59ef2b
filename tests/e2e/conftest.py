"""The control plane tier's fixtures: one real v1.37 control plane per session (marker
``controlplane``; scripts/test.sh leaves the tier out, saying so in one line, where no Go
toolchain is on PATH), the manifests applied to it, and gpuslice on the host with the tokens of
the manifests' ServiceAccounts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, ControlPlaneUnavailable, build, free_port, running
from tests.e2e.deployed import Gpuslice, config_map, set_ca_bundle, shipped


@pytest.fixture(scope="session")
def gpuslice_port() -> int:
    """The loopback port gpuslice serves on: the API server reaches Service gpuslice/gpuslice there."""
    return free_port()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, gpuslice_port: int) -> Iterator[ControlPlane]:
    try:
        binary = build()
    except ControlPlaneUnavailable as unavailable:
        # scripts/test.sh deselects the tier where Go is missing; reaching here means it was asked for.
        pytest.fail(f"the control plane tier needs a Go toolchain: {unavailable}")
    workdir = tmp_path_factory.mktemp("controlplane")
    with running(binary, workdir, {"gpuslice/gpuslice": f"127.0.0.1:{gpuslice_port}"}) as plane:
        yield plane
        if os.environ.get("GPUSLICE_E2E_KEEP"):
            print(f"control plane files kept under {workdir}")


@pytest.fixture(scope="session")
def applied(control_plane: ControlPlane) -> list[dict[str, Any]]:
    """The shipped manifests (the kustomization), applied server-side; the objects the API server returned."""
    client = control_plane.client()
    return [client.apply(obj) for obj in shipped()]


@pytest.fixture(scope="session")
def gpuslice(
    control_plane: ControlPlane,
    applied: list[dict[str, Any]],
    certificate: Path,
    gpuslice_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gpuslice]:
    """gpuslice serving the webhook and the extender verbs with its ServiceAccount's token, and
    the real kube-scheduler (as the same account) calling it with the shipped configuration."""
    client = control_plane.client()
    set_ca_bundle(client, certificate / "ca.crt")
    service = Gpuslice(
        control_plane, gpuslice_port, certificate, tmp_path_factory.mktemp("gpuslice"), config_map(applied)
    )
    service.start()
    service.start_scheduler()
    try:
        yield service
    finally:
        control_plane.stop("kube-scheduler")
        service.stop()
