"""Remote reward model over HTTP against a real server on a loopback port."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RemoteRewardSpec, RewardSpec
from fp8rl.workers.reward import RewardWorker
from fp8rl.workers.reward.remote import RemoteRewardClient


class Handler(BaseHTTPRequestHandler):
    calls: ClassVar[dict[str, int]] = {}

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = Handler.calls[self.path] = Handler.calls.get(self.path, 0) + 1
        if self.path == "/flaky" and count <= 2:
            return self._send(503, {"error": "warming up"})
        if self.path == "/down":
            return self._send(500, {"error": "broken"})
        if self.path == "/bad":
            return self._send(400, {"error": "bad request"})
        if self.path == "/slow":
            time.sleep(1.0)
        return self._send(200, {"reward": len(body["response"]) / 10 + (body["answer"] == "8")})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and hung up (the /slow case)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def item(response: str) -> RewardInput:
    return RewardInput(
        prompt_id="p",
        prompt="q",
        response=response,
        answer="8",
        finish_reason="stop",
        num_tokens=1,
        max_tokens=8,
    )


def test_remote_reward_is_added_with_its_weight(server):
    spec = RewardSpec(
        functions=[{"name": "arithmetic"}], remote={"url": f"{server}/score", "weight": 2.0}
    )
    worker = RewardWorker(spec)
    try:
        first, second = worker.score([item("8"), item("1234")])
    finally:
        worker.close()
    assert first.terms == {"arithmetic": 1.0, "remote": pytest.approx(1.1)}
    assert first.reward == pytest.approx(1.0 + 2 * 1.1)
    assert second.reward == pytest.approx(0.0 + 2 * 1.4)


def test_remote_retries_5xx_with_backoff_then_succeeds(server):
    client = RemoteRewardClient(
        RemoteRewardSpec(url=f"{server}/flaky", max_retries=3, backoff_s=0.01)
    )
    try:
        (score,) = client.score([item("ab")])
    finally:
        client.close()
    assert score.reward == pytest.approx(1.2) and not score.timed_out
    assert Handler.calls["/flaky"] == 3


def test_remote_timeout_scores_zero_and_is_counted(server):
    spec = RewardSpec(
        functions=[{"name": "arithmetic"}],
        remote={"url": f"{server}/slow", "timeout_s": 0.2, "max_retries": 1, "backoff_s": 0.01},
        max_failure_fraction=1.0,  # one response, timed out: scored, not a failed run
    )
    worker = RewardWorker(spec)
    try:
        (output,) = worker.score([item("8")])
    finally:
        worker.close()
    assert output.timed_out and output.terms["remote"] == 0.0 and output.reward == 1.0
    assert worker.stats()["reward/verifier_timeouts"] == 1.0


@pytest.mark.parametrize(
    ("path", "message"), [("/down", "failed after 2 attempts: HTTP 500"), ("/bad", "HTTP 400")]
)
def test_remote_errors_raise_with_the_url(server, path, message):
    client = RemoteRewardClient(
        RemoteRewardSpec(url=f"{server}{path}", max_retries=1, backoff_s=0.01)
    )
    try:
        with pytest.raises(RuntimeError, match=message) as info:
            client.score([item("x")])
        assert server in str(info.value)
    finally:
        client.close()


def test_unreachable_remote_raises_after_retries():
    client = RemoteRewardClient(
        RemoteRewardSpec(url="http://127.0.0.1:9/none", max_retries=1, backoff_s=0.01, timeout_s=1)
    )
    try:
        with pytest.raises(RuntimeError, match=r"127\.0\.0\.1:9"):
            client.score([item("x")])
    finally:
        client.close()
