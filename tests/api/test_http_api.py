"""HTTP behaviour of the API in-process (FastAPI TestClient) over a fake launcher: auth, spec
errors as problem+json, limits, idempotency, stop/delete rules, pagination, SSE resume."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import yaml
from api_helpers import AUTH, QUICKSTART, wait_for

from fp8rl.protocol import RunState
from fp8rl.services.api.client import parse_sse
from fp8rl.services.store.reporter import RunReporter

RUNS = "/api/v1/runs"
YAML = {**AUTH, "Content-Type": "application/yaml"}


def _create(client, *overrides: str, headers: dict | None = None) -> httpx.Response:
    return client.post(
        RUNS,
        content=QUICKSTART.read_text(),
        headers={**YAML, **(headers or {})},
        params={"override": list(overrides)},
    )


def _reporter(client, run_id: str) -> RunReporter:
    return RunReporter(client.app.state.service.store, run_id)


# -- authentication ----------------------------------------------------------------------------
def test_missing_token_is_401_with_bearer_challenge(client):
    response = client.get(RUNS)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["content-type"] == "application/problem+json"


def test_wrong_token_is_401_with_invalid_token_error(client):
    response = client.get(RUNS, headers={"Authorization": "Bearer not-the-token-at-all"})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_basic_auth_scheme_is_refused(client):
    response = client.get(RUNS, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert response.status_code == 401


def test_every_runs_endpoint_requires_the_token(client):
    for method, path in [
        ("POST", RUNS),
        ("GET", f"{RUNS}/x"),
        ("GET", f"{RUNS}/x/metrics"),
        ("GET", f"{RUNS}/x/events"),
        ("GET", f"{RUNS}/x/logs"),
        ("POST", f"{RUNS}/x/stop"),
        ("DELETE", f"{RUNS}/x"),
    ]:
        assert client.request(method, path).status_code == 401, (method, path)


def test_health_and_version_answer_without_a_token(client):
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/api/v1/version").json()["store_schema"] == "0001"


# -- creating runs -----------------------------------------------------------------------------
def test_yaml_body_with_overrides_creates_a_pending_run_in_a_server_chosen_directory(
    client, fake, settings
):
    response = _create(client, "steps=2", "output_dir=/etc")
    assert response.status_code == 201, response.text
    run = response.json()
    assert response.headers["location"] == f"{RUNS}/{run['id']}"
    assert run["state"] == "PENDING" and run["total_steps"] == 2
    root = (settings.data_dir / "runs" / run["id"]).resolve()
    assert run["spec"]["output_dir"] == str(root)  # never the path the request named
    assert yaml.safe_load((root / "spec.yaml").read_text())["steps"] == 2
    (job,) = fake.submitted
    assert job["entrypoint"].endswith(str(root / "spec.yaml"))
    assert job["env_vars"]["FP8RL_RUN_ID"] == run["id"]
    assert job["env_vars"]["FP8RL_STORE_URL"].startswith("sqlite:////")


def test_json_body_is_a_jobspec_mapping(client):
    spec = yaml.safe_load(QUICKSTART.read_text())
    response = client.post(RUNS, json=spec, headers=AUTH)
    assert response.status_code == 201
    assert response.json()["name"] == "quickstart"


def test_invalid_spec_is_422_problem_naming_the_field_path(client, fake):
    response = client.post(RUNS, json={"rollout": {"max_tokns": 5}}, headers=AUTH)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422 and problem["type"].endswith("/invalid-spec")
    assert problem["errors"] == [
        {"path": "rollout.max_tokns", "message": "unknown field — did you mean max_tokens?"}
    ]
    assert fake.submitted == []


def test_spec_whose_placement_does_not_fit_is_422_naming_the_field_and_numbers(client, fake):
    spec = (Path(__file__).parents[1] / "placement" / "oversubscribed.yaml").read_text()
    response = client.post(RUNS, content=spec, headers=YAML)
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["path"] == "resources.gpu_memory_gib"
    assert (
        "GPU 0 (node 0) needs an estimated" in error["message"] and "> 141 GiB" in error["message"]
    )
    assert fake.submitted == []


def test_bad_override_value_names_the_overridden_field(client):
    problem = _create(client, "trainer.lr=-1").json()
    assert [e["path"] for e in problem["errors"]] == ["trainer.lr"]


def test_checkpoint_resume_path_is_refused(client):
    problem = _create(client, "checkpoint.resume=/root/secret.pt").json()
    assert problem["errors"][0]["path"] == "checkpoint.resume"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [(b"", "empty"), (b"[1, 2]", "mapping"), (b"a: [", "not valid YAML"), (b"\xff\xfe", "UTF-8")],
)
def test_malformed_bodies_are_422_not_500(client, body, fragment):
    response = client.post(RUNS, content=body, headers=YAML)
    assert response.status_code == 422
    assert fragment in response.json()["detail"]


def test_other_content_types_are_415(client):
    response = client.post(RUNS, content=b"x", headers={**AUTH, "Content-Type": "text/csv"})
    assert response.status_code == 415


def test_body_above_the_limit_is_413_before_it_is_read(client, settings):
    big = b"a: " + b"x" * settings.max_body_bytes
    response = client.post(RUNS, content=big, headers=YAML)
    assert response.status_code == 413
    assert response.json()["status"] == 413


def test_chunked_body_above_the_limit_is_413(client, settings):
    def chunks():
        for _ in range(settings.max_body_bytes // 1024 + 2):
            yield b"#" * 1024

    response = client.post(RUNS, content=chunks(), headers=YAML)
    assert response.status_code == 413


def test_unreachable_ray_gives_503_and_records_the_run_failed(client, fake):
    fake.unreachable = True
    response = _create(client)
    assert response.status_code == 503 and "recorded FAILED" in response.json()["detail"]
    runs = client.get(RUNS, headers=AUTH).json()["runs"]
    assert runs[0]["state"] == "FAILED" and "could not submit" in runs[0]["error"]


# -- idempotency -------------------------------------------------------------------------------
def test_idempotent_replay_returns_the_stored_response_and_creates_one_run(client, fake):
    first = _create(client, headers={"Idempotency-Key": "k-1"})
    second = _create(client, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json()
    assert second.headers["idempotent-replayed"] == "true"
    assert len(fake.submitted) == 1


def test_same_idempotency_key_with_another_body_is_422(client):
    assert _create(client, headers={"Idempotency-Key": "k-2"}).status_code == 201
    response = _create(client, "steps=3", headers={"Idempotency-Key": "k-2"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "header.Idempotency-Key"


def test_second_request_while_the_first_is_in_progress_is_409(client, fake):
    fake.release.clear()  # the first submit blocks inside the launcher
    fake.submit_entered.clear()
    results = {}
    worker = threading.Thread(
        target=lambda: results.setdefault(
            "first", _create(client, headers={"Idempotency-Key": "k-3"})
        )
    )
    worker.start()
    try:
        assert fake.submit_entered.wait(10)
        concurrent = _create(client, headers={"Idempotency-Key": "k-3"})
    finally:
        fake.release.set()
        worker.join(10)
    assert concurrent.status_code == 409 and concurrent.headers["retry-after"]
    assert results["first"].status_code == 201
    assert (
        _create(client, headers={"Idempotency-Key": "k-3"}).json()["id"]
        == results["first"].json()["id"]
    )


def test_failed_request_releases_its_idempotency_key(client):
    assert _create(client, "steps=0", headers={"Idempotency-Key": "k-4"}).status_code == 422
    assert _create(client, headers={"Idempotency-Key": "k-4"}).status_code == 201


def test_idempotency_key_with_spaces_is_422(client):
    response = _create(client, headers={"Idempotency-Key": "has space"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "header.Idempotency-Key"


# -- reading runs ------------------------------------------------------------------------------
def test_list_filters_by_state_and_pages_newest_first(client, fake):
    ids = [_create(client).json()["id"] for _ in range(3)]
    fake.set_state(f"fp8rl-{ids[0]}", RunState.FAILED, "boom")
    wait_for(
        lambda: client.get(f"{RUNS}/{ids[0]}", headers=AUTH).json()["state"] == "FAILED",
        timeout_s=10,
        what="monitor marks FAILED",
    )
    page = client.get(RUNS, headers=AUTH, params={"limit": 2}).json()
    assert [r["id"] for r in page["runs"]] == ids[::-1][:2]
    assert page["total"] == 3 and page["next_offset"] == 2
    last = client.get(RUNS, headers=AUTH, params={"limit": 2, "offset": 2}).json()
    assert [r["id"] for r in last["runs"]] == [ids[0]] and last["next_offset"] is None
    failed = client.get(RUNS, headers=AUTH, params={"state": "FAILED"}).json()
    assert [r["id"] for r in failed["runs"]] == [ids[0]]


def test_unknown_run_is_404_problem(client):
    response = client.get(f"{RUNS}/nope-123", headers=AUTH)
    assert response.status_code == 404 and response.json()["type"].endswith("/run-not-found")


def test_run_id_with_path_characters_is_rejected(client):
    assert client.get(f"{RUNS}/..%2F..%2Fetc", headers=AUTH).status_code in (404, 422)


def test_detail_has_latest_metrics_and_metrics_since_is_exclusive(client):
    run_id = _create(client).json()["id"]
    reporter = _reporter(client, run_id)
    reporter.started(quant_fingerprint="fp-1", run_dir="/x")
    for step in (1, 2, 3):
        reporter.step(step, {"loss": 1.0 / step})
    detail = client.get(f"{RUNS}/{run_id}", headers=AUTH).json()
    assert detail["state"] == "RUNNING" and detail["quant_fingerprint"] == "fp-1"
    assert detail["current_step"] == 3 and detail["latest_metrics"]["values"] == {"loss": 1 / 3}
    since = client.get(f"{RUNS}/{run_id}/metrics", headers=AUTH, params={"since": 1}).json()
    assert [m["step"] for m in since["metrics"]] == [2, 3]


def test_sse_resumes_after_last_event_id_and_ends_after_the_terminal_state(client):
    run_id = _create(client).json()["id"]
    reporter = _reporter(client, run_id)
    for step in (1, 2, 3):
        reporter.step(step, {"loss": float(step)})
    reporter.finished(RunState.SUCCEEDED)
    response = client.get(f"{RUNS}/{run_id}/events", headers={**AUTH, "Last-Event-ID": "2"})
    events = list(parse_sse(iter(response.text.splitlines())))
    assert [(e.event, e.id) for e in events] == [("step", "3"), ("state", None)]
    assert events[-1].data["state"] == "SUCCEEDED"


def test_garbage_last_event_id_is_422(client):
    run_id = _create(client).json()["id"]
    response = client.get(f"{RUNS}/{run_id}/events", headers={**AUTH, "Last-Event-ID": "abc"})
    assert response.status_code == 422


def test_logs_tail_from_the_driver_and_from_ray(client, fake):
    run = _create(client).json()
    _reporter(client, run["id"]).log("one\ntwo\nthree")
    fake.logs[run["ray_job_id"]] = ["ray 1", "ray 2"]
    lines = client.get(f"{RUNS}/{run['id']}/logs", headers=AUTH, params={"tail": 2}).json()["lines"]
    assert lines == ["two", "three"]
    ray = client.get(f"{RUNS}/{run['id']}/logs", headers=AUTH, params={"source": "ray"}).json()
    assert ray["lines"] == ["ray 1", "ray 2"]


# -- stop and delete ---------------------------------------------------------------------------
def test_stop_of_a_running_run_only_sets_the_flag_the_driver_polls(client, fake):
    run_id = _create(client).json()["id"]
    reporter = _reporter(client, run_id)
    reporter.started(quant_fingerprint=None, run_dir="/x")
    assert reporter.stop_requested() is False
    response = client.post(f"{RUNS}/{run_id}/stop", headers=AUTH)
    assert response.status_code == 202 and response.json()["state"] == "RUNNING"
    assert reporter.stop_requested() is True and fake.stopped == []
    reporter.finished(RunState.STOPPED)
    assert client.post(f"{RUNS}/{run_id}/stop", headers=AUTH).status_code == 409


def test_stop_of_a_pending_run_stops_its_job_at_once(client, fake):
    fake.initial_state = RunState.PENDING  # Ray has not started the driver yet
    run = _create(client).json()
    response = client.post(f"{RUNS}/{run['id']}/stop", headers=AUTH)
    assert response.status_code == 202
    assert response.json()["state"] == "STOPPED" and fake.stopped == [run["ray_job_id"]]


def test_delete_refuses_active_runs_and_removes_finished_ones(client, fake, settings):
    run = _create(client).json()
    assert client.delete(f"{RUNS}/{run['id']}", headers=AUTH).status_code == 409
    _reporter(client, run["id"]).finished(RunState.FAILED, "boom")
    assert client.delete(f"{RUNS}/{run['id']}", headers=AUTH).status_code == 204
    assert client.get(f"{RUNS}/{run['id']}", headers=AUTH).status_code == 404
    assert not Path(settings.data_dir / "runs" / run["id"]).exists()
    assert fake.deleted == [run["ray_job_id"]]
