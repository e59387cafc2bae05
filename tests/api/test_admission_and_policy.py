"""Admission control, server-side spec policy and crash-safe idempotency (issue 17 rows 9-11)."""

from __future__ import annotations

import time

import yaml
from api_helpers import AUTH, QUICKSTART
from fastapi.testclient import TestClient

from fp8rl.protocol import RunState
from fp8rl.services.api import create_app
from fp8rl.services.api.policy import SpecPolicy
from fp8rl.services.store import RunStore

RUNS = "/api/v1/runs"


def _spec(**changes) -> dict:
    spec = yaml.safe_load(QUICKSTART.read_text())
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return spec


def _post(client, spec: dict | None = None, key: str | None = None):
    headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
    return client.post(RUNS, json=spec or _spec(), headers=headers)


def _errors(response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["path"]: e["message"] for e in response.json()["errors"]}


# -- admission (row 10) ------------------------------------------------------------------------
def test_posts_above_max_active_runs_get_429_with_retry_after_quickly(settings, fake):
    settings.max_active_runs = 3
    with TestClient(create_app(settings, launcher=fake)) as client:
        assert [_post(client).status_code for _ in range(3)] == [201] * 3
        start = time.perf_counter()
        response = _post(client)
        elapsed = time.perf_counter() - start
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) > 0
        assert "max_active_runs" in response.json()["detail"]
        assert elapsed < 0.5 and len(fake.submitted) == 3


def test_a_finished_run_frees_its_slot(settings, fake):
    settings.max_active_runs = 1
    with TestClient(create_app(settings, launcher=fake)) as client:
        first = _post(client).json()["id"]
        assert _post(client).status_code == 429
        client.app.state.service.store.finish(first, RunState.SUCCEEDED)
        assert _post(client).status_code == 201


# -- policy (row 11) ---------------------------------------------------------------------------
def test_model_path_outside_the_data_directory_is_refused(client):
    errors = _errors(_post(client, _spec(model__path="/etc")))
    assert "outside the allowed roots" in errors["model.path"]


def test_relative_or_dotdot_paths_cannot_escape_the_root(client, settings):
    escape = str(settings.data_dir / ".." / ".." / "etc" / "passwd.jsonl")
    spec = _spec(data__train={"type": "file", "path": escape})
    assert "outside the allowed roots" in _errors(_post(client, spec))["data.train.path"]
    spec = _spec(data__train={"type": "file", "path": "train.jsonl"})
    assert "absolute path" in _errors(_post(client, spec))["data.train.path"]


def test_eval_dataset_path_is_checked_too(client):
    datasets = [{"type": "file", "path": "/root/x.jsonl"}]
    spec = _spec(eval={"every_n_steps": 1, "max_tokens": 16, "datasets": datasets})
    assert "eval.datasets.0.path" in _errors(_post(client, spec))


def test_custom_reward_module_and_remote_url_are_refused_by_default(client, fake):
    spec = _spec(
        reward={
            "functions": [{"name": "os:system"}],
            "remote": {"url": "http://169.254.169.254/latest"},
        }
    )
    errors = _errors(_post(client, spec))
    assert "neither built-in" in errors["reward.functions.0.name"]
    assert "allowed URL prefix" in errors["reward.remote.url"]
    assert fake.submitted == []


def test_operator_allow_lists_admit_paths_modules_and_urls(settings, fake, tmp_path):
    models = tmp_path / "models"
    settings.policy = SpecPolicy(
        allowed_paths=[models],
        reward_modules=["mylab.rewards"],
        remote_reward_prefixes=["http://rm.internal:8080/"],
    )
    spec = _spec(
        model__path=str(models / "smollm2"),
        reward={
            "functions": [{"name": "mylab.rewards.grader:score"}],
            "remote": {"url": "http://rm.internal:8080/score"},
        },
    )
    with TestClient(create_app(settings, launcher=fake)) as client:
        assert _post(client, spec).status_code == 201
        spec["reward"]["remote"]["url"] = "http://rm.internal:8081/score"
        assert list(_errors(_post(client, spec))) == ["reward.remote.url"]


def test_builtin_models_data_and_rewards_pass_the_default_policy(client):
    assert _post(client).status_code == 201


# -- crash-safe idempotency (row 9) ------------------------------------------------------------
def test_retry_after_a_server_crash_finds_the_run_instead_of_creating_another(settings, fake):
    with TestClient(create_app(settings, launcher=fake)) as client:
        first = _post(client, key="key-1")
        assert first.status_code == 201
    store = RunStore.open(settings.db_url)
    with store.engine.begin() as conn:  # as if the server died before storing the response
        from fp8rl.services.store.schema import idempotency_keys

        conn.execute(idempotency_keys.update().values(status_code=None, response=None))
    store.close()
    with TestClient(create_app(settings, launcher=fake)) as client:  # the restart
        retry = _post(client, key="key-1")
        assert retry.status_code == 201  # not 409 "in progress": released at start-up
        assert retry.json()["id"] == first.json()["id"]
        assert len(fake.submitted) == 1  # Ray already had the job: no second submission
        assert client.get(RUNS, headers=AUTH).json()["total"] == 1


def test_run_recorded_but_never_submitted_is_submitted_by_the_retry(settings, fake):
    fake.unreachable = True  # the "crash": the run is recorded, Ray never gets it
    settings.lost_job_grace_s = 60.0  # the monitor has not yet given the run up
    with TestClient(create_app(settings, launcher=fake)) as client:
        assert _post(client, key="key-2").status_code == 503
        fake.unreachable = False
        store = client.app.state.service.store
        (run,), _ = store.list_runs()
        with store.engine.begin() as conn:  # undo the FAILED mark a live server would not reach
            from fp8rl.services.store.schema import runs

            conn.execute(runs.update().values(state="PENDING", error=None))
        retry = _post(client, key="key-2")
        assert retry.status_code == 201 and retry.json()["id"] == run.id
        assert [job["job_id"] for job in fake.submitted] == [run.ray_job_id]


def test_retry_of_a_created_run_is_found_even_when_the_server_is_full(settings, fake):
    settings.max_active_runs = 1
    with TestClient(create_app(settings, launcher=fake)) as client:
        first = _post(client, key="key-3").json()["id"]
        store = client.app.state.service.store
        with store.engine.begin() as conn:  # the response was never stored (crash)
            from fp8rl.services.store.schema import idempotency_keys

            conn.execute(idempotency_keys.delete())
        retry = _post(client, key="key-3")
        assert retry.status_code == 201 and retry.json()["id"] == first
        assert _post(client).status_code == 429  # a new run still waits for a slot


def test_retry_after_ray_was_unreachable_submits_afresh(client, fake):
    fake.unreachable = True
    failed = _post(client, key="key-4")
    assert failed.status_code == 503
    fake.unreachable = False
    retry = _post(client, key="key-4")
    assert retry.status_code == 201 and retry.json()["state"] == "PENDING"
    assert len(fake.submitted) == 1
    assert client.get(RUNS, headers=AUTH).json()["total"] == 1
