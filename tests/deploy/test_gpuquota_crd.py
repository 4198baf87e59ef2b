"""The GPUQuota CRD: the schema the API server checks a quota against (pattern, minimum, CEL).

The API server itself runs these rules in the control-plane tier; here the schema's shape is
checked against what gpuslice reads (:func:`scheduler.core.quota.parse_quota`), so that a
quota the API server admits is one gpuslice understands, and the other way round.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from scheduler.core.errors import QuotaError
from scheduler.core.quota import GROUP, KIND, parse_quota
from tests.deploy.manifests import MANIFESTS, find

CRD = find("CustomResourceDefinition", "gpuquotas.gpuslice.io")
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
LIMITS = SCHEMA["properties"]["spec"]["properties"]["limits"]
PER_MODEL = LIMITS["properties"]["models"]["additionalProperties"]
PATTERN = LIMITS["properties"]["gpuMemory"]["pattern"]


def test_the_crd_names_the_kind_gpuslice_reads() -> None:
    assert CRD["spec"]["group"] == GROUP
    assert CRD["spec"]["names"]["kind"] == KIND
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["metadata"]["name"] == f"{CRD['spec']['names']['plural']}.{GROUP}"
    assert VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}  # gpuslice patches status, never spec


def test_the_crd_is_installed_with_the_rest() -> None:
    resources = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert "gpuquota-crd.yaml" in resources
    # before anything that could name a GPUQuota
    assert resources.index("gpuquota-crd.yaml") < resources.index("rbac.yaml")


@pytest.mark.parametrize("where", [LIMITS, PER_MODEL], ids=["limits", "per-model"])
def test_each_limit_is_checked_by_the_schema(where: dict[str, Any]) -> None:
    props = where["properties"]
    for field in ("gpuMemory", "gpuCompute"):
        assert props[field]["x-kubernetes-int-or-string"] is True
        assert props[field]["pattern"] == PATTERN  # a quantity, written as a string
        assert props[field]["minimum"] == 0  # written as a number
    assert props["gpus"]["type"] == "integer"
    assert props["gpus"]["minimum"] == 0
    # an empty limits object says nothing: refused by a CEL rule
    (empty,) = where["x-kubernetes-validations"]
    assert empty["rule"].startswith("has(self.gpuMemory) || has(self.gpuCompute) || has(self.gpus)")


@pytest.mark.parametrize(
    ("value", "admitted"),
    [
        ("320Gi", True),
        ("40960Mi", True),
        ("80G", True),
        ("0.5", True),
        ("2500m", True),
        ("1e3", True),
        ("+4", True),
        ("100u", False),  # micro and nano: no GPU quota is that small, and gpuslice reads neither
        ("-1", False),
        ("lots", False),
        ("4 GPUs", False),
        ("", False),
    ],
)
def test_the_schema_and_gpuslice_agree_on_a_quantity(value: str, admitted: bool) -> None:
    # the API server checks the CRD's pattern; gpuslice reads the quota with parse_quota
    assert bool(re.match(PATTERN, value)) is admitted
    obj = {"metadata": {"name": "q", "namespace": "n"}, "spec": {"limits": {"gpuMemory": value}}}
    if admitted:
        parse_quota(obj)
    else:
        with pytest.raises(QuotaError, match=r"spec\.limits\.gpuMemory: invalid value"):
            parse_quota(obj)


def test_the_schema_accepts_exactly_the_fields_gpuslice_reads() -> None:
    assert set(LIMITS["properties"]) == {"gpuMemory", "gpuCompute", "gpus", "models"}
    assert set(PER_MODEL["properties"]) == {"gpuMemory", "gpuCompute", "gpus"}
    assert SCHEMA["properties"]["spec"]["required"] == ["limits"]
    # fields the schema leaves out are pruned by the API server; parse_quota refuses them by name
    with pytest.raises(QuotaError, match=r"spec\.limits\.gpu: unknown field"):
        parse_quota({"metadata": {"name": "q", "namespace": "n"}, "spec": {"limits": {"gpu": 1}}})


def test_status_has_what_gpuslice_writes() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    assert set(status) == {"used", "overQuota"}
    assert set(status["used"]["properties"]) == {"gpuMemory", "gpuCompute", "gpus", "models"}


def test_the_printer_columns_point_at_fields_of_the_schema() -> None:
    for column in VERSION["additionalPrinterColumns"]:
        node: dict[str, Any] = SCHEMA
        for part in column["jsonPath"].lstrip(".").split("."):
            node = node["properties"][part]
        assert node.get("type", "string") == column["type"] or "anyOf" in node, column


def test_the_example_quota_is_read_as_written() -> None:
    quota = parse_quota(find("GPUQuota", "gpu-demo", MANIFESTS / "examples"))
    # 512Gi = 512 x 1024 = 524288 MiB; "8" GPUs of compute = 8000 milli; 4 whole H100s
    assert (quota.limits.memory_mib, quota.limits.compute_milli, quota.limits.gpus) == (524288, 8000, None)
    assert [(m, lim.gpus) for m, lim in quota.models] == [("H100-80GB", 4)]
