"""The webhook asks GPU units for every gpuslice pod (once per pod, on its first GPU container), so
kube-scheduler's NodeResourcesFit sees a necessary condition of GPU fit (scheduler.core.units)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.errors import ConfigError
from scheduler.webhook import WebhookConfig, mutate, validate
from tests.deploy.reviews import container, patched, pod, review

P = "gpuslice.io/"
SHARE = "gpuslice.io/share"
UNITS = "gpuslice.io/gpu-units"
CONFIG = WebhookConfig(share_resource=SHARE, units_resource=UNITS)


def mutated(obj: dict[str, Any], config: WebhookConfig = CONFIG) -> dict[str, Any]:
    reply = mutate(review(obj), config)
    assert reply.status == 200 and reply.response["allowed"] is True
    return patched(obj, reply)


def resources(out: dict[str, Any], index: int = 0, section: str = "containers") -> dict[str, Any]:
    return dict(out["spec"][section][index].get("resources") or {})


@pytest.mark.parametrize(
    ("annotations", "units"),
    [
        ({P + "gpu-fraction": "0.5"}, "49"),  # (500 - 1) // 10
        ({P + "gpu-count": "2"}, "200"),  # whole GPUs: 100 each
        ({P + "mig-profile": "3g.40gb"}, "42"),  # 3 of 7 compute slices: 300 // 7
        ({P + "gpu-memory": "72192Mi"}, "50"),  # 100 x 72192 // 144384, the catalogue's largest GPU
    ],
)
def test_a_pod_asks_its_units_once_beside_its_share(annotations: dict[str, str], units: str) -> None:
    obj = pod(annotations, containers=[container("a"), container("b")], init_containers=[container("w")])
    out = mutated(obj)
    # an annotation request: every container is a GPU container and gets the share; the units go
    # on the first of them (the init container: kube-scheduler takes the larger of it and the sum)
    assert resources(out, 0, "initContainers") == {"limits": {SHARE: "1", UNITS: units}}
    assert resources(out, 0)["limits"] == {SHARE: "1"}
    assert resources(out, 1)["limits"] == {SHARE: "1"}


def test_units_asked_by_hand_are_replaced_and_removed_elsewhere() -> None:
    obj = pod(
        containers=[
            container("web", limits={UNITS: "100"}),
            container("train", limits={"nvidia.com/gpu": 1, UNITS: "7"}),  # requests the same
        ]
    )
    out = mutated(obj)
    assert resources(out, 0) == {"limits": {}, "requests": {}}  # not a GPU container: no share, no units
    assert resources(out, 1)["limits"] == {"nvidia.com/gpu": 1, UNITS: "100", SHARE: "1"}
    assert resources(out, 1)["requests"][UNITS] == "100"


def test_a_request_with_no_safe_bound_asks_no_units() -> None:
    out = mutated(pod({P + "gpu-fraction": "0.001"}))  # (1 - 1) // 10 = 0: nothing to ask
    assert resources(out)["limits"] == {SHARE: "1"}


def test_without_the_setting_no_units() -> None:
    out = mutated(pod({P + "gpu-fraction": "0.5"}), WebhookConfig(share_resource=SHARE))
    assert resources(out)["limits"] == {SHARE: "1"}


def test_units_without_the_share_make_their_own_limits() -> None:
    obj = pod({P + "gpu-count": "1"})
    del obj["spec"]["containers"][0]["resources"]
    out = mutated(obj, WebhookConfig(units_resource=UNITS))
    assert resources(out) == {"limits": {UNITS: "100"}}


def test_the_setting_comes_from_the_environment_and_is_checked() -> None:
    assert WebhookConfig.from_env({"GPUSLICE_UNITS_RESOURCE": UNITS}).units_resource == UNITS
    with pytest.raises(ConfigError, match=r"webhook\.unitsResource: .units. must be an extended resource"):
        WebhookConfig(units_resource="units")
    with pytest.raises(ConfigError, match=r"must differ from webhook\.shareResource"):
        WebhookConfig(share_resource=SHARE, units_resource=SHARE)


@pytest.mark.parametrize("config", [CONFIG, WebhookConfig()], ids=["configured", "default-name"])
def test_units_are_refused_on_a_pod_gpuslice_does_not_place(config: WebhookConfig) -> None:
    obj = pod(containers=[container("app", limits={UNITS: "100"})], scheduler_name="default-scheduler")
    reply = validate(review(obj), config)
    assert reply.response["allowed"] is False and reply.response["status"]["code"] == 403
    message = reply.response["status"]["message"]
    assert f"spec.containers[0].resources.limits {UNITS}" in message and "node agent's GPU units" in message
    placed = pod(
        {P + "gpu-count": "1"}, containers=[container("app", limits={UNITS: "100"})], scheduler_name="gpuslice"
    )
    assert validate(review(placed), config).response["allowed"] is True
