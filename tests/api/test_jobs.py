"""Submitting, reading, listing, cancelling and reprioritising jobs (both backends unless noted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.models import Job, JobEvent
from tests.api.conftest import BOX, Env, job_spec

PROBLEM = "application/problem+json"


def test_submit_stores_queued_job_with_plan_and_enqueues_after_commit(env: Env) -> None:
    res = env.client.post("/v1/jobs", json=job_spec(priority=7), headers=env.auth())
    assert res.status_code == 201, res.text
    job = res.json()
    assert job["id"].startswith("job_") and job["status"] == "queued" and job["owner"] == "alice"
    assert res.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["plan"]["fits"] is True
    assert job["planned_peak_gpu_bytes"] == job["plan"]["per_gpu"]["total_bytes"]
    assert job["spec"]["model"]["path"].endswith("/models/small")  # resolved under the root
    assert job["spec"]["dataset"]["num_rows"] == 12
    assert env.enqueued.calls == [(job["id"], 7)]
    events = env.client.get(f"/v1/jobs/{job['id']}/events", headers=env.auth()).json()["items"]
    kinds = [e["kind"] for e in events]
    assert kinds == ["created", "audit"]
    shown = env.client.get(f"/v1/jobs/{job['id']}", headers=env.auth())
    assert shown.status_code == 200 and shown.json() == job  # the answer to the POST is the stored job


def test_a_job_read_carries_its_stored_json_as_the_orm_reads_it(env: Env) -> None:
    """GET passes the JSON columns through as the database holds them: the body is the job the ORM
    reads, as JobRead writes it, null, unicode, nesting and float values included."""
    from api.jobs.schemas import JobRead
    from api.jobs.service import job_read
    from store.db import session_scope

    job = env.submit(name="naïve 漢字 run")
    with session_scope(env.url) as session:
        row = session.get(Job, job["id"])
        assert row is not None
        row.eval_result = {"loss": 1.25e-05, "perplexity": None, "samples": [{"text": "é\n\"q\""}]}
        row.data_report = {"train_rows": 12, "tokens": {"p50": 7, "max": 2**40}}
    shown = env.client.get(f"/v1/jobs/{job['id']}", headers=env.auth())
    assert shown.status_code == 200 and shown.headers["content-type"] == "application/json"
    body = shown.json()
    JobRead.model_validate(body)
    with session_scope(env.url) as session:
        row = session.get(Job, job["id"])
        assert row is not None
        expected = job_read(row, "alice").model_dump(mode="json")
    assert body == expected
    assert body["eval_result"]["samples"][0]["text"] == "é\n\"q\"" and body["name"] == "naïve 漢字 run"


def test_the_lease_holds_the_evaluation_where_the_job_evaluates(env: Env) -> None:
    """An evaluation after training runs alone on the job's first card: the lease is the larger of
    the training's peak and the evaluation's. One during training (eval.when: steps) runs beside
    the training where the plan says both fit: the lease is their sum."""
    def lease(**evaluation: object) -> tuple[int, dict[str, object]]:
        job = env.submit(eval=evaluation, training={"max_steps": 10, "seq_len": 512, "save_steps": 5})
        return job["planned_peak_gpu_bytes"], job["plan"]

    none, plan = lease(when="none")
    training = plan["per_gpu"]["required_bytes"]
    assert none == training
    # a long generation from many prompts: an evaluation larger than this small job's training
    end, plan = lease(when="end", batch_size=32, max_new_tokens=4096)
    evaluation = plan["eval"]["total_bytes"]
    assert evaluation > training and end == evaluation
    beside, plan = lease(when="steps", every_steps=5)
    assert plan["eval"]["fits_beside_training"] is True
    assert beside == training + plan["eval"]["total_bytes"]
    # an evaluation no GPU holds fails on its own: the lease is the training's
    unheld, plan = lease(when="end", batch_size=1024, max_new_tokens=32768)
    assert plan["eval"]["fits"] is False and unheld == training


def test_the_task_is_sent_under_the_id_stored_with_the_job(env: Env) -> None:
    job = env.submit()
    from store.db import session_scope

    with session_scope(env.url) as session:
        stored = session.get(Job, job["id"]).celery_task_id
    assert stored and env.enqueued.task_ids == [stored]


def test_broker_failure_keeps_the_job_queued(env: Env) -> None:
    env.enqueued.fail = True
    job = env.submit()
    assert env.client.get(f"/v1/jobs/{job['id']}", headers=env.auth()).json()["status"] == "queued"


def test_job_that_does_not_fit_is_refused_with_plan_and_alternatives(env: Env) -> None:
    res = env.client.post("/v1/jobs", json=job_spec(model={"path": "big"}, method="full"), headers=env.auth())
    assert res.status_code == 422
    assert res.headers["content-type"] == PROBLEM
    body = res.json()
    assert body["type"].endswith("/plan-does-not-fit")
    assert body["plan"]["fits"] is False and isinstance(body["alternatives"], list)
    # what is short: the GPU's memory (resources) or, with the optimizer offloaded, the host's RAM
    assert body["errors"][0]["field"] in ("resources", "resources.offload_optimizer")
    assert env.count(Job) == 0 and env.count(JobEvent) == 0 and env.enqueued.calls == []


@pytest.mark.parametrize(("patch", "field"), [
    ({"training": {"seq_len": 10**9, "max_steps": 1}}, "training.seq_len"),
    ({"resources": {"num_gpus": 10**6}}, "resources.num_gpus"),
    ({"training": {"learning_rate": -1, "max_steps": 1}}, "training.learning_rate"),
    ({"training": {"max_steps": 1, "bogus": 1}}, "training.bogus"),
    ({"lora": {"r": "sixteen"}}, "lora.r"),
    ({"colour": "blue"}, "colour"),
    ({"model": {"path": "../etc"}}, "model.path"),
    ({"model": {"path": "/etc"}}, "model.path"),
    ({"model": {"path": "file:///etc/passwd"}}, "model.path"),
    ({"model": {"path": "nope"}}, "model.path"),
    ({"model": {"name": "Qwen/Qwen2.5-0.5B"}}, "model.path"),
    ({"dataset": {"path": "missing.jsonl"}}, "dataset.path"),
    ({"dataset": {"id": "ds_doesnotexist"}}, "dataset.id"),
    ({"dataset": None}, "dataset"),
])
def test_bad_specs_name_the_field_and_write_nothing(env: Env, patch: dict, field: str) -> None:
    res = env.client.post("/v1/jobs", json=job_spec(**patch), headers=env.auth())
    assert res.status_code == 422, res.text
    assert res.headers["content-type"] == PROBLEM
    body = res.json()
    assert field in [e["field"] for e in body["errors"]], body
    assert body["status"] == 422 and body["instance"] == "/v1/jobs" and body["title"]
    assert env.count(Job) == 0 and env.enqueued.calls == []


def test_hardware_in_spec_overrides_the_box(env: Env) -> None:
    tiny = {**BOX, "gpu_memory_bytes": 2**28}
    res = env.client.post("/v1/jobs", json=job_spec(hardware=tiny), headers=env.auth())
    assert res.status_code == 422 and res.json()["type"].endswith("/plan-does-not-fit")


def test_refusal_lists_fixes_that_fit_with_sizes_in_gib(env: Env) -> None:
    """A LoRA job pinned to a configuration that overflows a 6 GiB card: the 422 carries the
    plan's alternatives, every one fitting, and each message gives its sizes in GiB."""
    small_card = {**BOX, "gpu_memory_bytes": 6 * 2**30}
    spec = job_spec(hardware=small_card,
                    training={"max_steps": 10, "seq_len": 4096, "micro_batch_size": 8,
                              "gradient_accumulation_steps": 1, "gradient_checkpointing": False},
                    resources={"num_gpus": 1, "zero_stage": 0})
    res = env.client.post("/v1/jobs", json=spec, headers=env.auth())
    assert res.status_code == 422, res.text
    body = res.json()
    assert body["type"].endswith("/plan-does-not-fit") and body["errors"][0]["field"] == "resources"
    assert "GiB" in body["detail"] and "bytes" not in body["detail"]
    assert all("GiB" in e["message"] for e in body["errors"])
    alternatives = body["alternatives"]
    assert alternatives and alternatives == body["plan"]["alternatives"]
    usable = body["plan"]["per_gpu"]["capacity_bytes"] * 0.97
    assert all(a["fits"] and a["per_gpu_required_bytes"] <= usable for a in alternatives)
    assert all(a["changes"] and "GiB" in a["reason"] for a in alternatives)
    assert env.count(Job) == 0


@pytest.mark.parametrize(("patch", "slug", "field"), [
    ({"resources": {"num_gpus": 8}}, "num-gpus-exceeds-box", "resources.num_gpus"),
    ({"training": {"max_steps": 1, "seq_len": 65536}}, "seq-len-beyond-context", "training.seq_len"),
])
def test_what_the_box_cannot_run_is_refused_for_its_own_reason(
        env: Env, patch: dict, slug: str, field: str) -> None:
    res = env.client.post("/v1/jobs", json=job_spec(**patch), headers=env.auth())
    assert res.status_code == 422, res.text
    body = res.json()
    assert body["type"].endswith("/" + slug), body
    assert body["errors"][0]["field"] == field and "bytes" not in body["detail"]
    assert env.count(Job) == 0 and env.enqueued.calls == []


def test_qlora_is_refused_where_the_box_cannot_run_it(env: Env) -> None:
    spec = job_spec(method="qlora", hardware={**BOX, "qlora_unavailable": "bitsandbytes is not installed"})
    res = env.client.post("/v1/jobs", json=spec, headers=env.auth())
    assert res.status_code == 422, res.text
    body = res.json()
    assert body["type"].endswith("/method-unavailable") and body["errors"][0]["field"] == "method"
    assert "bitsandbytes" in body["detail"]


@pytest.mark.parametrize("backend", ["pg_url", "sqlite_url"])
def test_a_dataset_id_is_read_with_the_queue_count_and_the_limit_comes_first(
        backend: str, request: pytest.FixtureRequest, roots: tuple[Path, Path], tmp_path: Path) -> None:
    """The queued-jobs count and the dataset a job names are read by one statement: a known dataset
    fills the spec, an unknown or another user's one is a 422 naming ``dataset.id``, and at the
    limit the answer is 429 whatever the dataset (the limit is checked first, as before)."""
    import json

    from tests.api.conftest import build_env
    from tests.tinydata import alpaca_rows

    for env in build_env(request.getfixturevalue(backend), roots, tmp_path, max_queued_jobs_per_user=2):
        rows = "".join(json.dumps(r) + "\n" for r in alpaca_rows(9)).encode()
        ds = env.client.post("/v1/datasets", content=rows, headers={**env.auth(),
                             "Content-Type": "application/x-ndjson"}).json()
        job = env.client.post("/v1/jobs", json=job_spec(dataset={"id": ds["id"]}), headers=env.auth())
        assert job.status_code == 201, job.text
        assert job.json()["dataset_id"] == ds["id"] and job.json()["spec"]["dataset"]["num_rows"] == 9
        for spec, who in ((job_spec(dataset={"id": "ds_nosuchdataset"}), "alice"),
                          (job_spec(dataset={"id": ds["id"]}), "bob")):
            res = env.client.post("/v1/jobs", json=spec, headers=env.auth(who))
            assert res.status_code == 422 and res.json()["errors"][0]["field"] == "dataset.id", res.text
        env.submit()  # alice's second queued job: the limit
        for dataset in ({"id": ds["id"]}, {"id": "ds_nosuchdataset"}, {"path": "train.jsonl"}):
            res = env.client.post("/v1/jobs", json=job_spec(dataset=dataset), headers=env.auth())
            assert res.status_code == 429, res.text
        assert env.count(Job) == 2
