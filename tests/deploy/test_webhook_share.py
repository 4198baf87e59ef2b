"""With the node agent, the webhook adds its share resource to every GPU container, and nothing
else changes; the extender does not read it as a GPU request."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.errors import ConfigError
from scheduler.core.request import GpuKind, parse_pod
from scheduler.webhook import WebhookConfig, mutate, validate
from tests.deploy.reviews import container, patched, pod, review

P = "gpuslice.io/"
SHARE = "gpuslice.io/share"
WITH_AGENT = WebhookConfig(share_resource=SHARE)


def mutated(obj: dict[str, Any], config: WebhookConfig = WITH_AGENT) -> dict[str, Any]:
    reply = mutate(review(obj), config)
    assert reply.status == 200 and reply.response["allowed"] is True
    return patched(obj, reply)


def limits(out: dict[str, Any], index: int = 0, section: str = "containers") -> dict[str, Any]:
    return dict(out["spec"][section][index].get("resources", {}).get("limits") or {})


def test_every_container_of_an_annotation_request_gets_one_share() -> None:
    obj = pod(
        {P + "gpu-fraction": "0.5"}, containers=[container("a"), container("b")], init_containers=[container("w")]
    )
    out = mutated(obj)
    for section, index in (("containers", 0), ("containers", 1), ("initContainers", 0)):
        assert limits(out, index, section) == {SHARE: "1"}


def test_a_gpu_resource_container_keeps_its_limits_and_requests_and_gains_the_share() -> None:
    obj = pod(containers=[container("proxy"), container("train", limits={"nvidia.com/gpu": 1, "cpu": "2"})])
    out = mutated(obj)
    assert limits(out, 1) == {"nvidia.com/gpu": 1, "cpu": "2", SHARE: "1"}
    assert out["spec"]["containers"][1]["resources"]["requests"] == {"nvidia.com/gpu": 1, "cpu": "2"}
    assert "limits" not in out["spec"]["containers"][0].get("resources", {})


def test_a_share_request_equal_to_its_limit_is_kept_and_a_wrong_one_corrected() -> None:
    obj = pod({P + "gpu-fraction": "0.5"}, containers=[container(limits={SHARE: "3"})])
    out = mutated(obj)
    assert out["spec"]["containers"][0]["resources"] == {"limits": {SHARE: "1"}, "requests": {SHARE: "1"}}


def test_a_container_without_resources_gets_a_limits_map() -> None:
    obj = pod({P + "gpu-fraction": "0.5"})
    del obj["spec"]["containers"][0]["resources"]
    assert mutated(obj)["spec"]["containers"][0]["resources"] == {"limits": {SHARE: "1"}}


def test_without_the_agent_nothing_is_added() -> None:
    out = mutated(pod({P + "gpu-fraction": "0.5"}), WebhookConfig())
    assert limits(out) == {}


def test_a_pod_without_a_gpu_request_gets_no_share() -> None:
    assert mutated(pod(containers=[container("web")])) == pod(containers=[container("web")])


def test_the_share_is_not_a_gpu_request() -> None:
    out = mutated(pod({P + "gpu-fraction": "0.5"}))
    out["metadata"]["name"] = "p"
    gpu = parse_pod(out).demand.gpu
    assert gpu.kind is GpuKind.SHARE and gpu.fraction_milli == 500
    plain = pod(containers=[container(limits={SHARE: "1"})])
    plain["metadata"]["name"] = "q"
    assert parse_pod(plain).demand.gpu.kind is GpuKind.NONE


def test_the_setting_comes_from_the_environment_and_is_checked() -> None:
    assert WebhookConfig.from_env({"GPUSLICE_SHARE_RESOURCE": SHARE}).share_resource == SHARE
    assert WebhookConfig.from_env({}).share_resource == ""
    with pytest.raises(ConfigError, match="shareResource"):
        WebhookConfig(share_resource="nvidia.com/gpu")


@pytest.mark.parametrize("config", [WITH_AGENT, WebhookConfig()], ids=["agent-configured", "default-name"])
@pytest.mark.parametrize("scheduler", ["default-scheduler", "volcano", None])
def test_the_share_resource_is_refused_on_a_pod_gpuslice_does_not_place(
    config: WebhookConfig, scheduler: str | None
) -> None:
    # no GPU annotation, no nvidia.com resource: only the agent's resource, by another scheduler
    obj = pod(containers=[container("app", limits={SHARE: "1"})], scheduler_name=scheduler)
    reply = validate(review(obj), config)
    assert reply.response["allowed"] is False
    assert reply.response["status"]["code"] == 403
    message = reply.response["status"]["message"]
    assert f"spec.containers[0].resources.limits {SHARE}" in message and "'gpuslice'" in message


def test_the_share_resource_on_a_pod_gpuslice_places_is_allowed() -> None:
    obj = pod(
        {P + "gpu-fraction": "0.5"}, containers=[container("app", limits={SHARE: "1"})], scheduler_name="gpuslice"
    )
    assert validate(review(obj), WITH_AGENT).response["allowed"] is True
