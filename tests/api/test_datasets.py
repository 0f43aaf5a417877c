"""Dataset uploads: raw JSONL, JSON array and multipart; validation naming the row; jobs by dataset id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from store.db import session_scope
from store.models import Dataset, Job
from tests.api.conftest import Env, job_spec
from tests.tinydata import alpaca_rows, sharegpt_rows


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_raw_jsonl_upload_is_validated_counted_and_stored(env: Env) -> None:
    res = env.client.post("/v1/datasets?name=support", content=_jsonl(alpaca_rows(7)),
                          headers={**env.auth(), "Content-Type": "application/x-ndjson"})
    assert res.status_code == 201, res.text
    ds = res.json()
    assert ds["id"].startswith("ds_") and ds["format"] == "alpaca" and ds["num_rows"] == 7
    assert ds["name"] == "support" and ds["owner"] == "alice" and len(ds["sample"]) == 3
    stored = Path(env.settings.data_dir) / "datasets" / f"{ds['id']}.jsonl"
    assert len(stored.read_text().splitlines()) == 7
    assert env.client.get(f"/v1/datasets/{ds['id']}", headers=env.auth()).json()["num_rows"] == 7
    listed = env.client.get("/v1/datasets", headers=env.auth()).json()["items"]
    assert [d["id"] for d in listed] == [ds["id"]]


def test_json_array_upload_is_stored_as_jsonl(env: Env) -> None:
    res = env.client.post("/v1/datasets", json=sharegpt_rows(5), headers=env.auth())
    assert res.status_code == 201, res.text
    stored = Path(env.settings.data_dir) / "datasets" / f"{res.json()['id']}.jsonl"
    lines = stored.read_text().splitlines()
    assert len(lines) == 5 and "conversations" in json.loads(lines[0])
    assert res.json()["format"] == "sharegpt"


def test_multipart_upload(env: Env) -> None:
    files = {"file": ("chat.jsonl", _jsonl(alpaca_rows(4)), "application/x-ndjson")}
    res = env.client.post("/v1/datasets", files=files, data={"format": "alpaca"}, headers=env.auth())
    assert res.status_code == 201, res.text
    assert res.json()["name"] == "chat.jsonl" and res.json()["num_rows"] == 4


def test_bad_dataset_names_row_and_field_and_stores_nothing(env: Env) -> None:
    rows = alpaca_rows(4)
    del rows[2]["output"]
    res = env.client.post("/v1/datasets", content=_jsonl(rows), headers=env.auth())
    assert res.status_code == 422 and res.headers["content-type"] == "application/problem+json"
    error = res.json()["errors"][0]
    assert error["row"] == 3 and "output" in error["field"]
    assert env.count(Dataset) == 0
    assert list((Path(env.settings.data_dir) / "datasets").iterdir()) == []


def test_declared_format_mismatch_and_garbage(env: Env) -> None:
    res = env.client.post("/v1/datasets?format=text", content=_jsonl(alpaca_rows(2)), headers=env.auth())
    assert res.status_code == 422
    assert env.client.post("/v1/datasets", content=b"{not json", headers=env.auth()).status_code == 422
    assert env.client.post("/v1/datasets", content=b"", headers=env.auth()).status_code == 422
    assert env.client.post("/v1/datasets?format=csv", content=b"{}", headers=env.auth()).status_code == 422
    assert env.count(Dataset) == 0


def test_oversized_upload_is_413(env: Env) -> None:
    big = _jsonl(alpaca_rows(2)) * (env.settings.max_body_bytes // 100)

    def chunks():  # noqa: ANN202
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    res = env.client.post("/v1/datasets", content=chunks(), headers=env.auth())
    assert res.status_code == 413
    assert env.count(Dataset) == 0


def test_unknown_dataset_is_404(env: Env) -> None:
    assert env.client.get("/v1/datasets/ds_nothing", headers=env.auth()).status_code == 404


def test_job_on_an_uploaded_dataset(env: Env) -> None:
    ds = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(9)), headers=env.auth()).json()
    res = env.client.post("/v1/jobs", json=job_spec(dataset={"id": ds["id"]}), headers=env.auth())
    assert res.status_code == 201, res.text
    assert res.json()["dataset_id"] == ds["id"] and res.json()["spec"]["dataset"]["num_rows"] == 9
    assert env.count(Job) == 1


def test_a_job_evaluates_on_its_own_dataset(env: Env) -> None:
    train = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(9)), headers=env.auth()).json()
    held = env.client.post("/v1/datasets", content=_jsonl(sharegpt_rows(4, seed=1)),
                           headers=env.auth()).json()
    spec = job_spec(dataset={"id": train["id"]}, eval={"dataset": {"id": held["id"]}})
    res = env.client.post("/v1/jobs", json=spec, headers=env.auth())
    assert res.status_code == 201, res.text
    stored = res.json()["spec"]
    assert stored["eval"]["dataset"] == {**stored["eval"]["dataset"], "id": held["id"], "num_rows": 4}
    assert stored["dataset"]["eval_fraction"] == 0.0  # every training row trains
    with session_scope(env.url) as session:
        assert session.get(Job, res.json()["id"]).eval_dataset_id == held["id"]


def test_an_eval_dataset_is_checked_as_the_training_one_is(env: Env) -> None:
    train = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(9)), headers=env.auth()).json()
    for evaluation, field in [({"id": "ds_nothing"}, "eval.dataset.id"),
                              ({"path": "/etc/passwd"}, "eval.dataset.path")]:
        res = env.client.post("/v1/jobs", json=job_spec(dataset={"id": train["id"]},
                                                        eval={"dataset": evaluation}), headers=env.auth())
        assert res.status_code == 422 and res.json()["errors"][0]["field"] == field, res.text
    both = job_spec(dataset={"id": train["id"], "eval_fraction": 0.2}, eval={"dataset": {"id": train["id"]}})
    res = env.client.post("/v1/jobs", json=both, headers=env.auth())
    assert res.status_code == 422 and "give one" in res.text
    bobs = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(3)), headers=env.auth("bob")).json()
    private = job_spec(dataset={"id": bobs["id"]}, eval={"dataset": {"id": train["id"]}})  # alice's
    res = env.client.post("/v1/jobs", json=private, headers=env.auth("bob"))
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "eval.dataset.id"
    assert env.count(Job) == 0


def test_openai_chat_upload_is_format_openai(env: Env) -> None:
    rows = [{"messages": [{"role": "developer", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "text", "text": f"q{i}"}]},
                          {"role": "assistant", "content": "draft", "weight": 0},
                          {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    res = env.client.post("/v1/datasets?format=openai", content=_jsonl(rows), headers=env.auth())
    assert res.status_code == 201, res.text
    assert res.json()["format"] == "openai" and res.json()["num_rows"] == 3
    ds = res.json()
    job = env.client.post("/v1/jobs", json=job_spec(dataset={"id": ds["id"], "format": "openai"}),
                          headers=env.auth())
    assert job.status_code == 201, job.text


def test_preference_and_image_rows_are_refused_naming_the_field(env: Env) -> None:
    dpo = [{"instruction": "q", "chosen": "good", "rejected": "bad"}]
    res = env.client.post("/v1/datasets", content=_jsonl(dpo), headers=env.auth())
    assert res.status_code == 422
    error = res.json()["errors"][0]
    assert error["field"] == "dataset.rows[1].chosen" and "not trained" in error["message"]
    images = [{"messages": [{"role": "user", "content": "<image>?"}, {"role": "assistant", "content": "a"}],
               "images": ["a.png"]}]
    res = env.client.post("/v1/datasets", content=_jsonl(images), headers=env.auth())
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "dataset.rows[1].images"
    assert env.count(Dataset) == 0


def test_a_dataset_is_its_owners_until_shared(env: Env) -> None:
    ds = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(5)), headers=env.auth("alice")).json()
    url = f"/v1/datasets/{ds['id']}"
    assert ds["shared"] is False
    assert env.client.get(url, headers=env.auth("bob")).status_code == 404
    assert env.client.get("/v1/datasets", headers=env.auth("bob")).json()["items"] == []
    bob_job = env.client.post("/v1/jobs", json=job_spec(dataset={"id": ds["id"]}), headers=env.auth("bob"))
    assert bob_job.status_code == 422 and bob_job.json()["errors"][0]["field"] == "dataset.id"
    assert env.client.get(url, headers=env.auth("root")).status_code == 200
    assert env.client.patch(url, json={"shared": True}, headers=env.auth("bob")).status_code == 404

    shared = env.client.patch(url, json={"shared": True}, headers=env.auth("alice"))
    assert shared.status_code == 200 and shared.json()["shared"] is True
    assert env.client.get(url, headers=env.auth("bob")).json()["owner"] == "alice"
    listed = env.client.get("/v1/datasets", headers=env.auth("bob")).json()["items"]
    assert [d["id"] for d in listed] == [ds["id"]]
    assert env.client.post("/v1/jobs", json=job_spec(dataset={"id": ds["id"]}),
                           headers=env.auth("bob")).status_code == 201
    assert env.client.patch(url, json={"shared": False}, headers=env.auth("bob")).status_code == 403
    assert env.client.patch(url, json={"sharing": False}, headers=env.auth("alice")).status_code == 422
    assert env.client.patch(url, json={"shared": False}, headers=env.auth("alice")).json()["shared"] is False
    assert env.client.get(url, headers=env.auth("bob")).status_code == 404


def test_uploading_the_same_bytes_again_returns_the_first_dataset(env: Env) -> None:
    body = _jsonl(alpaca_rows(6))
    first = env.client.post("/v1/datasets?name=a", content=body, headers=env.auth("alice"))
    again = env.client.post("/v1/datasets?name=b&shared=true", content=body, headers=env.auth("alice"))
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["name"] == "a"
    assert again.json()["shared"] is True and len(again.json()["sample"]) == 3
    other = env.client.post("/v1/datasets", content=body, headers=env.auth("bob"))
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    changed = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(7)), headers=env.auth("alice"))
    assert changed.status_code == 201 and changed.json()["id"] != first.json()["id"]
    assert env.count(Dataset) == 3
    assert len(list((Path(env.settings.data_dir) / "datasets").glob("*.jsonl"))) == 3


def test_inspect_tokenises_with_the_models_tokenizer_in_a_child_process(env: Env) -> None:
    from tests.tinymodel import build_tiny_model

    build_tiny_model(Path(env.settings.model_roots[0]) / "tiny")
    rows = alpaca_rows(5) + [{"instruction": "word " * 80, "input": "", "output": "x"}]
    ds = env.client.post("/v1/datasets", content=_jsonl(rows), headers=env.auth()).json()
    body = {"dataset": {"id": ds["id"]}, "model": {"path": "tiny"}, "seq_len": 64}
    res = env.client.post("/v1/datasets/inspect", json=body, headers=env.auth())
    assert res.status_code == 200, res.text
    report = res.json()
    assert (report["rows"], report["kept_rows"], report["dropped_rows"]) == (6, 5, 1)
    assert report["dropped_row_numbers"] == [6] and report["tokens_per_row"]["max"] > 64
    assert 0 < report["trained_tokens"] < report["tokens"] and "\u27e6" in report["example"]["marked"]
    by_path = env.client.post("/v1/datasets/inspect", headers=env.auth(),
                              json={**body, "dataset": {"path": "train.jsonl"}})
    assert by_path.status_code == 200 and by_path.json()["rows"] == 12
    assert env.client.post("/v1/datasets/inspect", json=body, headers=env.auth("bob")).json()["errors"][0][
        "field"] == "dataset.id"
    no_tokenizer = env.client.post("/v1/datasets/inspect", json={**body, "model": {"path": "small"}},
                                   headers=env.auth())
    assert no_tokenizer.status_code == 422 and no_tokenizer.json()["errors"][0]["field"] == "model.path"


def test_a_job_whose_inspected_rows_would_be_dropped_is_refused_at_submit_with_the_counts(env: Env) -> None:
    from tests.tinymodel import build_tiny_model

    build_tiny_model(Path(env.settings.model_roots[0]) / "tiny")
    rows = alpaca_rows(5) + [{"instruction": "word " * 80, "input": "", "output": "x"}]
    ds = env.client.post("/v1/datasets", content=_jsonl(rows), headers=env.auth()).json()

    def submit(seq_len: int, **dataset: Any) -> Any:
        return env.client.post("/v1/jobs", headers=env.auth(), json=job_spec(
            model={"path": "tiny"}, dataset={"id": ds["id"], **dataset},
            training={"max_steps": 2, "seq_len": seq_len}))

    assert submit(64).status_code == 201  # nothing counted yet: the trainer checks it at start
    inspected = env.client.post("/v1/datasets/inspect", headers=env.auth(),
                                json={"dataset": {"id": ds["id"]}, "model": {"path": "tiny"}, "seq_len": 64})
    assert inspected.status_code == 200 and inspected.json()["dropped_rows"] == 1
    refused = submit(64)
    assert refused.status_code == 422, refused.text
    [error] = refused.json()["errors"]
    assert error["field"] == "dataset.max_dropped_fraction"
    assert "1 of 6 rows (16.7%)" in error["message"] and "1.0%" in error["message"]
    assert submit(64, max_dropped_fraction=0.2).status_code == 201  # the limit raised
    assert submit(256).status_code == 201  # another seq_len: not counted


def test_a_submission_plans_from_the_inspected_counts_of_its_data_tokenizer_and_seq_len(env: Env) -> None:
    from tests.tinymodel import build_tiny_model

    build_tiny_model(Path(env.settings.model_roots[0]) / "tiny")
    ds = env.client.post("/v1/datasets", content=_jsonl(alpaca_rows(40)), headers=env.auth()).json()

    def submit(seq_len: int, **dataset: Any) -> Any:
        res = env.client.post("/v1/jobs", headers=env.auth(), json=job_spec(
            model={"path": "tiny"}, dataset={"id": ds["id"], "eval_fraction": 0.0, **dataset},
            training={"max_steps": None, "epochs": 1, "seq_len": seq_len, "micro_batch_size": 1,
                      "gradient_accumulation_steps": 1}))
        assert res.status_code == 201, res.text
        return res.json()

    before = submit(64)
    assert before["spec"]["dataset"]["num_tokens"] is None and before["plan"]["estimated_steps"] == 40
    report = env.client.post("/v1/datasets/inspect", headers=env.auth(), json={
        "dataset": {"id": ds["id"]}, "model": {"path": "tiny"}, "seq_len": 64}).json()
    assert report["tokens"] < report["packed_rows"] * 64 and report["packed_rows"] < report["kept_rows"]
    after = submit(64)
    counted = after["spec"]["dataset"]
    assert (counted["num_tokens"], counted["num_packed_rows"]) == (report["tokens"], report["packed_rows"])
    plan = after["plan"]
    assert plan["estimated_steps"] == report["packed_rows"]  # one packed row a step, one epoch
    fill = report["tokens"] / (report["packed_rows"] * 64)
    assert plan["estimated_tokens_per_second"] == pytest.approx(64 / plan["estimated_step_seconds"] * fill,
                                                                rel=1e-3)
    own = submit(64, num_tokens=640)  # the spec's own counts stand
    assert own["spec"]["dataset"]["num_packed_rows"] is None and own["plan"]["estimated_steps"] == 10
    assert submit(128)["spec"]["dataset"]["num_tokens"] is None  # no report at this seq_len
