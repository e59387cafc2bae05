"""Hostile spec bodies (issue 17 rows 1-2): alias bombs and deep nesting are refused with a 422
naming the limit, fast, without the server's memory growing, and the connection stays usable."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from api_helpers import AUTH

from fp8rl.protocol import SpecError, parse_job_spec
from fp8rl.protocol.limits import MAX_DEPTH, MAX_NODES

RUNS = "/api/v1/runs"
YAML = {**AUTH, "Content-Type": "application/yaml"}


def billion_laughs(levels: int = 9) -> str:
    """~600 bytes that expand to 10**levels strings under a plain YAML loader."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def alias_chain(length: int = 2000) -> str:
    """Few nodes, but each anchor nests the previous one: expanded depth ``length``."""
    return "".join(f"a{i}: &a{i} [{f'*a{i - 1}' if i else 1}]\n" for i in range(length))


def _refused(client, body: str | bytes, headers: dict) -> tuple[dict, float]:
    start = time.perf_counter()
    response = client.post(RUNS, content=body, headers=headers)
    elapsed = time.perf_counter() - start
    assert response.status_code == 422, response.text
    return response.json(), elapsed


def test_yaml_alias_bomb_is_422_naming_the_node_limit_in_well_under_a_second(client, fake):
    body = billion_laughs()
    assert len(body) < 700
    tracemalloc.start()
    try:
        problem, elapsed = _refused(client, body, YAML)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "MAX_NODES" in problem["detail"] and str(MAX_NODES) in problem["detail"]
    assert elapsed < 0.5
    assert peak < 20 * 2**20  # the expansion (~10**9 strings) never happens
    assert fake.submitted == []


@pytest.mark.parametrize(
    ("body", "media"),
    [
        ('{"a": ' * 5000 + "1" + "}" * 5000, "application/json"),
        ("[" * 5000 + "]" * 5000, "application/json"),
        ("a: " + "[" * 5000 + "]" * 5000, "application/yaml"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 100)), "application/yaml"),
        (alias_chain(), "application/yaml"),
    ],
    ids=["json-objects", "json-arrays", "yaml-flow", "yaml-block", "yaml-alias-chain"],
)
def test_deep_nesting_is_422_naming_the_depth_limit_and_the_connection_survives(
    client, body, media
):
    problem, elapsed = _refused(client, body, {**AUTH, "Content-Type": media})
    assert "MAX_DEPTH" in problem["detail"] and str(MAX_DEPTH) in problem["detail"]
    assert elapsed < 1.0
    assert client.get("/healthz").status_code == 200  # same client, no dropped connection


def test_json_with_too_many_values_is_422(client):
    values = [0] * (MAX_NODES + 1)
    body = json.dumps({"eval": {"rewards": {"x": values}}}, separators=(",", ":"))
    problem, _ = _refused(client, body, {**AUTH, "Content-Type": "application/json"})
    assert "MAX_NODES" in problem["detail"]


def test_alias_bomb_in_an_override_value_is_refused(client):
    bomb = "[" + ",".join(["&x [1,2,3,4,5,6,7,8,9,0]"] + ["*x"] * 3000) + "]"
    response = client.post(
        RUNS, content=b"{}", headers=YAML, params={"override": [f"eval.rewards={bomb}"]}
    )
    assert response.status_code == 422 and "MAX_NODES" in response.text


def test_validate_refuses_the_bomb_naming_the_limit():
    with pytest.raises(SpecError) as info:
        parse_job_spec(billion_laughs())
    assert "MAX_NODES" in info.value.problems[0]


def test_a_small_anchor_is_still_accepted():
    job = parse_job_spec("name: &n run-a\nlogging: {wandb: {project: *n}}\n")
    assert job.logging.wandb.project == "run-a"
