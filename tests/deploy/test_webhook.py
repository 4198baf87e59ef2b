"""The admission webhook: real AdmissionReview v1 bodies in, JSON patches applied to the pod."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.allocation import Allocation, DeviceShare, MigSlot, record_annotations
from scheduler.core.errors import ConfigError
from scheduler.core.inventory import SharingMode
from scheduler.webhook import ENV_FROM_ANNOTATIONS, WebhookConfig, mutate, validate
from scheduler.webhook.review import POD_OUTPUT_KEYS, pointer
from tests.deploy.reviews import GPUSLICE_SA, container, env_of, from_annotation, patch_of, patched, pod, review

P = "gpuslice.io/"
CONFIG = WebhookConfig(policies=frozenset({"binpack", "spread"}), trusted_users=frozenset({GPUSLICE_SA}))
VISIBLE = from_annotation(P + "visible-devices")
THREADS = from_annotation(P + "mps-thread-percentage")
MEM_LIMIT = from_annotation(P + "mps-memory-limit")
ALL_GPU_ENV = {
    "NVIDIA_VISIBLE_DEVICES": VISIBLE,
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": THREADS,
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": MEM_LIMIT,
}


def mutated(obj: dict[str, Any], config: WebhookConfig = CONFIG) -> tuple[dict[str, Any], dict[str, Any]]:
    reply = mutate(review(obj), config)
    assert reply.status == 200
    assert reply.response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert reply.body["apiVersion"] == "admission.k8s.io/v1" and reply.body["kind"] == "AdmissionReview"
    return patched(obj, reply), reply.response


# ---------------------------------------------------------------- valid GPU pods


def test_half_gpu_pod_goes_to_gpuslice_with_the_device_environment() -> None:
    obj = pod({P + "gpu-fraction": "0.5"})
    out, response = mutated(obj)
    assert response["allowed"] is True
    assert out["spec"]["schedulerName"] == "gpuslice"
    # sharing "any": the pod may land on an MPS GPU, so the MPS caps come too
    assert env_of(out) == ALL_GPU_ENV
    # nothing else changed
    out["spec"]["schedulerName"] = "default-scheduler"
    del out["spec"]["containers"][0]["env"]
    assert out == obj


@pytest.mark.parametrize(
    ("annotations", "limits", "expected_env"),
    [
        ({"mig-profile": "3g.40gb"}, {}, {"NVIDIA_VISIBLE_DEVICES": VISIBLE}),  # MIG: hardware caps, no MPS vars
        ({"gpu-fraction": "0.25", "sharing": "time-slicing"}, {}, {"NVIDIA_VISIBLE_DEVICES": VISIBLE}),
        ({"gpu-memory": "20Gi", "sharing": "mps"}, {}, ALL_GPU_ENV),
        ({"gpu-compute": "30", "sharing": "mps|time-slicing"}, {}, ALL_GPU_ENV),
        ({"gpu-count": "4", "sharing": "exclusive"}, {}, {"NVIDIA_VISIBLE_DEVICES": VISIBLE}),
        ({}, {"nvidia.com/gpu": "2"}, ALL_GPU_ENV),  # whole GPUs, sharing any: an MPS GPU may serve them
        ({}, {"nvidia.com/mig-1g.10gb": "1"}, {"NVIDIA_VISIBLE_DEVICES": VISIBLE}),
    ],
)
def test_env_follows_the_sharing_modes_the_request_allows(
    annotations: dict[str, str], limits: dict[str, str], expected_env: dict[str, Any]
) -> None:
    obj = pod({P + k: v for k, v in annotations.items()}, containers=[container(limits=limits)])
    out, _ = mutated(obj)
    assert out["spec"]["schedulerName"] == "gpuslice"
    assert env_of(out) == expected_env


def test_only_containers_with_a_gpu_resource_get_the_environment() -> None:
    obj = pod(
        containers=[container("proxy", "envoy"), container("train", limits={"nvidia.com/gpu": 1})],
        init_containers=[container("fetch", "busybox")],
    )
    out, _ = mutated(obj)
    assert env_of(out, 1) == ALL_GPU_ENV
    assert "env" not in out["spec"]["containers"][0]
    assert "env" not in out["spec"]["initContainers"][0]


def test_an_annotation_request_is_per_pod_so_every_container_gets_the_environment() -> None:
    obj = pod(
        {P + "mig-profile": "1g.10gb"},
        containers=[container("a"), container("b")],
        init_containers=[container("warmup")],
    )
    out, _ = mutated(obj)
    for section, index in (("containers", 0), ("containers", 1), ("initContainers", 0)):
        assert env_of(out, index, section) == {"NVIDIA_VISIBLE_DEVICES": VISIBLE}


def test_existing_env_is_kept_and_a_hand_written_device_list_is_replaced() -> None:
    env = [
        {"name": "HF_HOME", "value": "/cache"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    obj = pod({P + "gpu-fraction": "0.5"}, containers=[container(env=env)])
    out, _ = mutated(obj)
    entries = out["spec"]["containers"][0]["env"]
    # order kept, values replaced in place, the missing one appended
    assert [e["name"] for e in entries] == [
        "HF_HOME",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "TOKEN",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ]
    assert env_of(out) == {"HF_HOME": "/cache", "TOKEN": env[3]["valueFrom"], **ALL_GPU_ENV}


def test_a_pod_that_names_another_scheduler_keeps_it_with_a_warning() -> None:
    obj = pod({P + "gpu-fraction": "0.5"}, scheduler_name="volcano")
    out, response = mutated(obj)
    assert out["spec"]["schedulerName"] == "volcano"
    assert any("volcano" in w and "not enforced" in w for w in response["warnings"])
    assert env_of(out) == ALL_GPU_ENV


def test_a_pod_already_for_gpuslice_is_not_renamed() -> None:
    obj = pod({P + "gpu-fraction": "0.5"}, scheduler_name="gpuslice")
    reply = mutate(review(obj), CONFIG)
    assert not any(op["path"] == "/spec/schedulerName" for op in patch_of(reply))


def test_a_missing_scheduler_name_is_set() -> None:
    out, _ = mutated(pod({P + "gpu-fraction": "0.5"}, scheduler_name=None))
    assert out["spec"]["schedulerName"] == "gpuslice"


def test_a_configured_prefix_and_scheduler_name_are_used() -> None:
    config = WebhookConfig(prefix="gpus.example.com/", scheduler_name="gpu-packer")
    obj = pod(
        {
            "gpus.example.com/gpu-fraction": "0.5",
            "gpus.example.com/allocation": "{}",
            P + "allocation": "not ours under this prefix",
        }
    )
    out, _ = mutated(obj, config)
    assert out["spec"]["schedulerName"] == "gpu-packer"
    assert env_of(out)["NVIDIA_VISIBLE_DEVICES"] == from_annotation("gpus.example.com/visible-devices")
    assert out["metadata"]["annotations"] == {
        "gpus.example.com/gpu-fraction": "0.5",
        P + "allocation": "not ours under this prefix",
    }


@pytest.mark.parametrize("prefix", ["gpuslice.io", "", "a b/"])
def test_a_bad_prefix_is_a_config_error(prefix: str) -> None:
    with pytest.raises(ConfigError, match=r"webhook\.prefix"):
        WebhookConfig(prefix=prefix)


def test_the_scheduler_name_may_not_be_the_default_one() -> None:
    with pytest.raises(ConfigError, match=r"webhook\.schedulerName"):
        WebhookConfig(scheduler_name="default-scheduler")


# ---------------------------------------------------------------- the env resolves to what the bind writes


def resolve_downward_env(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, str]:
    """What kubelet puts in the first container's environment: fieldRefs to absent annotations are ''."""
    out = {}
    for entry in obj["spec"]["containers"][0]["env"]:
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        match = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
        assert match, path
        out[entry["name"]] = annotations.get(match.group(1), "")
    return out


def test_after_an_mps_bind_the_container_sees_its_share_and_caps() -> None:
    out, _ = mutated(pod({P + "gpu-memory": "20Gi", P + "gpu-compute": "25", P + "sharing": "mps"}))
    # 20 GiB = 20480 MiB and 25 % = 250 milli on GPU 3 of an H100 node
    alloc = Allocation("gpu-a", (DeviceShare("GPU-3f2a", 3, SharingMode.MPS, 20480, 250),), 1000, 4096)
    written = record_annotations(alloc, P, "bound", "2026-01-01T00:00:00Z")
    assert resolve_downward_env(out, written) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-3f2a",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "3=20480M",
    }


def test_after_a_mig_bind_the_container_sees_its_instance() -> None:
    out, _ = mutated(pod({P + "mig-profile": "3g.40gb"}))
    share = DeviceShare("MIG-7c1e", 0, SharingMode.MIG, 40960, 3000 // 7, MigSlot(4, 4, 3, "3g.40gb"))
    written = record_annotations(Allocation("gpu-b", (share,)), P, "bound", "2026-01-01T00:00:00Z")
    assert resolve_downward_env(out, written) == {"NVIDIA_VISIBLE_DEVICES": "MIG-7c1e"}


def test_every_env_annotation_is_one_the_bind_writes() -> None:
    mps = Allocation("n", (DeviceShare("GPU-0", 0, SharingMode.MPS, 1024, 100),))
    written = record_annotations(mps, P, "bound", "t")
    assert {P + key for _, key, _ in ENV_FROM_ANNOTATIONS} <= set(written)
    assert {k.removeprefix(P) for k in written} <= set(POD_OUTPUT_KEYS)


# ---------------------------------------------------------------- forged records


FORGED = {
    P + "allocation": '{"node":"gpu-a","devices":[{"uuid":"GPU-0","index":0,"mode":"exclusive",'
    '"memoryMiB":81920,"computeMilli":1000,"mig":null}],"cpuMilli":0,"memoryMiB":0}',
    P + "bind-phase": "bound",
    P + "visible-devices": "GPU-0,GPU-1",
    P + "mps-thread-percentage": "100",
    P + "mps-memory-limit": "0=81920M",
}


def test_forged_records_are_stripped_from_a_new_gpu_pod() -> None:
    obj = pod({P + "gpu-fraction": "0.5", "team": "vision", **FORGED})
    out, response = mutated(obj)
    assert out["metadata"]["annotations"] == {P + "gpu-fraction": "0.5", "team": "vision"}
    assert len(response["warnings"]) == len(FORGED)
    # "/" in the key is escaped as "~1" (RFC 6901)
    paths = {op["path"] for op in patch_of(mutate(review(obj), CONFIG)) if op["op"] == "remove"}
    assert "/metadata/annotations/gpuslice.io~1allocation" in paths


def test_forged_records_are_stripped_from_a_pod_without_gpu_request() -> None:
    obj = pod({P + "allocation": FORGED[P + "allocation"], P + "visible-devices": "GPU-0"})
    out, _ = mutated(obj)
    assert out["metadata"]["annotations"] == {}
    assert out["spec"] == obj["spec"]  # no scheduler name, no env: only the forged keys went


def test_validate_denies_records_that_survived_mutation() -> None:
    reply = validate(
        review(pod({P + "gpu-fraction": "0.5", P + "bind-phase": "bound"}, scheduler_name="gpuslice")), CONFIG
    )
    assert reply.response["allowed"] is False
    assert reply.response["status"]["code"] == 403
    assert "gpuslice.io/bind-phase" in reply.response["status"]["message"]


def test_validate_denies_a_hand_written_device_list_that_survived_mutation() -> None:
    obj = pod(
        {P + "gpu-fraction": "0.5"},
        containers=[container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])],
        scheduler_name="gpuslice",
    )
    reply = validate(review(obj), CONFIG)
    assert reply.response["allowed"] is False
    assert "spec.containers[0].env NVIDIA_VISIBLE_DEVICES" in reply.response["status"]["message"]


def test_validate_admits_what_mutate_produced() -> None:
    obj = pod(
        {P + "gpu-fraction": "0.5", **FORGED},
        containers=[container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])],
    )
    out, _ = mutated(obj)
    reply = validate(review(out), CONFIG)
    assert reply.response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def update(old: dict[str, Any], new: dict[str, Any], username: str, groups: tuple[str, ...] = ()) -> dict[str, Any]:
    return review(new, "UPDATE", old=old, username=username, groups=groups)


def bound_pod() -> dict[str, Any]:
    alloc = Allocation("gpu-a", (DeviceShare("GPU-1", 1, SharingMode.MPS, 40960, 500),))
    return pod(
        {P + "gpu-fraction": "0.5", **record_annotations(alloc, P, "bound", "t")},
        name="nb-0",
        scheduler_name="gpuslice",
    )


def test_a_user_may_not_edit_the_record_of_a_running_pod() -> None:
    old = bound_pod()
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "visible-devices"] = "GPU-0,GPU-1,GPU-2"
    reply = validate(update(old, new, "alice@example.com", ("developers",)), CONFIG)
    assert reply.response["allowed"] is False
    message = reply.response["status"]["message"]
    assert "gpuslice.io/visible-devices" in message and "alice@example.com" in message
    # nor remove it
    del new["metadata"]["annotations"][P + "allocation"]
    assert validate(update(old, new, "alice@example.com"), CONFIG).response["allowed"] is False


def test_gpuslice_and_cluster_admins_may_write_the_record() -> None:
    old = pod({P + "gpu-fraction": "0.5"}, name="nb-0", scheduler_name="gpuslice")
    new = bound_pod()
    assert validate(update(old, new, GPUSLICE_SA), CONFIG).response["allowed"] is True
    assert validate(update(old, new, "root", ("system:masters",)), CONFIG).response["allowed"] is True
    assert validate(update(old, new, "system:serviceaccount:team-a:default"), CONFIG).response["allowed"] is False


def test_other_updates_pass() -> None:
    old = bound_pod()
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["stage"] = "done"
    new["metadata"]["annotations"]["note"] = "checked"
    assert validate(update(old, new, "alice@example.com"), CONFIG).response["allowed"] is True


def test_trusted_service_account_comes_from_the_environment() -> None:
    config = WebhookConfig.from_env({"GPUSLICE_NAMESPACE": "gpuslice-system", "GPUSLICE_SERVICE_ACCOUNT": "gpuslice"})
    assert config.trusted_users == {GPUSLICE_SA}
    assert config.policies is not None and "binpack" in config.policies
    assert WebhookConfig.from_env({}).trusted_users == frozenset()
    assert WebhookConfig.from_env({"GPUSLICE_PREFIX": "gpus.example.com/"}).prefix == "gpus.example.com/"
    assert WebhookConfig.from_env({"GPUSLICE_PREFIX": "gpus.example.com/"}, prefix="x.io/").prefix == "x.io/"


# ---------------------------------------------------------------- bad requests


@pytest.mark.parametrize(
    ("annotations", "limits", "fragments"),
    [
        ({"gpu-fraction": "1.5"}, {}, ["gpuslice.io/gpu-fraction", "1.5", "(0, 1]"]),
        ({"gpu-fracton": "0.5"}, {}, ["gpuslice.io/gpu-fracton", "one of the keys", "gpuslice.io/gpu-fraction"]),
        ({"mig-profile": "5g.40gb"}, {}, ["gpuslice.io/mig-profile", "5g.40gb"]),
        ({"gpu-memory": "lots"}, {}, ["gpuslice.io/gpu-memory", "20Gi"]),
        ({"sharing": "mps"}, {}, ["gpuslice.io/sharing", "a selector only beside a GPU request"]),
        ({"gpu-fraction": "0.5", "policy": "fastest"}, {}, ["gpuslice.io/policy", "binpack, spread"]),
        ({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": "1"}, ["nvidia.com/gpu", "not both"]),
        ({}, {"nvidia.com/mig-3g.40gb": "2"}, ["nvidia.com/mig-3g.40gb", "one MIG instance per pod"]),
        ({"gpu-count": "4", "nvlink": "always"}, {}, ["gpuslice.io/nvlink", "'always'", "required", "preferred"]),
    ],
)
def test_a_malformed_request_is_denied_with_the_parser_message(
    annotations: dict[str, str], limits: dict[str, str], fragments: list[str]
) -> None:
    obj = pod({P + k: v for k, v in annotations.items()}, containers=[container(limits=limits)])
    for decide in (mutate, validate):
        reply = decide(review(obj), CONFIG)
        assert reply.status == 200
        response = reply.response
        assert response["allowed"] is False and "patch" not in response
        assert response["status"]["code"] == 422
        for fragment in fragments:
            assert fragment in response["status"]["message"]


# ---------------------------------------------------------------- pods without GPU requests


def test_a_pod_without_gpu_request_is_untouched() -> None:
    obj = pod({"prometheus.io/scrape": "true"}, containers=[container("web", "nginx", limits={"cpu": "1"})])
    for decide in (mutate, validate):
        reply = decide(review(obj), CONFIG)
        assert reply.response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_zero_gpu_resources_are_no_request() -> None:
    obj = pod(containers=[container(limits={"nvidia.com/gpu": "0"})])
    assert mutate(review(obj), CONFIG).response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_other_operations_and_subresources_pass() -> None:
    obj = pod({P + "gpu-fraction": "7"})  # malformed, but not a pod creation
    delete = review(None, "DELETE", old=obj)
    assert mutate(delete, CONFIG).response["allowed"] is True
    assert validate(delete, CONFIG).response["allowed"] is True
    status = review(obj, "UPDATE", old=obj)
    status["request"]["subResource"] = "status"
    assert validate(status, CONFIG).response["allowed"] is True
    binding = review({"apiVersion": "v1", "kind": "Binding"})
    binding["request"]["kind"] = {"group": "", "version": "v1", "kind": "Binding"}
    binding["request"]["resource"] = {"group": "", "version": "v1", "resource": "bindings"}
    assert mutate(binding, CONFIG).response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


# ---------------------------------------------------------------- malformed reviews


def _broken(mutation: str) -> object:
    body = review(pod({P + "gpu-fraction": "0.5"}))
    if mutation == "not-an-object":
        return ["AdmissionReview"]
    if mutation == "v1beta1":
        body["apiVersion"] = "admission.k8s.io/v1beta1"
    elif mutation == "wrong-kind":
        body["kind"] = "Pod"
    elif mutation == "no-request":
        del body["request"]
    elif mutation == "no-uid":
        del body["request"]["uid"]
    elif mutation == "bad-operation":
        body["request"]["operation"] = "PATCH"
    elif mutation == "object-not-an-object":
        body["request"]["object"] = "a pod"
    elif mutation == "update-without-old":
        body["request"]["operation"] = "UPDATE"
    return body


@pytest.mark.parametrize(
    ("mutation", "fragment", "uid"),
    [
        ("not-an-object", "body: expected a JSON object, got list", ""),
        ("v1beta1", "admission.k8s.io/v1beta1", "705ab4f5-6393-11e8-b7cc-42010a800002"),
        ("wrong-kind", "apiVersion/kind", "705ab4f5-6393-11e8-b7cc-42010a800002"),
        ("no-request", "request: expected an object, got NoneType", ""),
        ("no-uid", "request.uid", ""),
        ("bad-operation", "request.operation: got 'PATCH'", "705ab4f5-6393-11e8-b7cc-42010a800002"),
        ("object-not-an-object", "request.object: expected the Pod", "705ab4f5-6393-11e8-b7cc-42010a800002"),
        ("update-without-old", "request.oldObject", "705ab4f5-6393-11e8-b7cc-42010a800002"),
    ],
)
def test_a_malformed_review_gets_a_400_naming_the_problem(mutation: str, fragment: str, uid: str) -> None:
    for decide in (mutate, validate):
        reply = decide(_broken(mutation), CONFIG)
        assert reply.status == 400
        assert reply.body["kind"] == "AdmissionReview"
        assert reply.response["allowed"] is False and reply.response["uid"] == uid
        assert reply.response["status"]["code"] == 400
        assert fragment in reply.response["status"]["message"]


# ---------------------------------------------------------------- properties


ENV_NAMES = ["NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "HF_HOME", "PATH"]
env_entry = st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(ENV_NAMES), st.text(max_size=5))
containers_st = st.lists(
    st.builds(
        lambda env, gpu: container(env=env, limits={"nvidia.com/gpu": gpu} if gpu else None),
        st.one_of(st.none(), st.lists(env_entry, max_size=4)),
        st.sampled_from([0, 0, 1, 2]),
    ),
    min_size=1,
    max_size=3,
)
request_st = st.sampled_from(
    [{}, {P + "gpu-fraction": "0.5"}, {P + "mig-profile": "2g.20gb"}, {P + "gpu-memory": "10Gi", P + "sharing": "mps"}]
)
other_annotations = st.dictionaries(
    st.sampled_from(["team", "a/b", "x~y/z", P + "inventory"]), st.text(max_size=3), max_size=3
)
forged_st = st.dictionaries(st.sampled_from([P + k for k in POD_OUTPUT_KEYS]), st.just("x"), max_size=3)


@settings(max_examples=150, deadline=None)
@given(containers_st, request_st, other_annotations, forged_st, st.sampled_from([None, "default-scheduler", "x"]))
def test_mutation_invariants(
    containers: list[dict[str, Any]],
    request: dict[str, str],
    other: dict[str, str],
    forged: dict[str, str],
    scheduler: str | None,
) -> None:
    if request and any(c["resources"] for c in containers):
        return  # annotation and resource together is a rejected request, tested above
    obj = pod({**other, **request, **forged}, containers=containers, scheduler_name=scheduler)
    reply = mutate(review(obj), CONFIG)
    assert reply.response["allowed"] is True
    out = patched(obj, reply)
    # forged keys gone, every other annotation kept as it was
    assert out["metadata"]["annotations"] == {**other, **request}
    wants_gpu = bool(request) or any(c["resources"] for c in containers)
    if not wants_gpu:
        assert out["spec"] == obj["spec"]
        return
    assert out["spec"]["schedulerName"] == ("x" if scheduler == "x" else "gpuslice")
    for i, (before, after) in enumerate(zip(obj["spec"]["containers"], out["spec"]["containers"], strict=True)):
        gets_env = bool(request) or bool(before["resources"])
        if not gets_env:
            assert after == before
            continue
        names = [e["name"] for e in after["env"]]
        had = [e for e in before.get("env") or [] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
        assert names.count("NVIDIA_VISIBLE_DEVICES") == max(1, len(had))  # replaced in place, or added once
        assert all(
            e == {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": VISIBLE}
            for e in after["env"]
            if e["name"] == "NVIDIA_VISIBLE_DEVICES"
        ), i
        # entries that are not ours keep their values and order
        assert [e for e in after["env"] if e["name"] in ("HF_HOME", "PATH")] == [
            e for e in before.get("env") or [] if e["name"] in ("HF_HOME", "PATH")
        ]
    # mutation is idempotent: the result needs no further patch, and validation admits it
    again = mutate(review(out), CONFIG)
    assert patch_of(again) == []
    assert validate(review(out), CONFIG).response["allowed"] is True


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (("metadata", "annotations", "gpuslice.io/allocation"), "/metadata/annotations/gpuslice.io~1allocation"),
        (("a~b", "c/d~1"), "/a~0b/c~1d~01"),
        (("spec", "containers", 0, "env", "-"), "/spec/containers/0/env/-"),
    ],
)
def test_json_pointer_escaping(parts: tuple[str | int, ...], expected: str) -> None:
    assert pointer(*parts) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
pod_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "annotations",
        "containers",
        "initContainers",
        "resources",
        "limits",
        "requests",
        "env",
        "name",
        "schedulerName",
        "nvidia.com/gpu",
        "nvidia.com/mig-3g.40gb",
        P + "gpu-fraction",
        P + "allocation",
        P + "sharing",
    ]
)
pod_like = st.recursive(
    st.none() | st.integers(-2, 3) | st.sampled_from(["0.5", "1", "mps", "", "3g.40gb", "2Gi"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(pod_keys, inner, max_size=4),
    max_leaves=16,
)
pod_objects = st.builds(
    lambda top, spec: {**top, "spec": spec} if spec is not None else top,
    st.dictionaries(pod_keys, pod_like, max_size=3),
    st.none() | st.dictionaries(pod_keys, pod_like, max_size=3),
)


odd = (
    st.none()
    | st.integers(-1, 3)
    | st.text(max_size=4)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
annotation_values = odd | st.sampled_from(["0.5", "2", "20Gi", "30", "3g.40gb", "mps", "any", "binpack", "x|y"])
annotation_keys = st.sampled_from(
    [
        P + k
        for k in (
            "gpu-fraction",
            "gpu-memory",
            "gpu-compute",
            "gpu-count",
            "mig-profile",
            "sharing",
            "gpu-model",
            "policy",
            "bogus",
        )
    ]
    + [P + k for k in POD_OUTPUT_KEYS]
    + ["team"]
)
odd_env = odd | st.lists(odd | st.fixed_dictionaries({"name": st.sampled_from(ENV_NAMES) | odd}), max_size=3)
odd_limits = odd | st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "memory"]),
    odd | st.sampled_from(["1", "2", "500m", "1Gi"]),
    max_size=3,
)
odd_container = st.builds(
    lambda env, limits: {"name": "c", "image": "i", "env": env, "resources": {"limits": limits}}, odd_env, odd_limits
)
structured_pods = st.builds(
    lambda annotations, containers, scheduler: pod(annotations, containers=containers, scheduler_name=scheduler),
    st.dictionaries(annotation_keys, annotation_values, max_size=4),
    st.lists(odd_container, min_size=1, max_size=2),
    st.none() | st.sampled_from(["default-scheduler", "gpuslice", "other"]) | st.integers(),
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        json_values,
        pod_objects.map(review),
        pod_objects.map(lambda o: review(o, "UPDATE", old=o)),
        structured_pods.map(review),
    )
)
def test_any_body_gets_a_reply_never_an_exception(body: object) -> None:
    for decide in (mutate, validate):
        reply = decide(body, CONFIG)
        assert reply.status in (200, 400)
        assert reply.body["apiVersion"] == "admission.k8s.io/v1" and reply.body["kind"] == "AdmissionReview"
        response = reply.response
        assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["message"]
        if "patch" in response and isinstance(body, dict):
            patched(body["request"]["object"], reply)  # a patch always applies to the object it came with
