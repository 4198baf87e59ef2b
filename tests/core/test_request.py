"""The request parser: every accepted form, and every malformed one with its message."""

from __future__ import annotations

import pytest

from scheduler.core.errors import RequestError
from scheduler.core.inventory import SharingMode
from scheduler.core.quantity import bytes_to_mib, cpu_milli, memory_mib
from scheduler.core.request import GpuKind, parse_pod
from tests.builders import pod


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        ("0.0001", 1),  # 0.1 milli-CPU rounds up: a request is never under-stated
        (3, 3000),
    ],
)
def test_cpu_quantities(text: object, expected: int) -> None:
    assert cpu_milli(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1Gi", 1024),
        ("512Mi", 512),
        ("1G", 954),  # 10^9 / 2^20 = 953.67 -> 954
        ("1e9", 954),
        ("1", 1),  # one byte still needs a MiB
    ],
)
def test_memory_quantities(text: str, expected: int) -> None:
    assert bytes_to_mib(text) == expected


def test_bare_integer_gpu_memory_is_mib() -> None:
    assert memory_mib("20480") == 20480
    assert memory_mib("20Gi") == 20480
    assert memory_mib("20480Mi") == 20480


@pytest.mark.parametrize(
    ("annotations", "kind", "count", "fraction", "memory", "compute"),
    [
        ({"gpu-fraction": "0.5"}, GpuKind.SHARE, 1, 500, 0, 0),
        ({"gpu-fraction": "0.25", "gpu-count": "2"}, GpuKind.SHARE, 2, 250, 0, 0),
        ({"gpu-memory": "20Gi"}, GpuKind.SHARE, 1, 0, 20480, 0),
        ({"gpu-memory": "20480Mi", "gpu-compute": "30"}, GpuKind.SHARE, 1, 0, 20480, 300),
        ({"gpu-memory": "8192"}, GpuKind.SHARE, 1, 0, 8192, 0),
        ({"gpu-compute": "12.5"}, GpuKind.SHARE, 1, 0, 0, 125),
        ({"gpu-count": "2"}, GpuKind.WHOLE, 2, 0, 0, 0),
        ({}, GpuKind.NONE, 0, 0, 0, 0),
    ],
)
def test_annotation_forms(
    annotations: dict[str, str], kind: GpuKind, count: int, fraction: int, memory: int, compute: int
) -> None:
    gpu = parse_pod(pod(annotations=annotations)).demand.gpu
    assert (gpu.kind, gpu.count, gpu.fraction_milli, gpu.memory_mib, gpu.compute_milli) == (
        kind,
        count,
        fraction,
        memory,
        compute,
    )


def test_mig_profile_annotation_and_resource() -> None:
    by_annotation = parse_pod(pod(annotations={"mig-profile": "3g.40gb"})).demand.gpu
    by_resource = parse_pod(pod(extra_resources={"nvidia.com/mig-3g.40gb": 1})).demand.gpu
    for gpu in (by_annotation, by_resource):
        assert gpu.kind is GpuKind.MIG
        assert gpu.profile is not None
        assert (gpu.profile.compute_slices, gpu.profile.memory_gb) == (3, 40)
        assert gpu.sharing == frozenset({SharingMode.MIG})


def test_nvidia_gpu_resource_is_whole_gpus_and_host_resources_are_summed() -> None:
    raw = pod(cpu="500m", memory="1Gi", gpus=2)
    raw["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}})
    # an init container larger than the sum wins for CPU, not for memory (1536 MiB > 1024 MiB)
    raw["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]
    demand = parse_pod(raw).demand
    assert (demand.gpu.kind, demand.gpu.count) == (GpuKind.WHOLE, 2)
    assert demand.cpu_milli == 3000  # max(500 + 1000, 3000)
    assert demand.memory_mib == 1536  # max(1024 + 512, 1024)


def test_selectors() -> None:
    gpu = parse_pod(
        pod(
            annotations={
                "gpu-fraction": "0.5",
                "sharing": "mps|time-slicing",
                "gpu-model": "H100|nvidia-a100-sxm4-80gb",
            }
        )
    ).demand.gpu
    assert gpu.sharing == frozenset({SharingMode.MPS, SharingMode.TIME_SLICING})
    assert gpu.models == ("H100-80GB", "A100-80GB")
    assert parse_pod(pod(annotations={"gpu-fraction": "0.5", "sharing": "any"})).demand.gpu.sharing == frozenset()


def test_nvlink_required_or_preferred() -> None:
    def nvlink(**annotations: str) -> bool:
        return parse_pod(pod(annotations=annotations)).demand.gpu.nvlink

    assert nvlink(**{"gpu-count": "4", "nvlink": "required"})
    assert nvlink(**{"gpu-fraction": "0.5", "gpu-count": "2", "nvlink": " Required "})
    assert not nvlink(**{"gpu-count": "4", "nvlink": "preferred"})
    assert not nvlink(**{"gpu-count": "4"})
    assert not nvlink(**{"mig-profile": "1g.10gb", "nvlink": "preferred"})
    # with the resource form too
    assert parse_pod(pod(annotations={"nvlink": "required"}, gpus=2)).demand.gpu.nvlink
    assert parse_pod(pod(annotations={"gpu-count": "2", "nvlink": "required"})).demand.gpu.describe() == (
        "2 whole GPUs joined by NVLink"
    )


def test_policy_override_and_its_validation() -> None:
    assert parse_pod(pod(annotations={"gpu-count": "1", "policy": "binpack"}), policies=["binpack"]).policy == "binpack"
    with pytest.raises(RequestError, match=r"gpuslice.io/policy.*'nope'.*binpack"):
        parse_pod(pod(annotations={"gpu-count": "1", "policy": "nope"}), policies=["binpack", "fgd"])


def test_custom_prefix() -> None:
    raw = pod(annotations={"example.com/gpu-fraction": "0.5"})
    assert parse_pod(raw, prefix="example.com/").demand.gpu.fraction_milli == 500
    assert parse_pod(raw).demand.gpu.kind is GpuKind.NONE


def test_output_annotations_are_not_requests() -> None:
    raw = pod(annotations={"allocation": "{}", "bind-phase": "bound", "visible-devices": "GPU-1"})
    assert parse_pod(raw).demand.gpu.kind is GpuKind.NONE


@pytest.mark.parametrize(
    ("annotations", "resources", "key", "fragment"),
    [
        ({"gpu-fraction": "0"}, {}, "gpuslice.io/gpu-fraction", "(0, 1]"),
        ({"gpu-fraction": "-0.5"}, {}, "gpuslice.io/gpu-fraction", "(0, 1]"),
        ({"gpu-fraction": "1.5", "gpu-count": "2"}, {}, "gpuslice.io/gpu-fraction", "(0, 1]"),
        ({"gpu-fraction": "half"}, {}, "gpuslice.io/gpu-fraction", "(0, 1]"),
        ({"gpu-fraction": "nan"}, {}, "gpuslice.io/gpu-fraction", "(0, 1]"),
        ({"gpu-memory": "20Gx"}, {}, "gpuslice.io/gpu-memory", "20Gi"),
        ({"gpu-memory": "-1Gi"}, {}, "gpuslice.io/gpu-memory", "greater than zero"),
        ({"gpu-memory": "0"}, {}, "gpuslice.io/gpu-memory", "greater than zero"),
        ({"gpu-compute": "120"}, {}, "gpuslice.io/gpu-compute", "(0, 100]"),
        ({"gpu-count": "0"}, {}, "gpuslice.io/gpu-count", "whole number"),
        ({"gpu-count": "1.5"}, {}, "gpuslice.io/gpu-count", "whole number"),
        ({"mig-profile": "3g.40"}, {}, "gpuslice.io/mig-profile", "3g.40gb"),
        ({"mig-profile": "5g.50gb"}, {}, "gpuslice.io/mig-profile", "profile some MIG-capable model offers"),
        ({"mig-profile": "3g.40gb", "sharing": "mps"}, {}, "gpuslice.io/sharing", "mig or any"),
        ({"mig-profile": "3g.40gb", "gpu-fraction": "0.5"}, {}, "gpuslice.io/gpu-fraction", "MIG profile fixes"),
        ({"gpu-fraction": "0.5", "gpu-memory": "1Gi"}, {}, "gpuslice.io/gpu-fraction", "not both"),
        ({"gpu-fraction": "0.5", "sharing": "exclusive"}, {}, "gpuslice.io/sharing", "other than exclusive"),
        ({"sharing": "gpu-dance"}, {}, "gpuslice.io/sharing", "time-slicing"),
        ({"gpu-model": "H100"}, {}, "gpuslice.io/gpu-model", "only beside a GPU request"),
        ({"gpu-model": "H100||"}, {"nvidia.com/gpu": 1}, "gpuslice.io/gpu-model", "joined by |"),
        ({"gpu-fractoin": "0.5"}, {}, "gpuslice.io/gpu-fractoin", "gpuslice.io/gpu-fraction"),
        ({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": 1}, "nvidia.com/gpu", "not both"),
        ({}, {"nvidia.com/gpu": "two"}, "spec.containers[0].resources nvidia.com/gpu", "whole number"),
        ({}, {"nvidia.com/mig-3g.40gb": 2}, "nvidia.com/mig-3g.40gb", "one MIG instance per pod"),
        ({}, {"nvidia.com/mig-9g.1gb": 1}, "nvidia.com/mig-9g.1gb", "profile some MIG-capable model offers"),
        ({"gpu-count": "4", "nvlink": "yes"}, {}, "gpuslice.io/nvlink", "required"),
        ({"nvlink": "required"}, {}, "gpuslice.io/nvlink", "only beside a GPU request"),
        ({"mig-profile": "3g.40gb", "nvlink": "required"}, {}, "gpuslice.io/nvlink", "one instance, one GPU"),
    ],
)
def test_malformed_requests_name_key_value_and_accepted_forms(
    annotations: dict[str, str], resources: dict[str, object], key: str, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_pod(pod(annotations=annotations, extra_resources=resources))
    assert caught.value.key == key
    message = str(caught.value)
    assert message.startswith(key)
    assert fragment in message


@pytest.mark.parametrize(
    "raw",
    [
        "not a pod",
        {"metadata": "x"},
        {"metadata": {"annotations": ["a"]}},
        {"spec": {"containers": "x"}},
        {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}},
        {"metadata": {"name": 5}},
    ],
)
def test_malformed_pod_shapes_raise_request_error(raw: object) -> None:
    with pytest.raises(RequestError):
        parse_pod(raw)  # type: ignore[arg-type]
