"""Schema-driven fuzzing (schemathesis): no generated request, valid or not, gets a 500, and every
error is application/problem+json (on the OpenAI-compatible routes, OpenAI's ``{"error": {...}}``).
Every operation, both generation modes: over 1,000 requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.api.conftest import build_env

EXAMPLES = 45
OPENAI_ROUTES = ("/v1/files", "/v1/fine_tuning")
# requests per generation mode: the two modes together send at least 1,000
LEAST_PER_MODE = 500


def _fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> int:
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        nonlocal sent
        sent += 1
        response = case.call(headers={**(case.headers or {}), **headers})
        case.validate_response(response, checks=[not_a_server_error])
        if response.status_code >= 400:
            content_type = response.headers["content-type"]  # schemathesis keeps header values in lists
            if operation.path.startswith(OPENAI_ROUTES):
                assert content_type == ["application/json"], response.text
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            else:
                assert content_type == ["application/problem+json"], response.text

    try:
        check()
    except Unsatisfiable:  # an operation with nothing to break (no parameters, no body)
        assert mode is GenerationMode.NEGATIVE
    return sent


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(pg_url: str, roots: tuple[Path, Path], tmp_path: Path,
                          mode: GenerationMode) -> None:
    sent = 0
    for env in build_env(pg_url, roots, tmp_path, max_body_bytes=64 * 1024):
        env.submit()
        schema = schemathesis.openapi.from_asgi("/openapi.json", env.client.app)
        for result in schema.get_all_operations():
            operation = result.ok()
            headers = env.auth("root")
            if operation.path == "/v1/jobs/{job_id}/events":
                # the JSON variant; the SSE one streams until the job ends (covered in test_events)
                headers = {**headers, "Accept": "application/json"}
            sent += _fuzz(operation, mode, headers)
    assert sent >= LEAST_PER_MODE
