"""The run task through a real Celery worker on Redis and Postgres, with a stand-in training module.

Covers: a job runs to the end with its evaluation in a separate process; a redelivered message for
a job already running or finished starts nothing; cancel kills the whole process group; failures say
whose fault they are; the GPU is queued for in priority order; leases are freed on every path.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from store.base import utcnow
from store.db import session_scope
from store.models import Checkpoint, Gpu, GpuLease, Job, JobEvent, MetricPoint
from store.states import JobStatus, transition
from tests.worker.factories import GIB, job_plan, job_spec, make_job, make_user
from tests.worker.harness import WorkerProcess, send, wait_for, wait_status, worker_env

S = JobStatus
TERMINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED}


@pytest.fixture(scope="module")
def worker(db_url, redis_url, tmp_path_factory):
    data = tmp_path_factory.mktemp("worker-data")
    env = worker_env(db_url, redis_url, data, prebuild_ops='["cpu_adam", "async_io"]')
    proc = WorkerProcess(env, data / "worker.log").start()
    yield proc
    proc.stop()


def _submit(worker: WorkerProcess, name: str, *, priority: int = 0, eval_when: str = "end",
            max_steps: int = 4, send_task: bool = True, peak: int | None = None) -> str:
    url = worker.settings.resolved_database_url
    spec = job_spec(name=name, priority=priority, eval={"when": eval_when},
                    training={"max_steps": max_steps, "epochs": None, "seq_len": 32, "save_steps": 2})
    with session_scope(url) as s:
        job_id = make_job(s, make_user(s), priority=priority, spec=spec, peak=peak).id
    if send_task:
        send(worker.settings, job_id)
    return job_id


def _leases(url: str, job_id: str) -> int:
    with session_scope(url) as s:
        return int(s.scalar(select(func.count()).select_from(GpuLease).where(GpuLease.job_id == job_id)))


def _events(url: str, job_id: str, kind: str | None = None) -> list[JobEvent]:
    with session_scope(url) as s:
        stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        if kind:
            stmt = stmt.where(JobEvent.kind == kind)
        rows = list(s.scalars(stmt))
        for row in rows:
            s.expunge(row)
        return rows


def _no_process_left(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def _training_pids(job_dir: str) -> list[int]:
    return [int(line.split()[0]) for line in Path(job_dir, "pids.txt").read_text().splitlines()]


def test_job_runs_to_success_with_a_separate_evaluation(worker, db_url):
    job_id = _submit(worker, "fake:ok")
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert job.status is S.SUCCEEDED, job.failure_message
    assert (job.step, job.total_steps, job.attempt) == (4, 4, 1)
    assert job.loss == pytest.approx(1.25)
    assert job.measured_peak_gpu_bytes == 5000 and job.measured_host_rss_bytes >= 6000
    assert job.eval_status == "succeeded" and job.eval_result["eval_loss"] == 1.25
    assert job.eval_result["pid"] not in _training_pids(job.job_dir)
    assert "fake training ok" in job.log_tail
    run = json.loads(Path(job.job_dir, "run.json").read_text())
    assert run["device"] == "cpu" and run["spec"]["name"] == "fake:ok"
    statuses = [e.data["to"] for e in _events(db_url, job_id, "status")]
    assert statuses == ["starting", "running", "evaluating", "succeeded"]
    running = next(e for e in _events(db_url, job_id, "status") if e.data["to"] == "running")
    assert _events(db_url, job_id, "status")[-1].data["measured_peak_gpu_bytes"] == 5000
    with session_scope(db_url) as s:
        steps = s.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)
                          .order_by(Checkpoint.step)).all()
        final = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.is_final)).one()
        metrics = s.scalars(select(MetricPoint.step).where(MetricPoint.job_id == job_id,
                                                           MetricPoint.kind == "train")).all()
        first_point = s.scalars(select(func.min(MetricPoint.created_at)).where(
            MetricPoint.job_id == job_id, MetricPoint.kind == "train")).one()
    assert steps == [2, 4] and final.path.endswith("final") and final.eval_status == "succeeded"
    assert 4 in metrics
    # the job is running before any of its steps is stored (a reader never sees a step of a starting job)
    assert running.created_at <= first_point
    assert _leases(db_url, job_id) == 0


def test_the_worker_builds_or_loads_deepspeeds_ops_when_it_starts(worker):
    log = worker.settings.data_dir / "prebuild.log"

    def ops() -> list[str]:  # the op lines, among DeepSpeed's own warnings
        text = log.read_text() if log.is_file() else ""
        return [line for line in text.splitlines() if line.startswith(("cpu_adam: ", "async_io: "))]

    wait_for(lambda: len(ops()) == 2, 900, "the ops prebuilt")
    lines = ops()
    assert lines[0].startswith("cpu_adam: ready in ")
    assert lines[1].startswith(("async_io: skipped", "async_io: ready"))  # skipped without libaio
    cache = worker.settings.torch_extensions_dir
    assert cache is not None and any((cache / "cpu_adam").glob("*.so"))


def test_message_for_a_running_or_finished_job_starts_nothing(worker, db_url):
    url = worker.settings.resolved_database_url
    with session_scope(url) as s:  # a job another host's worker is running, lease and all
        job = make_job(s, make_user(s), spec=job_spec(name="fake:ok"))
        gpu = Gpu(host="other-host", index=0, uuid="cpu-0", name="cpu", memory_total_bytes=GIB)
        s.add(gpu)
        s.flush()
        s.add(GpuLease(gpu_id=gpu.id, job_id=job.id, memory_bytes=GIB,
                       expires_at=utcnow() + timedelta(hours=1)))
        transition(s, job.id, S.STARTING, worker_host="other-host", worker_pid=1)
        transition(s, job.id, S.RUNNING)
        job_id = job.id
    events_before = len(_events(url, job_id))
    send(worker.settings, job_id)
    finished = _submit(worker, "fake:ok", max_steps=2)  # runs after the duplicate was handled
    wait_status(db_url, finished, TERMINAL, worker=worker)
    job = wait_status(db_url, job_id, {S.RUNNING})
    assert (job.attempt, job.job_dir, len(_events(url, job_id))) == (0, None, events_before)
    send(worker.settings, finished)  # a late duplicate of a finished job's message
    probe = _submit(worker, "fake:ok", max_steps=2)
    wait_status(db_url, probe, TERMINAL, worker=worker)
    assert job_row(db_url, finished).attempt == 1
    assert len(_training_pids(job_row(db_url, finished).job_dir)) == 1


def test_duplicate_message_during_a_run_does_not_start_a_second_run(worker, db_url):
    job_id = _submit(worker, "fake:ok", max_steps=20)
    send(worker.settings, job_id)  # redelivery while the first copy runs (or waits in line)
    send(worker.settings, job_id)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert job.status is S.SUCCEEDED and job.attempt == 1
    assert len(_training_pids(job.job_dir)) == 1
    assert [e.data["to"] for e in _events(db_url, job_id, "status")].count("starting") == 1


def test_cancel_kills_the_whole_process_group_and_frees_the_gpu(worker, db_url):
    job_id = _submit(worker, "fake:stubborn")  # ignores SIGTERM and has a child process
    job = wait_status(db_url, job_id, {S.RUNNING}, worker=worker)
    child = int(wait_for(lambda: _read(Path(job.job_dir, "child.pid")), 10, "child pid"))
    pids = _training_pids(job.job_dir) + [child]
    assert _leases(db_url, job_id) == 1
    with session_scope(db_url) as s:
        transition(s, job_id, S.CANCELLING, actor="user", message="cancel requested")
    job = wait_status(db_url, job_id, {S.CANCELLED}, timeout=30, worker=worker)
    assert _no_process_left(pids)
    wait_for(lambda: not _group_exists(job.process_group), 30, "the group's zombies to be reaped")
    assert _leases(db_url, job_id) == 0


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


@pytest.mark.parametrize(("mode", "kind", "reason"), [
    ("user-error", "user_error", "bad_dataset"),
    ("sigkill", "error", "host_oom"),
    ("no-done", "error", "no_result"),
])
def test_failures_say_whose_fault_and_free_the_gpu(worker, db_url, mode, kind, reason):
    job_id = _submit(worker, f"fake:{mode}", max_steps=2)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, kind, reason)
    assert f"fake training {mode}" in job.log_tail
    assert job.measured_host_rss_bytes
    assert _leases(db_url, job_id) == 0


@pytest.mark.parametrize(("name", "reason"), [("fake:ok eval-crash", "host_oom"),
                                              ("fake:ok eval-oom", "cuda_oom")])
def test_evaluation_failure_is_recorded_and_training_still_succeeds(worker, db_url, name, reason):
    job_id = _submit(worker, name, max_steps=2)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert job.status is S.SUCCEEDED
    assert job.eval_status == "failed" and job.eval_result["reason"] == reason
    assert any("failed" in e.message for e in _events(db_url, job_id, "eval"))


def test_higher_priority_job_takes_the_gpu_first(worker, db_url):
    blocker = _submit(worker, "fake:long")
    wait_status(db_url, blocker, {S.RUNNING}, worker=worker)
    low = _submit(worker, "fake:ok", priority=0, max_steps=2)
    high = _submit(worker, "fake:ok", priority=10, max_steps=2)
    with session_scope(db_url) as s:
        transition(s, blocker, S.CANCELLING)
    wait_status(db_url, low, TERMINAL, timeout=60, worker=worker)
    high_job, low_job = job_row(db_url, high), job_row(db_url, low)
    assert high_job.status is S.SUCCEEDED and low_job.status is S.SUCCEEDED
    assert high_job.started_at < low_job.started_at


def job_row(db_url: str, job_id: str) -> Job:
    from tests.worker.harness import job_row as row

    return row(db_url, job_id)


@pytest.mark.parametrize("fits", [True, False])
def test_checkpoint_evaluations_beside_or_after_training(worker, db_url, fits):
    url = worker.settings.resolved_database_url
    spec = job_spec(name="fake:ok", eval={"when": "steps", "every_steps": 2},
                    training={"max_steps": 6, "epochs": None, "seq_len": 32, "save_steps": 2})
    with session_scope(url) as s:
        job_id = make_job(s, make_user(s), spec=spec, peak=None,
                          plan=job_plan(peak=None, eval_fits=fits)).id
    send(worker.settings, job_id)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert job.status is S.SUCCEEDED and job.eval_status == "succeeded"
    with session_scope(url) as s:
        evaluated = s.execute(select(Checkpoint.step, Checkpoint.eval_status).where(
            Checkpoint.job_id == job_id).order_by(Checkpoint.step)).all()
        eval_points = s.scalars(select(MetricPoint.step).where(MetricPoint.job_id == job_id,
                                                               MetricPoint.kind == "eval")).all()
    assert [tuple(r) for r in evaluated] == [(2, "succeeded"), (4, "succeeded"), (6, "succeeded")]
    assert sorted(eval_points) == [2, 4, 6]
    events = _events(url, job_id)
    training_over = next(i for i, e in enumerate(events)
                         if e.kind == "status" and e.data["to"] == "evaluating")
    first_eval = next(i for i, e in enumerate(events) if e.kind == "eval")
    # the plan says whether an evaluation fits beside training on the card; if not, it waits
    assert (first_eval < training_over) is fits


def test_a_job_out_of_its_planned_memory_is_planned_again_with_its_peak_and_succeeds(worker, db_url):
    job_id = _submit(worker, "fake:oom-once-12", eval_when="none", max_steps=2, peak=10 * GIB)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert job.status is S.SUCCEEDED, job.failure_message
    assert job.attempt == 2
    # the bound is what the run needed (its reserved peak plus the failed request), 12 GiB
    assert job.plan["per_gpu"]["allocator_limit_bytes"] == 12 * GIB
    assert job.plan["replanned_after_oom"]["needed_bytes"] == 12 * GIB
    assert job.planned_peak_gpu_bytes == 12 * GIB  # the lease grows by as much as the bound did
    statuses = [(e.data["from"], e.data["to"]) for e in _events(db_url, job_id, "status")]
    assert statuses == [("queued", "starting"), ("starting", "running"), ("running", "queued"),
                        ("queued", "starting"), ("starting", "running"), ("running", "succeeded")]
    requeued = _events(db_url, job_id, "status")[2]
    assert "needed 12.00 GiB" in requeued.message and "planned again at 12.00 GiB" in requeued.message
    run = json.loads(Path(job.job_dir, "run.json").read_text())
    assert run["spec"]["name"] == "fake:oom-once-12"
    assert _leases(db_url, job_id) == 0


@pytest.mark.parametrize(("name", "why"), [
    ("fake:oom-always-12", "already planned again once"),
    ("fake:oom-once-30", "the card holds 24.00 GiB"),  # the harness's stand-in card
])
def test_a_job_is_planned_again_only_once_and_only_where_its_card_holds_it(worker, db_url, name, why):
    job_id = _submit(worker, name, eval_when="none", max_steps=2, peak=10 * GIB)
    job = wait_status(db_url, job_id, TERMINAL, worker=worker)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "error", "cuda_oom")
    assert "not planned again: " in job.failure_message and why in job.failure_message
    assert job.attempt == (2 if "always" in name else 1)
    assert _leases(db_url, job_id) == 0


@pytest.mark.parametrize("name", ["fake:ok", "fake:user-error"])
def test_a_jobs_nvme_swap_files_are_its_own_and_go_when_its_run_ends(worker, db_url, tmp_path, name):
    """NVMe offload writes into a folder of the job's own under the plan's nvme_path, and the worker
    removes it when the run ends, whatever the outcome; the box's folder stays."""
    root = tmp_path / "nvme"
    root.mkdir()
    plan = job_plan()
    plan["deepspeed_config"]["zero_optimization"] = {
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(root), "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}}
    url = worker.settings.resolved_database_url
    spec = job_spec(name=name, eval={"when": "none"},
                    training={"max_steps": 2, "epochs": None, "seq_len": 32, "save_steps": 2})
    with session_scope(url) as s:
        job_id = make_job(s, make_user(s), spec=spec, plan=plan).id
    send(worker.settings, job_id)
    job = wait_status(url, job_id, TERMINAL, timeout=60)
    assert job.status is (S.SUCCEEDED if name == "fake:ok" else S.FAILED)
    written = (Path(job.job_dir) / "swap.txt").read_text().split()
    assert written == [str(root / job_id / "zero_stage_3" / "offload_optimizer" / "rank0" / "0.tensor.swp")]
    assert wait_for(lambda: not (root / job_id).exists(), 10, "the job's swap folder removed")
    assert root.is_dir()


def test_a_worker_that_stops_stops_its_op_build_and_removes_its_lock(db_url, redis_url, tmp_path):
    # an empty extensions cache: the prebuild compiles cpu_adam, holding its build lock for a minute
    cache = tmp_path / "torch_extensions"
    env = worker_env(db_url, redis_url, tmp_path / "data", prebuild_ops='["cpu_adam"]',
                     torch_extensions_dir=cache)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        assert worker.proc is not None
        building = wait_for(lambda: [c for c in psutil.Process(worker.proc.pid).children()
                                     if "worker.prebuild" in c.cmdline()], 60, "the prebuild started")[0]
        lock = cache / "cpu_adam" / "lock"
        wait_for(lock.exists, 120, f"the build holding {lock} (log: {worker.log_path})")
        group = [building, *building.children(recursive=True)]
    finally:
        worker.stop()
    assert worker.proc.returncode is not None
    wait_for(lambda: _no_process_left([p.pid for p in group]), 15, "the build's processes gone")
    assert not lock.exists()
