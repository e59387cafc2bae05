"""Render and validate the Helm chart helm/fp8rl without a cluster and without the helm binary.

Renderer: the PyPI package ``helm-python-sdk`` (import ``helm_python``) binds with ctypes to
``libhelm_c``, a C ABI over Helm's own Go SDK (v4) shipped inside the wheel. Rendering, values
merging, ``values.schema.json`` validation and lint are Helm's real code paths, offline: no
cluster, no network (``lookup`` returns nothing, as in ``helm template``).

Validators, one per kind of object:
- KubeRay custom resources (RayCluster, RayJob) against the ``ray.io/v1`` OpenAPI schema of the
  CRDs in ``../shared/k8s/kuberay-crds/`` with ``jsonschema``. The API server prunes unknown
  fields of a CRD silently, and ``kubectl`` (``--validate=strict``) rejects them; to match the
  latter, every object schema that lists ``properties`` is closed (``additionalProperties:
  false``) unless it keeps unknown fields on purpose (``x-kubernetes-preserve-unknown-fields``).
- Core kinds with ``kubernetes-validate`` (strict schemas, Kubernetes ``KUBE_VERSIONS``).
- Object names and label values with the DNS rules the API server applies (the JSON schemas do
  not carry them).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="needs helm-python-sdk (the dev extra)")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="needs kubernetes-validate (the dev extra)"
)

from fp8rl_testing import REPO, shared_path  # noqa: E402

CHART = REPO / "helm" / "fp8rl"
RELEASE = "fp8rl"
NAMESPACE = "ml"
KUBE_VERSIONS = ("1.30", "1.37")
"""Oldest Kubernetes minor the chart is checked against, and the newest kubernetes-validate knows."""

CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Kinds whose names become DNS labels (Service names, and the RayCluster's "<name>-head-svc").
LABEL_NAMED_KINDS = {"Service", "RayCluster", "RayJob"}


def render(
    values: dict[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> tuple[list[dict[str, Any]], str]:
    """Render the chart as ``helm install`` would: (objects, NOTES.txt text).

    Raises:
        helm_python.HelmValuesError: values rejected by values.schema.json.
        helm_python.HelmRenderError: a template failed (e.g. a ``fail`` with a message).
    """
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=release, namespace=namespace, is_install=True)
    notes = ""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("__template__", path.removeprefix("fp8rl/templates/"))
                objects.append(doc)
    return objects, notes


def rendered_by_template(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Objects grouped by the template file that produced them."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return {
        path.removeprefix("fp8rl/templates/"): [d for d in yaml.safe_load_all(text) if d]
        for path, text in out.items()
        if not path.endswith("NOTES.txt")
    }


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The single object of ``kind``; fails the test when there are none or several."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    """Sorted kinds of the rendered objects."""
    return sorted(o["kind"] for o in objects)


def _close(schema: Any) -> Any:
    """Close every object schema that lists its properties (kubectl's strict field validation)."""
    if isinstance(schema, dict):
        closed = {k: _close(v) for k, v in schema.items()}
        if (
            "properties" in closed
            and "additionalProperties" not in closed
            and not closed.get("x-kubernetes-preserve-unknown-fields")
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_close(v) for v in schema]
    return schema


@functools.cache
def crd(kind: str) -> dict[str, Any]:
    """The KubeRay CustomResourceDefinition of ``kind`` (skips the test without ../shared)."""
    path = shared_path("k8s", "kuberay-crds", CRD_FILES[kind])
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    definition = yaml.load(path.read_text(), Loader=loader)
    assert definition["spec"]["names"]["kind"] == kind, path
    return definition


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft4Validator:
    """A validator for the ``ray.io/v1`` schema of a KubeRay CRD (skips without ../shared)."""
    (version,) = [v for v in crd(kind)["spec"]["versions"] if v["name"] == "v1"]
    schema = _close(version["schema"]["openAPIV3Schema"])
    # OpenAPI v3 schemas of CRDs are JSON Schema draft 4 with extensions (x-kubernetes-*).
    return jsonschema.Draft4Validator(schema)


def validate(obj: dict[str, Any]) -> None:
    """Validate one rendered object like the API server would; raise AssertionError with the path."""
    obj = {k: v for k, v in obj.items() if k != "__template__"}
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    _check_metadata(obj, where)
    if obj["kind"] in CRD_FILES:
        assert obj["apiVersion"] == "ray.io/v1", where
        errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.path))
        assert not errors, f"{where}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5]
        )
        return
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(f"{where} (Kubernetes {version}): {path}: {exc.message}") from None


def _check_metadata(obj: dict[str, Any], where: str) -> None:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    pattern, limit = (DNS_LABEL, 63) if obj["kind"] in LABEL_NAMED_KINDS else (DNS_SUBDOMAIN, 253)
    assert pattern.match(name) and len(name) <= limit, f"{where}: invalid name {name!r}"
    if obj["kind"] == "RayCluster":
        head_service = f"{name}-head-svc"
        assert len(head_service) <= 63, f"{where}: head Service {head_service!r} too long"
    for label_key, value in (meta.get("labels") or {}).items():
        assert LABEL_VALUE.match(str(value)) and len(str(value)) <= 63, (
            f"{where}: label {label_key}={value!r} is not a valid label value"
        )


def ray_pod_specs(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod specs of a RayCluster or RayJob by group: ``head`` and each worker group name."""
    spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
    pods = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec.get("workerGroupSpecs", []):
        pods[group["groupName"]] = group["template"]["spec"]
    return pods


def claim_of(pod_spec: dict[str, Any]) -> str | None:
    """Claim name of the ``data`` volume of a pod spec (None for an emptyDir)."""
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "data"]
    return (volume.get("persistentVolumeClaim") or {}).get("claimName")


def mounts(container: dict[str, Any]) -> dict[str, str]:
    """volumeMounts of a container as {volume name: mount path}."""
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """env of a container as {name: the EnvVar}."""
    return {e["name"]: e for e in container.get("env", [])}


def chart_values() -> dict[str, Any]:
    """The chart's default values.yaml."""
    return yaml.safe_load((CHART / "values.yaml").read_text())


def values_schema_validator() -> jsonschema.Draft7Validator:
    """values.schema.json as a jsonschema validator (the same file Helm checks values against)."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    """Default values with ``overrides`` coalesced in by Helm itself."""
    with helm.Chart.load(CHART) as chart:
        return chart.merge_values(overrides)


def relative(path: Path) -> str:
    """A repository path for messages."""
    return str(path.relative_to(REPO))
