"""helm/fp8rl rendered with Helm's own engine and every object validated, in each deployment case."""

from __future__ import annotations

import shlex

import pytest
import yaml
from chartlib import (
    CHART,
    NAMESPACE,
    RELEASE,
    claim_of,
    env,
    helm,
    kinds,
    mounts,
    one,
    ray_pod_specs,
    render,
    validate,
)

from fp8rl.protocol import parse_job_spec

JOB_SPEC = {"name": "chart-job", "steps": 2, "rollout": {"n": 2}}
CASES = {
    "defaults": {},
    "job": {"mode": "job", "job": {"spec": JOB_SPEC, "overrides": ["steps=3"]}},
    "two-gpu-groups": {
        "workerGroups": [
            {"name": "h200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
            {"name": "h100", "gpus": 4, "replicas": 2, "maxReplicas": 4},
        ]
    },
    "existing-secret-and-claim": {
        "persistence": {"existingClaim": "shared-nfs"},
        "api": {
            "auth": {"existingSecret": "my-token", "secretKey": "bearer"},
            "database": {"existingSecret": "my-db"},
        },
    },
    "autoscaling": {"ray": {"autoscaling": {"enabled": True, "upscalingMode": "Conservative"}}},
    "postgres-url": {"api": {"database": {"url": "postgresql+psycopg://u:p@db:5432/fp8rl"}}},
    "no-persistence": {"persistence": {"enabled": False}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_validates_against_its_schema(case):
    objects, notes = render(CASES[case])
    assert objects, case
    for obj in objects:
        validate(obj)
    assert RELEASE in notes


@pytest.mark.parametrize("case", ["defaults", {"mode": "job", "job": {"spec": JOB_SPEC}}])
def test_chart_lints_without_warnings(case):
    values = CASES["defaults"] if case == "defaults" else case
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


def test_defaults_deploy_a_raycluster_with_the_api_and_a_shared_claim():
    objects, _ = render()
    assert kinds(objects) == [
        "Deployment",
        "PersistentVolumeClaim",
        "Pod",  # the `helm test` hook
        "RayCluster",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    cluster = one(objects, "RayCluster")
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    api = one(objects, "Deployment")["spec"]["template"]["spec"]
    pods = ray_pod_specs(cluster)
    assert set(pods) == {"head", "gpu"}
    # One claim holds models, datasets and runs for every pod: head, workers and the API server.
    for pod in [*pods.values(), api]:
        assert claim_of(pod) == claim
        assert mounts(pod["containers"][0])["data"] == "/data"
    assert claim_of(api) == claim


def test_gpu_workers_request_gpus_tolerate_the_gpu_taint_and_get_a_memory_backed_shm():
    objects, _ = render()
    pods = ray_pod_specs(one(objects, "RayCluster"))
    worker = pods["gpu"]
    container = worker["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
    # CPU/memory requests stay as given (not replaced by the limits).
    assert container["resources"]["requests"]["cpu"] == "32"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker[
        "tolerations"
    ]
    shm = next(v for v in worker["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert mounts(container)["dshm"] == "/dev/shm"
    head = pods["head"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"]["limits"]
    # KubeRay finds the GCS and job-API ports by these names (head Service, RayJob submitter).
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["gcs-server"] == 6379 and ports["dashboard"] == 8265
    assert "NCCL_DEBUG" in env(container) and "NCCL_DEBUG" in env(head)


def test_api_talks_to_the_head_dashboard_with_a_token_from_the_generated_secret():
    objects, _ = render()
    cluster = one(objects, "RayCluster")["metadata"]["name"]
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    variables = env(container)
    assert variables["RAY_ADDRESS"]["value"] == f"http://{cluster}-head-svc.{NAMESPACE}.svc:8265"
    assert variables["FP8RL_DATA_DIR"]["value"] == "/data/api"  # on the claim (mounted at /data)
    ref = variables["FP8RL_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = one(objects, "Secret")
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["data"]
    assert container["command"] == ["fp8rl", "serve"]
    assert container["args"][:4] == ["--host", "0.0.0.0", "--port", "8000"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"name": "http", "containerPort": 8000} in container["ports"]
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"].items() <= (
        one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_job_mode_runs_the_driver_on_the_jobspec_from_the_configmap_and_shuts_down():
    objects, _ = render(CASES["job"])
    assert kinds(objects) == ["ConfigMap", "PersistentVolumeClaim", "RayJob", "ServiceAccount"]
    job = one(objects, "RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    assert job["submissionMode"] == "K8sJobMode"
    argv = shlex.split(job["entrypoint"])
    assert argv[:3] == ["python", "-m", "fp8rl.services.driver"]
    assert argv[4:] == ["output_dir=/data/runs", "steps=3"]
    # The spec file the entrypoint names is the ConfigMap, mounted on the head (the driver runs there).
    configmap = one(objects, "ConfigMap")
    head = ray_pod_specs(one(objects, "RayJob"))["head"]
    (volume,) = [v for v in head["volumes"] if v.get("configMap")]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    spec_dir = mounts(head["containers"][0])[volume["name"]]
    filename = argv[3].removeprefix(spec_dir + "/")
    assert argv[3] == f"{spec_dir}/{filename}"
    spec = parse_job_spec(configmap["data"][filename], argv[4:])
    assert (spec.name, spec.steps, spec.output_dir) == ("chart-job", 3, "/data/runs")


def test_job_mode_keeps_a_spec_given_as_a_file_verbatim(repo):
    text = (repo / "deploy" / "jobs" / "qwen2.5-7b-gsm8k-math-8gpu.yaml").read_text()
    objects, _ = render({"mode": "job", "job": {"spec": text}})
    stored = one(objects, "ConfigMap")["data"]["job.yaml"]
    assert stored == text
    assert parse_job_spec(stored).model.path == "/data/models/Qwen2.5-7B-Instruct"


def test_two_worker_groups_each_get_their_own_settings_over_the_defaults():
    objects, _ = render(CASES["two-gpu-groups"])
    spec = one(objects, "RayCluster")["spec"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert list(groups) == ["h200", "h100"]
    h200, h100 = groups["h200"], groups["h100"]
    assert (h200["replicas"], h200["minReplicas"], h200["maxReplicas"]) == (1, 1, 1)
    assert (h100["replicas"], h100["minReplicas"], h100["maxReplicas"]) == (2, 1, 4)
    h200_pod, h100_pod = h200["template"]["spec"], h100["template"]["spec"]
    assert h200_pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert "nodeSelector" not in h100_pod
    assert h200_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert h100_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    # Defaults the groups did not override still apply to both.
    for pod in (h200_pod, h100_pod):
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_existing_secret_and_claim_are_used_and_not_created():
    objects, _ = render(CASES["existing-secret-and-claim"])
    assert "Secret" not in kinds(objects)
    assert "PersistentVolumeClaim" not in kinds(objects)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    variables = env(container)
    assert variables["FP8RL_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-token",
        "key": "bearer",
    }
    assert variables["FP8RL_STORE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-db",
        "key": "url",
    }
    pods = [*ray_pod_specs(one(objects, "RayCluster")).values()]
    pods.append(one(objects, "Deployment")["spec"]["template"]["spec"])
    assert {claim_of(pod) for pod in pods} == {"shared-nfs"}


def test_a_database_url_value_is_stored_in_the_chart_secret_not_in_the_pod_spec():
    url = CASES["postgres-url"]["api"]["database"]["url"]
    objects, _ = render(CASES["postgres-url"])
    secret = one(objects, "Secret")
    assert set(secret["data"]) == {"token", "database-url"}
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ref = env(container)["FP8RL_STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "database-url"}
    assert url not in yaml.safe_dump(one(objects, "Deployment"))


def test_without_persistence_every_pod_gets_an_emptydir_and_no_claim_is_made():
    objects, notes = render(CASES["no-persistence"])
    assert "PersistentVolumeClaim" not in kinds(objects)
    pods = [*ray_pod_specs(one(objects, "RayCluster")).values()]
    pods.append(one(objects, "Deployment")["spec"]["template"]["spec"])
    assert all(claim_of(pod) is None for pod in pods)
    assert "WARNING" in notes


def test_autoscaling_turns_on_the_in_tree_autoscaler_with_its_options():
    objects, _ = render(CASES["autoscaling"])
    spec = one(objects, "RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"] == {"idleTimeoutSeconds": 600, "upscalingMode": "Conservative"}
    assert "enableInTreeAutoscaling" not in one(render()[0], "RayCluster")["spec"]


def test_a_long_release_name_still_gives_a_valid_head_service_name():
    objects, _ = render(release="a-very-long-release-name-for-the-fp8rl-training-cluster-x")
    for obj in objects:
        validate(obj)  # checks RayCluster "<name>-head-svc" <= 63 characters
    cluster = one(objects, "RayCluster")["metadata"]["name"]
    api = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert env(api)["RAY_ADDRESS"]["value"].startswith(f"http://{cluster}-head-svc.")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "job"}, "mode=job needs job.spec"),
        (
            {"workerGroups": [{"name": "gpu"}, {"name": "gpu"}]},
            'the name "gpu" is used twice',
        ),
        (
            {"workerGroups": [{"name": "gpu", "minReplicas": 3, "maxReplicas": 2}]},
            "workerGroups[gpu]: minReplicas (3) must not exceed maxReplicas (2)",
        ),
        (
            {"workerGroups": [{"name": "gpu", "replicas": 5, "maxReplicas": 4}]},
            "workerGroups[gpu]: replicas (5) must lie between minReplicas (1) and maxReplicas (4)",
        ),
    ],
)
def test_inconsistent_values_fail_the_render_with_a_message_naming_them(values, message):
    with pytest.raises(helm.HelmRenderError) as info:
        render(values)
    assert message in str(info.value)


def test_notes_name_the_objects_that_were_rendered():
    objects, notes = render()
    cluster = one(objects, "RayCluster")["metadata"]["name"]
    assert f"svc/{cluster}-head-svc 8265:8265" in notes
    assert f"svc/{one(objects, 'Service')['metadata']['name']} 8000:8000" in notes
    assert f"get secret {one(objects, 'Secret')['metadata']['name']}" in notes
    _, job_notes = render(CASES["job"])
    assert f"logs -f job/{RELEASE}" in job_notes


def test_api_container_command_line_is_one_fp8rl_serve_accepts():
    import typer

    from fp8rl.services.cli import app

    group = typer.main.get_command(app)
    if "serve" not in group.commands:
        pytest.skip("fp8rl serve is not built in this checkout")
    objects, _ = render(CASES["existing-secret-and-claim"])
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["fp8rl", "serve"]
    try:
        context = group.commands["serve"].make_context("serve", list(container["args"]))
    except Exception as exc:  # typer's vendored click.UsageError
        pytest.fail(f"fp8rl serve {' '.join(container['args'])}: {exc}")
    assert (context.params["host"], context.params["port"]) == ("0.0.0.0", 8000)
    # Every setting the chart passes by environment is one the server reads: `fp8rl serve`'s
    # options (typer envvar=...), or the bearer token (read by the service, issue 8's contract).
    read = {p.envvar for p in group.commands["serve"].params if isinstance(p.envvar, str)}
    passed = {name for name in env(container) if name.startswith(("FP8RL_", "RAY_"))}
    assert passed <= read | {"FP8RL_API_TOKEN"}, passed - read


def test_api_policy_and_admission_values_reach_fp8rl_serve():
    import typer

    from fp8rl.services.cli import app

    values = {
        "api": {
            "maxActiveRuns": 3,
            "policy": {
                "allowedPaths": ["/models"],
                "rewardModules": ["mylab.rewards"],
                "rewardUrlPrefixes": ["http://rm:8080/"],
            },
        }
    }
    objects, _ = render(values)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    command = typer.main.get_command(app).commands["serve"]
    params = command.make_context("serve", list(container["args"])).params
    assert params["max_active_runs"] == 3
    assert [str(p) for p in params["allow_path"]] == ["/data", "/models"]  # the volume always
    assert params["allow_reward_module"] == ["mylab.rewards"]
    assert params["allow_reward_url"] == ["http://rm:8080/"]
