"""Every error class is RFC 9457 problem+json; bad input never yields a 500 and never writes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from store.models import Job
from tests.api.conftest import Env, job_spec

KEYS = {"type", "title", "status", "detail", "instance", "errors"}


def _problem(res, status: int) -> dict:  # noqa: ANN001
    assert res.status_code == status, res.text
    assert res.headers["content-type"] == "application/problem+json"
    body = res.json()
    assert set(body) >= KEYS and body["status"] == status
    return body


def test_unknown_route_is_404_problem(env: Env) -> None:
    body = _problem(env.client.get("/v1/nothing", headers=env.auth()), 404)
    assert body["instance"] == "/v1/nothing"


def test_wrong_method_is_405_problem(env: Env) -> None:
    _problem(env.client.delete("/v1/jobs", headers=env.auth()), 405)


def test_unknown_job_is_404_naming_it(env: Env) -> None:
    body = _problem(env.client.get("/v1/jobs/job_nope", headers=env.auth()), 404)
    assert body["errors"] == [{"field": "job_id", "message": "no such job"}]
    _problem(env.client.post("/v1/jobs/job_nope/cancel", headers=env.auth()), 404)
    _problem(env.client.get("/v1/jobs/job_nope/events", headers=env.auth()), 404)


def test_malformed_json_is_400_problem_and_writes_nothing(env: Env) -> None:
    headers = {**env.auth(), "Content-Type": "application/json"}
    body = _problem(env.client.post("/v1/jobs", content=b'{"model": {"path": ', headers=headers), 400)
    assert body["errors"][0]["field"] == "body"
    assert env.count(Job) == 0


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"12", b"null"])
def test_json_that_is_not_an_object_is_422(env: Env, raw: bytes) -> None:
    headers = {**env.auth(), "Content-Type": "application/json"}
    _problem(env.client.post("/v1/jobs", content=raw, headers=headers), 422)
    assert env.count(Job) == 0


def test_oversized_body_by_content_length_is_413(env: Env) -> None:
    big = json.dumps(job_spec(name="x" * 100, lora={"target_modules": ["q" * 100] * 4000}))
    assert len(big) > env.settings.max_body_bytes
    headers = {**env.auth(), "Content-Type": "application/json"}
    _problem(env.client.post("/v1/jobs", content=big, headers=headers), 413)
    assert env.count(Job) == 0


def test_oversized_streamed_body_is_413_while_reading(env: Env) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield b'{"name": "'
        for _ in range(64):
            yield b"x" * 8192
        yield b'"}'

    headers = {**env.auth(), "Content-Type": "application/json"}
    _problem(env.client.post("/v1/jobs", content=chunks(), headers=headers), 413)
    assert env.count(Job) == 0


def test_bad_query_parameters_name_the_parameter(env: Env) -> None:
    body = _problem(env.client.get("/v1/jobs?limit=0", headers=env.auth()), 422)
    assert body["errors"][0]["field"] == "limit"
    body = _problem(env.client.get("/v1/jobs?status=sleeping", headers=env.auth()), 422)
    assert body["errors"][0]["field"] == "status[0]"
    _problem(env.client.get("/v1/jobs?limit=201", headers=env.auth()), 422)
    _problem(env.client.get("/v1/jobs?after=%27%3B+drop", headers=env.auth()), 422)


def test_cancel_of_a_finished_job_is_409(env: Env) -> None:
    job = env.submit()
    assert env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth()).status_code == 200
    body = _problem(env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth()), 409)
    assert body["errors"][0]["field"] == "status"


def test_validation_messages_are_readable(env: Env) -> None:
    spec = job_spec(training={"max_steps": 1, "micro_batch_size": "lots"})
    body = _problem(env.client.post("/v1/jobs", json=spec, headers=env.auth()), 422)
    fields = {e["field"] for e in body["errors"]}
    assert fields == {"training.micro_batch_size"}
    assert "training.micro_batch_size" in body["detail"]


BASE = b'"model": {"path": "small"}, "dataset": {"path": "train.jsonl"}, "training": {"max_steps": 1}'


@pytest.mark.parametrize(("raw", "field"), [
    (b'{' + BASE + b', "resources": {"deepspeed": {"reduce_bucket_size": NaN}}}',
     "resources.deepspeed.reduce_bucket_size"),
    (b'{' + BASE + b', "lora": {"target_modules": ["q\\u0000"]}}', "lora.target_modules[0]"),
    (b'{' + BASE.replace(b"small", b"sm\\u0000all") + b'}', "model.path"),
    (b'{"model": {"config": ' + b"[" * 3000 + b"]" * 3000 + b"}}", "body"),
])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/plans"])
def test_values_storage_cannot_hold_are_4xx_not_500(env: Env, raw: bytes, field: str, path: str) -> None:
    res = env.client.post(path, content=raw, headers={**env.auth(), "Content-Type": "application/json"})
    assert 400 <= res.status_code < 500, res.text
    assert res.headers["content-type"] == "application/problem+json"
    if field != "body":
        assert field in [e["field"] for e in res.json()["errors"]]
    assert env.count(Job) == 0


@pytest.mark.parametrize("url", ["/v1/jobs/job%00x", "/v1/jobs?owner=a%00b", "/v1/datasets/ds_%00",
                                 "/v1/jobs/job_x%2F..%2F"])
def test_nul_and_odd_path_or_query_values_are_422(env: Env, url: str) -> None:
    res = env.client.get(url, headers=env.auth())
    assert res.status_code in (404, 422) and res.headers["content-type"] == "application/problem+json"


def _query_parameters(env: Env) -> list[tuple[str, str, str]]:
    """(method, path, parameter) for every query parameter the API documents, path ones filled in."""
    out = []
    for path, operations in env.client.get("/openapi.json").json()["paths"].items():
        for method, operation in operations.items():
            if method not in ("get", "delete"):
                continue
            concrete = path
            for param in operation.get("parameters", []):
                if param["in"] == "path":
                    concrete = concrete.replace("{" + param["name"] + "}", "x1")
            out += [(method, concrete, p["name"]) for p in operation.get("parameters", [])
                    if p["in"] == "query"]
    return out


def test_a_nul_in_any_query_parameter_is_refused_naming_it(env: Env) -> None:
    checked = _query_parameters(env)
    assert len(checked) >= 10  # the API documents that many; a schema change that hides them fails here
    for method, path, name in checked:
        res = env.client.request(method.upper(), f"{path}?{name}=a%00b", headers=env.auth())
        if path.startswith(("/v1/files", "/v1/fine_tuning")):
            assert res.status_code == 400, (path, name, res.text)
            assert res.json()["error"]["param"] == f"tunebox.{name}", res.text
        else:
            body = _problem(res, 422)
            assert body["errors"] == [{"field": name, "message": "contains a NUL character"}], path
    assert env.count(Job) == 0


def test_a_nul_in_the_path_is_refused_before_any_route(env: Env) -> None:
    body = _problem(env.client.get("/v1/calibration%00", headers=env.auth()), 422)
    assert body["errors"][0]["field"] == "path" and "\x00" not in body["instance"]
    res = env.client.get("/v1/files/file%00x", headers=env.auth())
    assert res.status_code == 400 and res.json()["error"]["message"] == "path: contains a NUL character"
