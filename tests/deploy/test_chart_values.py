"""values.yaml, values.schema.json, README and template layout of helm/fp8rl."""

from __future__ import annotations

import copy
import re
import tomllib

import jsonschema
import pytest
import yaml
from chart_readme import documented_keys, leaf_paths, readme_with_table
from chartlib import (
    CHART,
    chart_values,
    helm,
    merged,
    one,
    render,
    rendered_by_template,
    validate,
    values_schema_validator,
)

BAD_VALUES = [
    # (values, JSON path Helm names, words the message must contain)
    ({"mode": "jobs"}, "/mode", ["'cluster'", "'job'"]),
    ({"workerDefaults": {"gpus": "eight"}}, "/workerDefaults/gpus", ["string", "integer"]),
    ({"workerGroups": [{"name": "GPU_big"}]}, "/workerGroups/0/name", ["GPU_big"]),
    ({"workerGroups": [{"name": "gpu", "gpu": 8}]}, "/workerGroups/0", ["gpu"]),
    ({"workerGroups": []}, "/workerGroups", ["minItems", "1"]),
    ({"api": {"prot": 8000}}, "/api", ["prot"]),
    ({"api": {"port": 70000}}, "/api/port", ["maximum"]),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", ["IfNotPresent"]),
    ({"persistence": {"accessModes": ["ReadWriteAll"]}}, "/persistence/accessModes/0", []),
    ({"job": {"overrides": ["steps = 3"]}}, "/job/overrides/0", []),
    ({"job": {"overrides": ["name=it's"]}}, "/job/overrides/0", []),
    ({"api": {"database": {"url": "mysql://db/fp8rl"}}}, "/api/database/url", []),
    ({"ray": {"version": "latest"}}, "/ray/version", []),
]


@pytest.mark.parametrize(("values", "path", "words"), BAD_VALUES, ids=[p for _, p, _ in BAD_VALUES])
def test_helm_rejects_bad_values_naming_the_key(values, path, words):
    with pytest.raises(helm.HelmValuesError) as info:
        render(values)
    message = str(info.value)
    assert f"at '{path}'" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(("values", "path", "words"), BAD_VALUES, ids=[p for _, p, _ in BAD_VALUES])
def test_values_schema_rejects_bad_values_with_jsonschema_too(values, path, words):
    error = jsonschema.exceptions.best_match(values_schema_validator().iter_errors(merged(values)))
    assert error is not None, values
    # The error sits at the bad key (an unknown key: at the mapping that holds it), as in Helm.
    assert "/" + "/".join(str(p) for p in error.absolute_path) == path, error.message


def test_values_schema_accepts_the_defaults_and_every_documented_example():
    validator = values_schema_validator()
    validator.validate(chart_values())
    validator.validate(merged({"mode": "job", "job": {"spec": "name: x\n"}}))
    validator.validate(merged({"workerGroups": [{"name": "a"}, {"name": "b-2", "gpus": 4}]}))


def test_values_schema_closes_every_chart_owned_mapping():
    # A typo in a key of ours must be an error, not a silently ignored value.
    def walk(node, where):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(values_schema_validator().schema, "")


def test_every_value_has_a_helm_docs_comment():
    text = (CHART / "values.yaml").read_text()
    documented = [d.key for d in documented_keys(text)]
    for leaf in leaf_paths(yaml.safe_load(text)):
        covering = [k for k in documented if leaf == k or leaf.startswith(k + ".")]
        assert len(covering) == 1, f"{leaf}: documented by {covering or 'no `# --` comment'}"
    assert all(d.description for d in documented_keys(text))


def test_comment_check_notices_an_undocumented_value():
    text = (CHART / "values.yaml").read_text().replace("  # -- Image pull policy.\n", "")
    documented = [d.key for d in documented_keys(text)]
    assert "image.pullPolicy" not in documented
    assert "image.repository" in documented


def test_readme_values_table_is_in_sync_with_values_yaml():
    readme = (CHART / "README.md").read_text()
    expected = readme_with_table(readme, (CHART / "values.yaml").read_text())
    assert readme == expected, "run: python tests/deploy/chart_readme.py"


def test_readme_lists_every_template():
    readme = (CHART / "README.md").read_text()
    templates = sorted(
        str(p.relative_to(CHART / "templates")) for p in (CHART / "templates").rglob("*.yaml")
    )
    for template in templates:
        assert f"`{template}`" in readme, template


def test_one_template_per_kind():
    cases = [
        {},
        {"mode": "job", "job": {"spec": {"name": "x"}}},
        {"api": {"database": {"url": "sqlite:///x.db"}}},
    ]
    owner: dict[str, str] = {}
    for values in cases:
        for template, objects in rendered_by_template(values).items():
            for kind in {o["kind"] for o in objects}:
                assert owner.setdefault(kind, template) == template, (kind, owner[kind], template)
                assert len({o["kind"] for o in objects}) == 1, template
    expected = {p.name for p in (CHART / "templates").glob("*.yaml")}
    assert {t for t in owner.values() if "/" not in t} == expected
    helpers = {p.name for p in (CHART / "templates").glob("_*.tpl")}
    assert "_helpers.tpl" in helpers and (CHART / "templates" / "NOTES.txt").exists()


def test_chart_versions_match_the_project_and_the_image(repo):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    dockerfile = (repo / "deploy" / "Dockerfile").read_text()
    (ray_arg,) = re.findall(r"^ARG RAY_VERSION=(\S+)$", dockerfile, flags=re.M)
    assert chart_values()["ray"]["version"] == ray_arg


def test_validators_reject_what_the_api_server_or_kubectl_would():
    objects, _ = render()
    broken = []
    cluster = copy.deepcopy(one(objects, "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resourcez"] = {}
    broken.append(cluster)
    cluster = copy.deepcopy(one(objects, "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["rayStartParams"] = {"num-gpus": 8}
    broken.append(cluster)
    deployment = copy.deepcopy(one(objects, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    broken.append(deployment)
    service = copy.deepcopy(one(objects, "Service"))
    service["metadata"]["name"] = "Fp8rl_API"
    broken.append(service)
    for obj in broken:
        with pytest.raises(AssertionError):
            validate(obj)
