"""The ``openai`` SDK against tunebox's OpenAI-compatible routes: files, jobs, errors, idempotency."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from sqlalchemy import func, select

from store.db import session_scope
from store.models import Dataset, Job
from store.states import JobStatus as S
from store.states import transition

SMALL = {"training": {"max_steps": 10, "seq_len": 512}}


def _upload(client: Any, path: Any) -> Any:
    with open(path, "rb") as fh:
        return client.files.create(file=fh, purpose="fine-tune")


def _worker_moves(url: str, job_id: str, *targets: S) -> None:
    """What a worker writes as it runs the job (the worker itself is in test_sdk_training.py)."""
    with session_scope(url) as s:
        for target in targets:
            transition(s, job_id, target, actor="worker:test")


def _jobs(url: str) -> int:
    with session_scope(url) as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0)


def test_a_file_is_a_dataset_listed_read_back_and_deleted(box):
    client = box.client()
    created = _upload(client, box.chat_file)
    assert created.object == "file" and created.purpose == "fine-tune" and created.status == "processed"
    assert created.id.startswith("ds_") and created.bytes > 0 and created.filename == "chat.jsonl"
    with session_scope(box.url) as s:
        row = s.get(Dataset, created.id)
        assert row is not None and row.num_rows == 24
    assert [f.id for f in client.files.list(purpose="fine-tune")] == [created.id]
    assert client.files.retrieve(created.id).bytes == created.bytes
    lines = client.files.content(created.id).text.splitlines()
    assert json.loads(lines[0])["messages"][0]["role"] == "user" and len(lines) == 24
    with pytest.raises(openai.NotFoundError):
        box.client("bob").files.retrieve(created.id)  # another's file is as unknown
    assert client.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_a_bad_file_is_refused_with_the_row_and_field(box, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    robot = {"messages": [{"role": "robot", "content": "x"}]}
    bad.write_text(json.dumps(good) + "\n" + json.dumps(robot) + "\n")
    with pytest.raises(openai.BadRequestError) as err:
        _upload(box.client(), bad)
    assert err.value.status_code == 400 and err.value.param == "file" and err.value.code == "invalid_file"
    assert "row 2" in err.value.body["message"] and "role" in err.value.body["message"]
    with session_scope(box.url) as s:
        assert s.scalar(select(func.count()).select_from(Dataset)) == 0
    with pytest.raises(openai.BadRequestError) as wrong:
        box.client().files.create(file=box.chat_file.open("rb"), purpose="batch")
    assert wrong.value.body["param"] == "purpose"


def test_create_retrieve_list_and_the_job_behind_it(box):
    client = box.client()
    file = _upload(client, box.chat_file)
    job = client.fine_tuning.jobs.create(
        model="small",
        training_file=file.id,
        suffix="support",
        seed=7,
        metadata={"team": "nlp"},
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 0.5}
            },
        },
        extra_body={"tunebox": {"training": {"seq_len": 512}, "lora": {"r": 8}}},
    )
    assert job.object == "fine_tuning.job" and job.status == "queued" and job.id.startswith("job_")
    assert job.model == "small" and job.training_file == file.id and job.seed == 7
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size >= 4
    assert job.hyperparameters.learning_rate_multiplier == pytest.approx(0.5)
    assert job.metadata == {"team": "nlp"} and job.user_provided_suffix == "support"
    extra = job.model_extra["tunebox"]
    assert extra["status"] == "queued" and extra["plan"]["fits"] is True
    assert extra["plan"]["zero_stage"] in (0, 1, 2, 3) and extra["plan"]["per_gpu_required_bytes"] > 0
    with session_scope(box.url) as s:
        row = s.get(Job, job.id)
        assert row is not None and row.dataset_id == file.id
        assert row.spec["training"]["epochs"] == 2 and row.spec["training"]["micro_batch_size"] == 4
        assert row.spec["training"]["gradient_accumulation_steps"] == 1
        assert row.spec["training"]["learning_rate"] == pytest.approx(1e-4)
        assert row.spec["lora"]["r"] == 8 and row.spec["training"]["seed"] == 7
    assert box.enqueued.calls == [(job.id, 0)]
    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    second = client.fine_tuning.jobs.create(
        model="small", training_file=file.id, extra_body={"tunebox": SMALL}
    )
    page = client.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in page.data] == [second.id] and page.has_more is True
    assert [j.id for j in client.fine_tuning.jobs.list()] == [second.id, job.id]  # auto-paging
    with pytest.raises(openai.NotFoundError) as err:
        box.client("bob").fine_tuning.jobs.retrieve(job.id)
    assert err.value.code == "fine_tuning_job_not_found"


def test_a_validation_file_is_what_the_job_evaluates_on(box, tmp_path):
    client = box.client()
    train = _upload(client, box.chat_file)
    held_path = tmp_path / "held.jsonl"
    held_path.write_text("".join(box.chat_file.read_text().splitlines(keepends=True)[:6]))
    held = _upload(client, held_path)
    job = client.fine_tuning.jobs.create(model="small", training_file=train.id, validation_file=held.id,
                                         extra_body={"tunebox": SMALL})
    assert job.validation_file == held.id and job.training_file == train.id
    assert client.fine_tuning.jobs.retrieve(job.id).validation_file == held.id
    with session_scope(box.url) as s:
        row = s.get(Job, job.id)
        assert row is not None and row.eval_dataset_id == held.id
        assert row.spec["eval"]["dataset"]["num_rows"] == 6 and row.spec["dataset"]["eval_fraction"] == 0.0
    with pytest.raises(openai.BadRequestError) as err:
        client.files.delete(held.id)  # a job's data is kept with it
    assert err.value.code == "file_in_use" and "validation file" in err.value.message
    with pytest.raises(openai.BadRequestError) as both:
        client.fine_tuning.jobs.create(model="small", training_file=train.id, validation_file=held.id,
                                       extra_body={"tunebox": {**SMALL, "dataset": {"eval_fraction": 0.2}}})
    assert "give one" in both.value.message


def test_cancel_pause_resume_and_events(box):
    client = box.client()
    file = _upload(client, box.chat_file)
    a = client.fine_tuning.jobs.create(model="small", training_file=file.id, extra_body={"tunebox": SMALL})
    b = client.fine_tuning.jobs.create(model="small", training_file=file.id, extra_body={"tunebox": SMALL})
    assert client.fine_tuning.jobs.cancel(a.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # finished: a 400, not a 409 the SDK would send again
        client.fine_tuning.jobs.cancel(a.id)
    with pytest.raises(openai.BadRequestError) as queued:  # nothing trains yet: nothing to pause
        client.fine_tuning.jobs.pause(b.id)
    assert "only a running job" in queued.value.message
    _worker_moves(box.url, b.id, S.STARTING, S.RUNNING)
    pausing = client.fine_tuning.jobs.pause(b.id)
    assert pausing.status == "running" and pausing.model_extra["tunebox"]["status"] == "pausing"
    _worker_moves(box.url, b.id, S.PAUSED)  # the training saved its checkpoint and ended
    assert client.fine_tuning.jobs.pause(b.id).status == "paused"  # again: no change
    resumed = client.fine_tuning.jobs.resume(b.id)
    assert resumed.status == "queued"
    assert [c[0] for c in box.enqueued.calls] == [a.id, b.id, b.id]  # resumed: sent again
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.resume(b.id)  # queued, not paused
    events = list(client.fine_tuning.jobs.list_events(b.id))
    assert all(e.object == "fine_tuning.job.event" and e.type == "message" for e in events)
    moves = [(e.data["from"], e.data["to"]) for e in events if e.data.get("kind") == "status"]
    assert moves == [
        ("paused", "queued"),
        ("pausing", "paused"),
        ("running", "pausing"),
        ("starting", "running"),
        ("queued", "starting"),
    ]  # newest first
    assert client.fine_tuning.jobs.checkpoints.list(b.id).data == []


def test_cancel_by_another_user_is_refused(box):
    client = box.client()
    file = _upload(client, box.chat_file)
    job = client.fine_tuning.jobs.create(model="small", training_file=file.id, extra_body={"tunebox": SMALL})
    with pytest.raises(openai.NotFoundError):
        box.client("bob").fine_tuning.jobs.cancel(job.id)
    assert box.client("root").fine_tuning.jobs.cancel(job.id).status == "cancelled"  # an admin may


def test_a_job_that_does_not_fit_is_a_400_with_the_code_and_the_cheapest_fix(box):
    client = box.client(max_retries=0)
    file = _upload(client, box.chat_file)
    with pytest.raises(openai.BadRequestError) as err:
        client.fine_tuning.jobs.create(
            model="big",
            training_file=file.id,
            extra_body={"tunebox": {"method": "full", "training": {"seq_len": 512}}},
        )
    assert err.value.status_code == 400 and err.value.code == "insufficient_gpu_memory"
    assert err.value.type == "invalid_request_error"
    assert "does not fit" in err.value.message
    assert _jobs(box.url) == 0


def test_bad_fields_name_the_request_parameter(box):
    client = box.client(max_retries=0)
    file = _upload(client, box.chat_file)
    cases = [
        ({"model": "nope", "training_file": file.id}, "model"),
        ({"model": "small", "training_file": "ds_missing"}, "training_file"),
        (
            {"model": "small", "training_file": file.id, "hyperparameters": {"n_epochs": 0}},
            "hyperparameters.n_epochs",
        ),
        ({"model": "small", "training_file": file.id, "validation_file": "ds_missing"}, "validation_file"),
        (
            {
                "model": "small",
                "training_file": file.id,
                "extra_body": {"tunebox": {"training": {"seq_len": 2}}},
            },
            "tunebox.training.seq_len",
        ),
        ({"model": "small", "training_file": file.id, "extra_body": {"epochs": 3}}, "epochs"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.fine_tuning.jobs.create(**kwargs)
        assert err.value.param == param, (kwargs, err.value.body)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{box.base_url}/v1", api_key="tb_wrong", max_retries=0).files.list()
    assert _jobs(box.url) == 0


class DropFirstCreate(httpx2.BaseTransport):
    """Delivers every request, but loses the response of the first job creation (a client timeout)."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()
        self.dropped = 0
        self.retry_counts: list[str | None] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/fine_tuning/jobs"):
            self.retry_counts.append(request.headers.get("x-stainless-retry-count"))
            if not self.dropped:
                response.read()
                self.dropped += 1
                raise httpx2.ReadTimeout("response lost", request=request)
        return response


def test_creation_is_idempotent_under_the_sdks_retries(box):
    transport = DropFirstCreate()
    client = box.client(http_client=openai.DefaultHttpxClient(transport=transport), max_retries=2)
    file = _upload(client, box.chat_file)
    job = client.fine_tuning.jobs.create(model="small", training_file=file.id, extra_body={"tunebox": SMALL})
    assert transport.retry_counts == ["0", "1"]  # the first attempt created the job; its answer was lost
    assert _jobs(box.url) == 1 and len(box.enqueued.calls) == 1
    again = client.fine_tuning.jobs.create(
        model="small", training_file=file.id, extra_body={"tunebox": SMALL}
    )
    assert again.id != job.id and _jobs(box.url) == 2  # the same body sent anew is a new job
