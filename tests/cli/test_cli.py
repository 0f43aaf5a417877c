"""The ``tunebox`` command against a live server (Postgres), and its local commands."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from store.db import session_scope
from store.models import ApiToken, Job
from store.states import JobStatus, transition
from tests.api.conftest import BOX, Env, job_spec
from tunebox.cli import main, progress_line
from tunebox.client import Client

S = JobStatus


def _spec_file(tmp_path: Path, **overrides: object) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(job_spec(**overrides)))
    return str(path)


def test_submit_jobs_show_cancel(server: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", _spec_file(tmp_path)]) == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.startswith("job_") and server.count(Job) == 1
    assert main(["jobs"]) == 0
    listing = capsys.readouterr().out
    assert job_id in listing and "queued" in listing
    assert main(["jobs", "--status", "running", "--all"]) == 0
    assert job_id not in capsys.readouterr().out
    assert main(["show", job_id]) == 0
    assert "planned:" in capsys.readouterr().out
    assert main(["show", job_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == job_id
    assert main(["cancel", job_id]) == 0
    assert "cancelled" in capsys.readouterr().out
    assert main(["cancel", job_id]) == 1
    assert "409" in capsys.readouterr().err


def test_submit_that_does_not_fit_prints_fields_and_alternatives(
        server: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", _spec_file(tmp_path, model={"path": "big"}, method="full")]) == 1
    err = capsys.readouterr().err
    assert "error 422" in err and "alternatives" in err
    assert "resources:" in err or "resources.offload_optimizer:" in err
    assert main(["submit", _spec_file(tmp_path, training={"seq_len": 10**9, "max_steps": 1})]) == 1
    assert "training.seq_len" in capsys.readouterr().err
    assert server.count(Job) == 0


def test_watch_exits_0_on_success_and_1_otherwise(server: Env, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The job ends only after the watch has seen it running, however slow the box is.
    seen_running = threading.Event()
    fetch = Client.job

    def job_seen(self: Client, job_id: str) -> dict[str, Any]:
        job = fetch(self, job_id)
        if job["status"] == S.RUNNING.value:
            seen_running.set()
        return job

    monkeypatch.setattr(Client, "job", job_seen)
    for end, code in ((S.SUCCEEDED, 0), (S.FAILED, 1)):
        job = server.submit()
        seen_running.clear()

        def worker(job_id: str = job["id"], end: JobStatus = end) -> None:
            with session_scope(server.url) as session:
                transition(session, job_id, S.STARTING)
                transition(session, job_id, S.RUNNING, step=5, total_steps=10, loss=1.25,
                           tokens_per_second=1234.0, eta_seconds=65)
            assert seen_running.wait(60)
            failure = {"failure_kind": "error", "failure_reason": "cuda_oom",
                       "failure_message": "out of memory"} if end is S.FAILED else {"step": 10}
            with session_scope(server.url) as session:
                transition(session, job_id, end, **failure)

        thread = threading.Thread(target=worker)
        thread.start()
        assert main(["watch", job["id"], "--interval", "0.05"]) == code
        thread.join()
        out = capsys.readouterr().out
        assert "5/10" in out and "1.2500" in out and "1,234 tok/s" in out and "ETA 1m05s" in out
        if end is S.FAILED:
            assert "cuda_oom" in out


def test_progress_line_without_totals() -> None:
    line = progress_line({"id": "job_x", "status": "queued", "progress": {}})
    assert line.startswith("job_x queued") and "0/?" in line and "ETA -" in line


def test_unreachable_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TUNEBOX_URL", "http://127.0.0.1:1")
    assert main(["jobs"]) == 1
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err


def test_plan_locally_with_flags_and_json(roots: tuple[Path, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec = job_spec(model={"path": str(roots[0] / "small")})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["plan", str(path), "--gpus", "1", "--gpu-memory-gib", "24", "--host-memory-gib", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fits: yes") and "per GPU:" in out and "tokens/s" in out
    # no card named: the calibration card's figures, each with where it came from
    assert "790 TFLOPS from default, memory bandwidth 4800 GB/s from default" in out
    path.write_text(json.dumps({**spec, "hardware": BOX}))
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] is True and plan["per_gpu"]["capacity_bytes"] == BOX["gpu_memory_bytes"]
    path.write_text(json.dumps({**spec, "training": {"seq_len": -1}}))
    assert main(["plan", str(path), "--gpus", "1", "--gpu-memory-gib", "24"]) == 2
    assert "training.seq_len" in capsys.readouterr().err


def test_db_upgrade_and_tokens_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'tunebox.db'}"
    monkeypatch.setenv("TUNEBOX_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    assert main(["db", "upgrade"]) == 0
    assert "database at revision" in capsys.readouterr().out
    assert main(["token", "create", "carol", "--admin"]) == 0
    captured = capsys.readouterr()
    token = captured.out.strip()
    assert token.startswith("tb_") and "shown only once" in captured.err and "admin" in captured.err
    with session_scope(url) as session:
        row = session.scalars(select(ApiToken)).one()
        assert row.token_hash != token and row.revoked_at is None
    assert main(["token", "revoke", token[:11]]) == 0
    assert main(["token", "revoke", token[:11]]) == 1  # nothing live left to revoke
    with session_scope(url) as session:
        assert session.scalars(select(ApiToken)).one().revoked_at is not None


def test_settings_markdown_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from tunebox.settings import Settings

    assert main(["settings", "--markdown"]) == 0
    out = capsys.readouterr().out
    for name in Settings.model_fields:
        assert f"`TUNEBOX_{name.upper()}`" in out
    assert "| --- |" in out


def test_the_readme_settings_table_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table in readme, "regenerate the README's table with `tunebox settings --markdown`"


def test_logs_prints_the_whole_log_or_its_tail(server: Env, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import update

    job = server.submit()
    folder = tmp_path / "jobs" / job["id"]
    folder.mkdir(parents=True)
    (folder / "train.log").write_text("".join(f"line {i}\n" for i in range(300)))
    with session_scope(server.url) as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(job_dir=str(folder)))
        transition(session, job["id"], S.CANCELLED)
    assert main(["logs", job["id"]]) == 0
    out = capsys.readouterr().out
    assert out.startswith("line 0\n") and out.endswith("line 299\n") and out.count("\n") == 300
    assert main(["logs", job["id"], "-n", "2", "-f"]) == 0  # the job has ended: follow stops at once
    assert capsys.readouterr().out == "line 298\nline 299\n"
    (folder / "train.log").write_text("cut mid-line")
    assert main(["logs", job["id"]]) == 0
    assert capsys.readouterr().out == "cut mid-line\n"
    assert main(["logs", "job_nosuchjob"]) == 1
    assert "error 404" in capsys.readouterr().err


def test_queue_events_metrics_and_checkpoints(server: Env, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from store.ids import new_id
    from store.models import Checkpoint, MetricPoint

    assert main(["submit", _spec_file(tmp_path)]) == 0
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["submit", _spec_file(tmp_path, priority=5)]) == 0
    urgent = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["queue"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("1", urgent), ("2", first)]  # the start order

    assert main(["events", first]) == 0
    kinds = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert kinds[:2] == ["created", "audit"]

    with session_scope(server.url) as s:  # what a worker records as the job trains
        s.add_all([MetricPoint(job_id=first, kind="train", step=k, loss=2.0 / k, learning_rate=1e-4,
                               tokens_per_second=900.0, gpu_memory_bytes=3 * 2**30) for k in (1, 2)])
        s.add(Checkpoint(id=new_id("ckpt"), job_id=first, step=2, path="/jobs/x/checkpoints/step-2",
                         size_bytes=2**20, is_final=True, eval_status="done",
                         eval_result={"eval_loss": 0.75}))
    assert main(["metrics", first]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[1:]] == [["1", "-", "2.0000"], ["2", "-", "1.0000"]]
    assert "3.0 GiB" in lines[1]
    assert main(["metrics", first, "--json"]) == 0
    assert [p["step"] for p in json.loads(capsys.readouterr().out)["points"]] == [1, 2]
    assert main(["checkpoints", first]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[:6] == ["2", "1.0", "MiB", "yes", "done", "0.7500"]
    assert main(["events", "job_nope"]) == 1 and "404" in capsys.readouterr().err


def test_datasets_upload_list_and_share(server: Env, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.tinydata import write_dataset

    data = write_dataset(tmp_path / "support.jsonl", "alpaca", n=7)
    assert main(["datasets", "upload", str(data)]) == 0
    captured = capsys.readouterr()
    ds_id = captured.out.strip()
    assert ds_id.startswith("ds_") and "7 alpaca rows" in captured.err
    assert main(["datasets"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split()[:3] == ["ID", "OWNER", "FORMAT"]
    assert listing[1].split()[:4] == [ds_id, "alice", "alpaca", "7"]
    assert main(["datasets", "share", ds_id]) == 0
    assert "shared with every user" in capsys.readouterr().out
    assert main(["datasets", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["id"] == ds_id and shown["shared"] is True and shown["name"] == "support.jsonl"
    assert main(["datasets", "share", ds_id, "--off"]) == 0 and "yours alone" in capsys.readouterr().out
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "q", "output": "a"}\nnot json\n')
    assert main(["datasets", "upload", str(broken)]) == 1
    assert "line 2" in capsys.readouterr().err  # the server's check, naming the line
    submitted = job_spec(dataset={"id": ds_id})
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(submitted))
    assert main(["submit", str(spec)]) == 0
