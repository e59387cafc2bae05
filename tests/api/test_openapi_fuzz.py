"""Property-based fuzzing of every operation in /openapi.json with schemathesis: a bounded number
of generated requests per operation (valid and invalid), none may get a 500, and every response
must match the documented status codes, content types and schemas.

The app runs in-process (ASGI) over the fake launcher, so valid generated JobSpecs are accepted
and recorded without starting Ray jobs; the Ray path is covered by test_runs_on_ray.py. (The
schemathesis pytest plugin's lazy fixtures do not work with pytest 9, so each operation's
hypothesis strategy is driven directly.)

One check is off for ``POST /runs`` only: "schema-valid data is accepted". A JobSpec has rules a
JSON schema cannot state (``data.max_prompt_tokens + rollout.max_tokens <= model.max_model_len``,
``rollout.n >= 2`` for GRPO, a YAML body must parse to a mapping), so a schema-valid body may
rightly get a 422 problem naming the field.
"""

from __future__ import annotations

import schemathesis
from api_helpers import AUTH
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from fp8rl.services.api import create_app

MAX_EXAMPLES = 25
"""Generated requests per operation (bounded: the whole fuzz run takes seconds on 2 cores)."""


def _fuzz(operation, excluded: list) -> None:
    @given(case=operation.as_strategy())
    @hypothesis_settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def fuzz(case) -> None:
        case.call_and_validate(headers=AUTH, excluded_checks=excluded)

    fuzz()


def test_no_operation_answers_500_or_breaks_its_documented_contract(settings, fake):
    settings.sse_poll_s = 0.01
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(settings, launcher=fake))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9, [op.label for op in operations]
    for operation in operations:
        excluded = [positive_data_acceptance] if operation.label == "POST /api/v1/runs" else []
        try:
            _fuzz(operation, excluded)
        except Exception as exc:
            raise AssertionError(f"{operation.label}: {exc}") from exc
