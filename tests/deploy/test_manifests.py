"""Every manifest parses and validates against its schema; the pieces agree with each other.

Kubernetes objects go through the ``kubernetes`` client's pydantic models (``extra='forbid'``:
an unknown or misspelt field fails) and must survive a round trip unchanged (a snake_case key,
which the models also accept, would come back camelCase). Objects without a client model
(kustomize, cert-manager) are checked against field tables written from their API types.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from pydantic import BaseModel

from scheduler.core.quota import parse_quota
from tests.deploy.manifests import MANIFESTS, REPO, Doc, container, documents, find, yaml_files

# (apiVersion, kind) -> the client model: the right model per kind, and the right group for it.
MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("v1", "Namespace"): k8s.V1Namespace,
    ("v1", "ServiceAccount"): k8s.V1ServiceAccount,
    ("v1", "ConfigMap"): k8s.V1ConfigMap,
    ("v1", "Service"): k8s.V1Service,
    ("v1", "Pod"): k8s.V1Pod,
    ("v1", "Node"): k8s.V1Node,
    ("apps/v1", "Deployment"): k8s.V1Deployment,
    ("apps/v1", "DaemonSet"): k8s.V1DaemonSet,
    ("batch/v1", "Job"): k8s.V1Job,
    ("batch/v1", "CronJob"): k8s.V1CronJob,
    ("policy/v1", "PodDisruptionBudget"): k8s.V1PodDisruptionBudget,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.V1ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.V1ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.V1RoleBinding,
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): k8s.V1MutatingWebhookConfiguration,
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): k8s.V1ValidatingWebhookConfiguration,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): k8s.V1CustomResourceDefinition,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): k8s.V1ValidatingAdmissionPolicy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): k8s.V1ValidatingAdmissionPolicyBinding,
}

# ---------------------------------------------------------------- schemas without a client model
# A schema is a dict of field -> schema, a one-element list [schema] for a list of it, or a
# leaf type (str, int, bool, float, DURATION, ANY).
DURATION = "duration"  # a Go time.Duration string, such as 10s, 1m30s, 87600h
ANY = "any"
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")

OBJECT_META = {"name": str, "namespace": str, "labels": ANY, "annotations": ANY}

# kustomize.config.k8s.io/v1beta1 Kustomization: the fields used here.
KUSTOMIZATION = {
    "apiVersion": str,
    "kind": str,
    "namespace": str,
    "resources": [str],
    "labels": [{"pairs": ANY, "includeSelectors": bool, "includeTemplates": bool}],
    "images": [{"name": str, "newName": str, "newTag": str, "digest": str}],
}

# cert-manager.io/v1 (cert-manager's pkg/apis/certmanager/v1 types): the fields of the
# Issuer kinds and Certificate spec gpuslice can use.
ISSUER_REF = {"name": str, "kind": str, "group": str}
CERT_MANAGER = {
    "Issuer": {
        "apiVersion": str,
        "kind": str,
        "metadata": OBJECT_META,
        "spec": {
            "selfSigned": {"crlDistributionPoints": [str]},
            "ca": {"secretName": str, "crlDistributionPoints": [str]},
        },
    },
    "Certificate": {
        "apiVersion": str,
        "kind": str,
        "metadata": OBJECT_META,
        "spec": {
            "secretName": str,
            "commonName": str,
            "dnsNames": [str],
            "ipAddresses": [str],
            "uris": [str],
            "isCA": bool,
            "duration": DURATION,
            "renewBefore": DURATION,
            "usages": [str],
            "privateKey": {"algorithm": str, "size": int, "encoding": str, "rotationPolicy": str},
            "issuerRef": ISSUER_REF,
            "secretTemplate": {"labels": ANY, "annotations": ANY},
        },
    },
}
CERT_USAGES = {
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
}

# kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1 types.go and the
# component-base v1alpha1 types it embeds), field by field.
PLUGIN_SET = {"enabled": [{"name": str, "weight": int}], "disabled": [{"name": str, "weight": int}]}
EXTENSION_POINTS = (
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
)
KUBE_SCHEDULER_CONFIGURATION = {
    "apiVersion": str,
    "kind": str,
    "parallelism": int,
    "leaderElection": {
        "leaderElect": bool,
        "leaseDuration": DURATION,
        "renewDeadline": DURATION,
        "retryPeriod": DURATION,
        "resourceLock": str,
        "resourceName": str,
        "resourceNamespace": str,
    },
    "clientConnection": {"kubeconfig": str, "acceptContentTypes": str, "contentType": str, "qps": float, "burst": int},
    "enableProfiling": bool,
    "enableContentionProfiling": bool,
    "percentageOfNodesToScore": int,
    "podInitialBackoffSeconds": int,
    "podMaxBackoffSeconds": int,
    "profiles": [
        {
            "schedulerName": str,
            "percentageOfNodesToScore": int,
            "plugins": dict.fromkeys(EXTENSION_POINTS, PLUGIN_SET),
            "pluginConfig": [{"name": str, "args": ANY}],
        }
    ],
    "extenders": [
        {
            "urlPrefix": str,
            "filterVerb": str,
            "preemptVerb": str,
            "prioritizeVerb": str,
            "weight": int,
            "bindVerb": str,
            "enableHTTPS": bool,
            "tlsConfig": {
                "insecure": bool,
                "serverName": str,
                "certFile": str,
                "keyFile": str,
                "caFile": str,
                "certData": str,
                "keyData": str,
                "caData": str,
            },
            "httpTimeout": DURATION,
            "nodeCacheCapable": bool,
            "managedResources": [{"name": str, "ignoredByScheduler": bool}],
            "ignorable": bool,
        }
    ],
    "delayCacheUntilActive": bool,
}


def check_schema(value: Any, schema: Any, path: str = "") -> list[str]:
    """Every field of ``value`` not allowed by ``schema``, or of the wrong type, by its path."""
    if schema is ANY:
        return []
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path or '.'}: expected an object, got {type(value).__name__}"]
        problems = []
        for key, item in value.items():
            if key not in schema:
                problems.append(f"{path}.{key}: unknown field (accepted: {', '.join(sorted(schema))})")
            else:
                problems.extend(check_schema(item, schema[key], f"{path}.{key}"))
        return problems
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in check_schema(item, schema[0], f"{path}[{i}]")]
    if schema == DURATION:
        return [] if isinstance(value, str) and _DURATION.match(value) else [f"{path}: {value!r} is not a duration"]
    if schema is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number, got {value!r}"]
    if schema is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {value!r}"]
    return [] if isinstance(value, schema) else [f"{path}: expected {schema.__name__}, got {value!r}"]


def test_the_schema_checker_catches_mistakes() -> None:
    bad = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [{"urlPrefix": "http://x", "nodeCacheable": True, "weight": "5", "httpTimeout": "5 seconds"}],
        "profiles": {"schedulerName": "x"},
    }
    assert check_schema(bad, KUBE_SCHEDULER_CONFIGURATION) == [
        ".extenders[0].nodeCacheable: unknown field (accepted: bindVerb, enableHTTPS, filterVerb, httpTimeout, "
        "ignorable, managedResources, nodeCacheCapable, preemptVerb, prioritizeVerb, tlsConfig, urlPrefix, weight)",
        ".extenders[0].weight: expected an integer, got '5'",
        ".extenders[0].httpTimeout: '5 seconds' is not a duration",
        ".profiles: expected a list, got dict",
    ]


# ---------------------------------------------------------------- every document


ALL = list(documents())


def test_there_are_manifests() -> None:
    kinds = {d.kind for d in ALL}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Kustomization",
        "Certificate",
        "Issuer",
        "Job",
        "Pod",
        "Node",
    } <= kinds


@pytest.mark.parametrize("doc", ALL, ids=lambda d: f"{d.where}:{d.kind}/{d.name}")
def test_each_object_validates_against_its_schema(doc: Doc) -> None:
    obj = doc.obj
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key == ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
        assert check_schema(obj, KUSTOMIZATION) == []
        return
    if obj.get("apiVersion") == "cert-manager.io/v1":
        assert obj["kind"] in CERT_MANAGER, obj["kind"]
        assert check_schema(obj, CERT_MANAGER[obj["kind"]]) == []
        assert set(obj["spec"].get("usages", [])) <= CERT_USAGES
        return
    if key == ("gpuslice.io/v1alpha1", "GPUQuota"):
        parse_quota(obj)  # ours: gpuslice's own reader of it (its CRD: test_gpuquota_crd)
        return
    assert key in MODELS, f"{doc.where}: no schema for {key}; accepted: {sorted(MODELS)}"
    model = MODELS[key].model_validate(obj)
    # A round trip returns the document: no snake_case alias, no value coerced on the way.
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


def test_a_misspelt_field_fails_the_model() -> None:
    deployment = find("Deployment", "gpuslice")
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(ValueError, match="replica"):
        k8s.V1Deployment.model_validate(wrong)


def test_the_scheduler_configuration_validates_field_by_field() -> None:
    config = scheduler_configuration()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert check_schema(config, KUBE_SCHEDULER_CONFIGURATION) == []


@pytest.mark.parametrize(
    "root", [MANIFESTS, MANIFESTS / "examples", MANIFESTS / "cert-manager"], ids=lambda p: str(p.relative_to(REPO))
)
def test_each_kustomization_lists_exactly_the_files_beside_it(root: Path) -> None:
    import yaml

    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = sorted(kustomization["resources"])
    beside = sorted(p.name for p in root.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == beside


def test_no_manifest_names_a_local_path_or_a_latest_tag() -> None:
    for path in yaml_files():
        text = path.read_text(encoding="utf-8")
        assert "/work/" not in text and ":latest" not in text, path


# ---------------------------------------------------------------- the pieces agree


def scheduler_configuration() -> dict[str, Any]:
    import yaml

    data = find("ConfigMap", "gpuslice-config")["data"]
    loaded: dict[str, Any] = yaml.safe_load(data["scheduler-config.yaml"])
    return loaded


def gpuslice_configuration() -> dict[str, Any]:
    import yaml

    data = find("ConfigMap", "gpuslice-config")["data"]
    loaded: dict[str, Any] = yaml.safe_load(data["gpuslice.yaml"])
    return loaded


def mount_of(c: dict[str, Any], volume: str) -> str:
    paths = [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == volume]
    assert len(paths) == 1, (c["name"], volume)
    return str(paths[0])


# Default score plugins of kube-scheduler (pkg/scheduler/apis/config/v1/default_plugins.go) and
# their weights; VolumeBinding scores only with storage-capacity scoring on, counted anyway.
DEFAULT_SCORE_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
    "VolumeBinding": 1,
}
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10


def test_the_extender_entry() -> None:
    (extender,) = scheduler_configuration()["extenders"]
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert "managedResources" not in extender  # annotation-only requests name no extended resource
    assert extender["httpTimeout"]
    # GPU packing dominates: one extender point (x weight x 100/10) outweighs the whole in-tree range.
    # 13 x 100 = 1300 < 1 x 200 x 10 = 2000.
    in_tree_range = sum(DEFAULT_SCORE_WEIGHTS.values()) * MAX_NODE_SCORE
    one_point = extender["weight"] * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    assert in_tree_range == 1300
    assert one_point > in_tree_range


def test_the_extender_reaches_gpuslice_in_the_pod_over_tls() -> None:
    (extender,) = scheduler_configuration()["extenders"]
    served = gpuslice_configuration()
    deployment = find("Deployment", "gpuslice")
    gpuslice, scheduler = container(deployment, "gpuslice"), container(deployment, "kube-scheduler")
    assert extender["urlPrefix"] == f"https://127.0.0.1:{served['port']}"
    assert {p["containerPort"] for p in gpuslice["ports"]} == {served["port"]}
    assert served["host"] == "0.0.0.0"  # the API server reaches the webhook through the Service
    # The scheduler checks gpuslice's certificate with the CA from the same Secret, by the Service's name.
    assert extender["enableHTTPS"] is True and "insecure" not in extender["tlsConfig"]
    tls_dir = mount_of(scheduler, "tls")
    assert extender["tlsConfig"]["caFile"] == f"{tls_dir}/ca.crt"
    service = find("Service", "gpuslice")
    assert (
        extender["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    )
    certificate = find("Certificate", "gpuslice-serving-cert", MANIFESTS / "cert-manager")
    assert extender["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]
    assert served["tls_cert"] == f"{mount_of(gpuslice, 'tls')}/tls.crt"
    assert served["tls_key"] == f"{mount_of(gpuslice, 'tls')}/tls.key"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]


def test_the_scheduler_profile_and_leader_election() -> None:
    config = scheduler_configuration()
    (profile,) = config["profiles"]
    from scheduler.webhook.review import DEFAULT_SCHEDULER_NAME

    assert profile["schedulerName"] == DEFAULT_SCHEDULER_NAME
    election = config["leaderElection"]
    assert election["leaderElect"] is True and election["resourceLock"] == "leases"
    assert election["resourceName"] != "kube-scheduler"  # the default scheduler's Lease
    assert election["resourceNamespace"] == find("Deployment", "gpuslice")["metadata"]["namespace"]


def test_the_containers_read_the_config_they_are_given() -> None:
    deployment = find("Deployment", "gpuslice")
    gpuslice, scheduler = container(deployment, "gpuslice"), container(deployment, "kube-scheduler")
    config_dir = mount_of(gpuslice, "config")
    assert gpuslice["args"][:3] == ["serve", "--config", f"{config_dir}/gpuslice.yaml"]
    assert f"--config={mount_of(scheduler, 'config')}/scheduler-config.yaml" in scheduler["command"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "gpuslice-config"


def test_the_gpuslice_config_is_valid_for_serve(certificate: Path) -> None:
    from scheduler.extender.config import ServeConfig

    config = gpuslice_configuration()
    for field in ("tls_cert", "tls_key"):  # the Secret's files exist only in the pod: a pair made the same way
        config[field] = str(certificate / Path(config[field]).name)
    served = ServeConfig.model_validate(config)
    assert served.scheme == "https"
    # The environment overrides the file: the container sets none of the service's settings there.
    from scheduler.extender.config import ENV_FIELDS, ENV_PREFIX

    env = {e["name"] for e in container(find("Deployment", "gpuslice"), "gpuslice")["env"]}
    assert not env & {ENV_PREFIX + suffix for suffix in ENV_FIELDS}


def test_the_serve_flags_used_exist() -> None:
    import typer.main

    from scheduler.cli import app

    command = typer.main.get_command(app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]
    options = {opt for param in serve.params for opt in param.opts}
    args = container(find("Deployment", "gpuslice"), "gpuslice")["args"]
    assert args[0] == "serve"
    assert {a for a in args[1:] if a.startswith("--")} <= options


def control_plane_release() -> str:
    """The Kubernetes release the test control plane is built from (e2e/controlplane/go.mod)."""
    text = (REPO / "e2e" / "controlplane" / "go.mod").read_text(encoding="utf-8")
    (release,) = re.findall(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)\s*$", text, re.MULTILINE)
    return release


def test_every_place_that_names_the_kube_scheduler_image_names_the_tested_release() -> None:
    """The manifests, the chart and the deployment guide pin the kube-scheduler the e2e tier tests."""
    image = f"registry.k8s.io/kube-scheduler:{control_plane_release()}"
    places = [
        MANIFESTS / "deployment.yaml",
        REPO / "charts" / "gpuslice" / "templates" / "deployment.yaml",
        REPO / "docs" / "deploying.md",
    ]
    for place in places:
        named = set(re.findall(r"registry\.k8s\.io/kube-scheduler:[\w.-]+", place.read_text(encoding="utf-8")))
        assert named == {image}, f"{place.relative_to(REPO)} names {sorted(named)}, the e2e tier tests {image}"


def test_the_deployment() -> None:
    deployment = find("Deployment", "gpuslice")
    spec = deployment["spec"]
    pod = spec["template"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    gpuslice, scheduler = container(deployment, "gpuslice"), container(deployment, "kube-scheduler")
    port_names = {p["name"]: p["containerPort"] for p in gpuslice["ports"]}
    assert gpuslice["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gpuslice["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert gpuslice[probe]["httpGet"]["port"] in port_names and gpuslice[probe]["httpGet"]["scheme"] == "HTTPS"
    # the upstream image at the release the test control plane runs (tests/e2e)
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{control_plane_release()}"
    # Prometheus scrapes the port gpuslice serves /metrics on
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) in port_names.values()
    assert annotations["prometheus.io/path"] == "/metrics"
    for c in (gpuslice, scheduler):
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    # every mount names a volume; /tmp is the only writable place
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for c in (gpuslice, scheduler):
        for m in c["volumeMounts"]:
            assert m["name"] in volumes
            assert m.get("readOnly") is True or "emptyDir" in volumes[m["name"]]


def test_the_pods_meet_the_restricted_pod_security_standard() -> None:
    namespace = find("Namespace", "gpuslice")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = find("Deployment", "gpuslice")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("hostPath" not in v for v in pod["volumes"])
    for c in pod["containers"]:
        context = c["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert not context.get("capabilities", {}).get("add")


def test_the_budget_and_the_service_select_the_pods() -> None:
    deployment = find("Deployment", "gpuslice")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = find("PodDisruptionBudget", "gpuslice")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]
    service = find("Service", "gpuslice")
    assert service["spec"]["selector"].items() <= labels.items()
    names = {p["name"] for p in container(deployment, "gpuslice")["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


def webhooks() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        out.extend((kind, w) for w in find(kind, "gpuslice")["webhooks"])
    return out


def test_the_webhooks() -> None:
    from scheduler.webhook.routes import router

    paths = {getattr(r, "path", None) for r in router.routes}
    service = find("Service", "gpuslice")
    namespace = service["metadata"]["namespace"]
    seen = {}
    for kind, hook in webhooks():
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        target = hook["clientConfig"]["service"]
        assert (target["name"], target["namespace"]) == (service["metadata"]["name"], namespace)
        assert target["port"] in {p["port"] for p in service["spec"]["ports"]}
        assert target["path"] in paths
        (rule,) = hook["rules"]
        (resource,) = rule["resources"]
        assert rule["apiGroups"] == [""]
        if resource == "pods":
            # scoped: never gpuslice's own namespace (it must restart while its webhook is down)
            expressions = hook["namespaceSelector"]["matchExpressions"]
            assert {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [namespace, "kube-system"],
            } in expressions
        else:  # the node agent's evictions, in every namespace, and only the agent's (test_webhook_eviction.py)
            assert "namespaceSelector" not in hook and hook["matchConditions"]
        seen[(kind, resource, tuple(rule["operations"]))] = (hook["failurePolicy"], target["path"])
    assert seen == {
        # new pods fail closed
        ("MutatingWebhookConfiguration", "pods", ("CREATE",)): ("Fail", "/mutate"),
        ("ValidatingWebhookConfiguration", "pods", ("CREATE",)): ("Fail", "/validate"),
        # updates must not stop while gpuslice is down
        ("ValidatingWebhookConfiguration", "pods", ("UPDATE",)): ("Ignore", "/validate"),
        # the node agent's evictions fail closed: only pods gpuslice placed on its node
        ("ValidatingWebhookConfiguration", "pods/eviction", ("CREATE",)): ("Fail", "/validate-eviction"),
    }


def test_cert_manager_injects_the_ca_of_the_serving_certificate() -> None:
    certificate = find("Certificate", "gpuslice-serving-cert", MANIFESTS / "cert-manager")
    expected = f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert find(kind, "gpuslice")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == expected
    issuer = find("Issuer", certificate["spec"]["issuerRef"]["name"], MANIFESTS / "cert-manager")
    ca = find("Certificate", issuer["spec"]["ca"]["secretName"], MANIFESTS / "cert-manager")
    assert ca["spec"]["isCA"] is True


def test_namespaced_objects_sit_in_gpuslice_namespace() -> None:
    namespace = find("Namespace", "gpuslice")["metadata"]["name"]
    agent_namespace = find("Namespace", "gpuslice-agent")["metadata"]["name"]
    for doc in documents(MANIFESTS):
        if doc.path.parent.name == "examples" or doc.path.parent.parent.name == "examples":
            continue
        meta = doc.obj.get("metadata") or {}
        if doc.kind in (
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "Kustomization",
            "CustomResourceDefinition",
        ):
            assert "namespace" not in meta, doc.where
        elif doc.name == "gpuslice-scheduler-authentication-reader":
            assert meta["namespace"] == "kube-system"
        elif doc.path.name == "agent.yaml":  # privileged: a namespace of its own
            assert meta.get("namespace") == agent_namespace, doc.where
        else:
            assert meta.get("namespace") == namespace, doc.where


def test_the_agents_namespace_admits_its_privileged_pod_and_no_other_namespace_does() -> None:
    levels = {
        d.name: d.obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for d in documents(MANIFESTS)
        if d.kind == "Namespace" and d.path.parent == MANIFESTS
    }
    assert levels == {"gpuslice": "restricted", "gpuslice-agent": "privileged"}
    daemonset = find("DaemonSet", "gpuslice-agent")
    assert daemonset["metadata"]["namespace"] == "gpuslice-agent"
    subjects = find("ClusterRoleBinding", "gpuslice-agent")["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "gpuslice-agent", "namespace": "gpuslice-agent"}]
