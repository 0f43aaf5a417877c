"""One run of one job on this worker: train, evaluate, finish — and release the GPUs on every path.

The worker watches the run from outside: the training and each evaluation are process groups of
their own (see ``launcher``); the worker tails their files, renews the GPU leases, polls the job row
about once a second for a cancel, and ends the job with one guarded transition. An evaluation that
crashes or runs out of memory is recorded on the job and never fails the trained model.

The database may be out of reach for a while (a restart): the run goes on, and what could not be
written is written once it is back. Only when the leases have gone unrenewed for their whole
lifetime (the cards may be another job's by now) is the run given up.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from store import checkpoints, jobs
from store.base import utcnow
from store.dataset_reports import save_report
from store.db import session_scope
from store.models import Gpu, Job, JobEvent
from store.states import ACTIVE, IllegalTransition, JobStatus, transition
from tunebox.gpus import NvmlSampler
from tunebox.settings import Settings
from worker import launcher, leasing, reconcile
from worker._trainlib.runfile import (
    EXIT_CUDA_OOM,
    EXIT_DISK_FULL,
    EXIT_HOST_OOM,
    EXIT_PAUSED,
    EXIT_USER_ERROR,
    PAUSE_FILE,
)
from worker.leasing import Grant
from worker.progress import LineTail, LogFollower, ProgressRecorder, parse_records, record_eval_metric
from worker.replan import replan_after_oom

log = logging.getLogger(__name__)

POLL_S = 0.5
STATUS_EVERY_S = 1.0
SAMPLE_EVERY_S = 2.0
# exit codes of the training and evaluation processes → failure
EXIT_REASONS = {EXIT_USER_ERROR: ("user_error", "user_error"), EXIT_CUDA_OOM: ("error", "cuda_oom"),
                EXIT_HOST_OOM: ("error", "host_oom"), EXIT_DISK_FULL: ("error", "disk_full")}


class Watch(StrEnum):
    EXITED = "exited"
    CANCEL = "cancel"
    PAUSE = "pause"
    LOST = "lost"


@dataclass(frozen=True)
class Failure:
    kind: str
    reason: str
    message: str
    data: dict[str, Any] | None = None


class RunLost(Exception):
    """The job is no longer this run's (re-queued by the reconciler, or taken by another run)."""


class JobRun:
    """Supervises the run that claimed ``job_id`` (attempt ``attempt``) with ``grant``."""

    def __init__(self, job_id: str, attempt: int, grant: Grant, settings: Settings, host: str) -> None:
        self.job_id, self.attempt, self.grant = job_id, attempt, grant
        self.settings, self.host = settings, host
        self.url = settings.resolved_database_url
        self.dir = launcher.job_dir(settings, job_id)
        self.run_id = launcher.RunId(job_id, attempt, launcher.owner_tag(settings, host))
        self.status = JobStatus.STARTING
        self.recorder = ProgressRecorder(self.url, job_id, settings.progress_interval_s,
                                         on_start=self._to_running)
        self.groups: list[launcher.ProcessGroup] = []
        self.nvml = NvmlSampler()
        self._progress: LineTail | None = None
        self._logs: LogFollower | None = None
        self._last = {"renew": 0.0, "status": 0.0, "sample": 0.0}
        self._renewed = time.monotonic()  # the leases were granted just now
        self._db_down_since: float | None = None
        self._swap_dirs: list[Path] = []
        self.evals = Evaluations(self)

    # ------------------------------------------------------------------ the run

    def run(self) -> JobStatus | None:
        """Run to the end; returns the status the job ended in (None when the run was lost)."""
        try:
            return self._run()
        except IllegalTransition as exc:
            if exc.current is not JobStatus.CANCELLING:
                log.warning("job %s: %s; leaving it", self.job_id, exc)
                return None
            return self._cancel()  # a cancel raced one of this run's own moves
        except RunLost:
            log.warning("job %s: run %s is no longer the job's run; stopped it", self.job_id, self.attempt)
            return None
        except Exception as exc:
            log.exception("job %s: the worker failed while running it", self.job_id)
            message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
            return self._fail(Failure("error", "worker_error", message[-4000:]))
        finally:
            self._cleanup()

    def _run(self) -> JobStatus | None:
        self._prepare()
        train = launcher.start_training(self.dir, self.grant, self.settings, self.run_id)
        self.groups.append(train)
        self._update(process_group=train.pgid)
        self._event("process", f"training started: pids {train.pids}, process group {train.pgid}",
                    {"pids": train.pids, "pgid": train.pgid, "gpus": list(self.grant.indices)})
        outcome = self._watch(train, self._train_tick)
        self.recorder.peaks.observe_rss(train.peak_rss_bytes)
        self._when_database(self._drain)
        if outcome is Watch.CANCEL:
            return self._cancel()
        if outcome is Watch.LOST:
            raise RunLost
        paused = train.poll() == EXIT_PAUSED and self.status is JobStatus.PAUSING
        failure = None if paused else self._training_failure(train)
        if failure is not None and failure.reason == "cuda_oom" and failure.data:
            failure = self._plan_again(failure)
        if failure is not None:
            return self._fail(failure)
        if self.status is JobStatus.QUEUED:
            return self.status
        if self.status is JobStatus.PAUSING:  # its last step's checkpoint holds the final model too
            return self._paused()
        self._to_running()
        return self._after_training()

    def _prepare(self) -> None:
        # a previous run's verdict and pause request must not be read as this one's
        for stale in ("failure.json", PAUSE_FILE):
            (self.dir / stale).unlink(missing_ok=True)
        with session_scope(self.url) as s:
            job = s.get(Job, self.job_id)
            if job is None:
                raise RunLost
            run = launcher.build_run_file(s, job, self.grant, self.settings)
        launcher.write_run_file(self.dir, run)
        self._swap_dirs = launcher.job_swap_dirs(run["deepspeed_config"])
        self._update(job_dir=str(self.dir))
        # earlier runs' lines stay in the files; read only what this run appends
        self._progress = LineTail(self.dir / "progress.jsonl", from_end=True)
        self._logs = LogFollower(self.dir / "train.log", self.url, self.job_id,
                                 self.settings.progress_interval_s, from_end=True)

    def _after_training(self) -> JobStatus | None:
        final = (self.recorder.done or {}).get("final_path")
        if self.evals.wanted_after_training(final):
            self._transition(JobStatus.EVALUATING, "evaluating the trained model")
            outcome = self.evals.run_after_training(final)
            if outcome is Watch.CANCEL:
                return self._cancel()
            if outcome is Watch.LOST:
                raise RunLost
        return self._succeed()

    # ------------------------------------------------------------------ watching

    def _watch(self, group: launcher.ProcessGroup, tick: Callable[[launcher.ProcessGroup], None]) -> Watch:
        """Until the group exits, a cancel is asked for, or the job stops being this run's."""
        while True:
            code = group.poll()
            verdict = self._tick(group, tick, check_in=code is None)
            if code is not None:
                if launcher.group_alive(group.pgid):  # a rank failed; the others may hang in a collective
                    launcher.terminate(group, min(self.settings.cancel_grace_s, 5.0))  # settles it too
                else:
                    group.settle()
                return Watch.EXITED
            if verdict is Watch.PAUSE:
                self._ask_pause()
            elif verdict is not None:
                return verdict
            time.sleep(POLL_S)

    def _tick(self, group: launcher.ProcessGroup, tick: Callable[[launcher.ProcessGroup], None],
              check_in: bool) -> Watch | None:
        """One round of bookkeeping; with the database out of reach it waits for the next round."""
        try:
            tick(group)
            verdict = self._check_in() if check_in else None
        except OperationalError as exc:
            return self._database_down(exc)
        if self._db_down_since is not None:
            log.warning("job %s: the database is back after %.0f s", self.job_id,
                        time.monotonic() - self._db_down_since)
            self._db_down_since = None
        return verdict

    def _database_down(self, exc: OperationalError) -> Watch | None:
        if self._db_down_since is None:
            self._db_down_since = time.monotonic()
            log.warning("job %s: the database is out of reach; the run goes on (%s)", self.job_id,
                        str(exc).splitlines()[0])
        if time.monotonic() - self._renewed > self.settings.lease_ttl_s:
            log.error("job %s: leases not renewed for %s s; the cards may be another job's now",
                      self.job_id, self.settings.lease_ttl_s)
            return Watch.LOST
        return None

    def _when_database(self, step: Callable[[], Any]) -> Any:
        """``step()``, tried again while the database is out of reach and the leases may still be ours."""
        while True:
            try:
                return step()
            except OperationalError as exc:
                if self._database_down(exc) is Watch.LOST:
                    raise RunLost from exc
                time.sleep(1.0)

    def _check_in(self) -> Watch | None:
        """Renew the leases and read the job's status, each at its own pace."""
        now = time.monotonic()
        if now - self._last["renew"] >= max(1.0, self.settings.lease_ttl_s / 4):
            self._last["renew"] = now
            with session_scope(self.url) as s:
                held = leasing.renew(s, self.job_id, self.settings)
            if held == 0:
                return self._leases_lost()
            self._renewed = now
        if now - self._last["status"] >= STATUS_EVERY_S:
            self._last["status"] = now
            return self._status_verdict()
        return None

    def _status_verdict(self) -> Watch | None:
        with session_scope(self.url) as s:
            row = jobs.columns(s, self.job_id, Job.status, Job.attempt)
        if row is None or row.attempt != self.attempt or JobStatus(row.status) not in ACTIVE:
            return Watch.LOST
        if JobStatus(row.status) is JobStatus.CANCELLING:
            return Watch.CANCEL
        if JobStatus(row.status) is JobStatus.PAUSING:
            return Watch.PAUSE
        return None

    def _ask_pause(self) -> None:
        """Ask the training to checkpoint at its next step boundary and end (it sees the file)."""
        request = self.dir / PAUSE_FILE
        if self.status is not JobStatus.PAUSING or not request.exists():
            request.touch()
            self.status = JobStatus.PAUSING
            self._event("process", "pause asked: the training checkpoints at its next step and ends")

    def _leases_lost(self) -> Watch:
        """Our leases expired (the database was out of reach too long): the cards may be another's."""
        log.error("job %s: GPU leases expired while running", self.job_id)
        with session_scope(self.url) as s:
            job = jobs.lock(s, self.job_id)
            if job is not None and job.attempt == self.attempt and job.status in ACTIVE:
                reconcile.recover_lost(s, job, self.settings, "the run's GPU leases expired")
        return Watch.LOST

    def _train_tick(self, group: launcher.ProcessGroup) -> None:
        assert self._progress is not None and self._logs is not None
        saved = self.recorder.handle(parse_records(self._progress.read()))
        self._logs.poll()
        self._sample(group)
        for checkpoint in saved:
            self.evals.on_checkpoint(checkpoint)
        self.evals.tick()

    def _sample(self, group: launcher.ProcessGroup) -> None:
        now = time.monotonic()
        if now - self._last["sample"] < SAMPLE_EVERY_S:
            return
        self._last["sample"] = now
        procs = launcher.group_processes(group)
        self.recorder.peaks.observe_rss(launcher.group_rss_bytes(procs))
        used = self.nvml.used_bytes({p.pid for p in procs})
        if used is not None:
            self.recorder.peaks.observe({"nvml_peak_bytes": used})

    def _drain(self) -> None:
        assert self._progress is not None and self._logs is not None
        saved = self.recorder.handle(parse_records(self._progress.read()))
        for checkpoint in saved:
            self.evals.on_checkpoint(checkpoint)
        self.recorder.flush(force=True)
        self._logs.poll(force=True)

    # ------------------------------------------------------------------ verdicts

    def _training_failure(self, group: launcher.ProcessGroup) -> Failure | None:
        code = group.poll()
        written = read_failure(self.dir / "failure.json")
        if code == 0 and self.recorder.done is not None:
            return None
        if written is not None:
            return written
        return failure_from_exit(code, "training")

    def _plan_again(self, failure: Failure) -> Failure | None:
        """Queue the job again with the peak its training reached (``worker/replan.py``); ``None``
        when it is queued, else the failure with the reason it was not planned again."""
        def step() -> str | None:
            with session_scope(self.url) as s:
                job = jobs.lock(s, self.job_id)
                if job is None or job.attempt != self.attempt:
                    raise RunLost
                cards = s.scalars(select(Gpu.memory_total_bytes).where(Gpu.id.in_(self.grant.gpu_ids))).all()
                outcome = replan_after_oom(job.plan or {}, failure.data or {}, min(cards, default=0),
                                           self.settings.gpu_memory_tolerance)
                if isinstance(outcome, str):
                    return outcome
                leasing.release(s, self.job_id)
                transition(s, self.job_id, JobStatus.QUEUED, expected=self.status,
                           actor=f"worker:{self.host}", message=outcome.message,
                           data={"attempt": self.attempt, "replanned_after_oom": outcome.data},
                           plan=outcome.plan, dispatch_checked_at=utcnow(),
                           planned_peak_gpu_bytes=int(job.planned_peak_gpu_bytes or 0) + outcome.added_bytes)
            return None

        why = self._when_database(step)
        if why is not None:
            return Failure(failure.kind, failure.reason, f"{failure.message}; not planned again: {why}",
                           failure.data)
        self.status = JobStatus.QUEUED
        reconcile.enqueue(self.url, self.job_id)
        log.warning("job %s ran out of its planned GPU memory; planned again and queued", self.job_id)
        return None

    def _to_running(self, start: dict[str, Any] | None = None) -> None:
        if self.status is JobStatus.STARTING:
            total = (start or self.recorder.started or {}).get("total_steps")
            extra = {"total_steps": total} if total else {}
            self._transition(JobStatus.RUNNING, "training is running", **extra)

    def _paused(self) -> JobStatus | None:
        """The training saved a checkpoint and ended at a pause: the job waits, its GPUs freed."""
        step = (self.recorder.paused or self.recorder.done or {}).get("step")
        return self._finish(JobStatus.PAUSED, f"paused at step {step}; its GPUs are free")

    def _transition(self, target: JobStatus, message: str, data: dict[str, Any] | None = None,
                    **fields: Any) -> None:
        """A guarded move of this run's job; a cancel or a lost run that raced it is handled by the caller."""
        with session_scope(self.url) as s:
            current = jobs.attempt_of(s, self.job_id)
            if current != self.attempt:
                raise RunLost
            transition(s, self.job_id, target, expected=self.status, actor=f"worker:{self.host}",
                       message=message, data=data, **fields)
        self.status = target

    def _finish(self, target: JobStatus, message: str, **fields: Any) -> JobStatus | None:
        """End the job; if a cancel arrived meanwhile the job ends cancelled (its processes are gone)."""
        peaks = self.recorder.peak_fields()
        fields = {**{k: v for k, v in peaks.items() if v is not None}, "log_tail": self._log_text(),
                  **fields}
        try:
            self._when_database(lambda: self._transition(target, message, data=self._measured(), **fields))
            return target
        except IllegalTransition as exc:
            if exc.current is JobStatus.CANCELLING:
                self.status = JobStatus.CANCELLING
                return self._cancel()
            if exc.current is None or exc.current not in ACTIVE:
                raise RunLost from exc
            raise

    def _succeed(self) -> JobStatus | None:
        return self._finish(JobStatus.SUCCEEDED, "succeeded", **self.evals.job_fields())

    def _fail(self, failure: Failure) -> JobStatus | None:
        log.warning("job %s failed: %s %s", self.job_id, failure.kind, failure.reason)
        if failure.reason == "rows_dropped":
            self._keep_data_report(failure.data or {})
        return self._finish(JobStatus.FAILED, f"failed ({failure.kind}: {failure.reason})",
                            failure_kind=failure.kind, failure_reason=failure.reason,
                            failure_message=failure.message, **self.evals.job_fields())

    def _keep_data_report(self, data: dict[str, Any]) -> None:
        """The trainer's account of the rows it would drop, under its dataset's and tokenizer's keys:
        the same job submitted again is refused at once (``store/dataset_reports.py``)."""
        keys = ("dataset_key", "model_key", "format")
        report = data.get("report")
        if not isinstance(report, dict) or not all(isinstance(data.get(k), str) for k in keys):
            return
        try:
            with session_scope(self.url) as s:
                save_report(s, data["dataset_key"], data["model_key"], int(report["seq_len"]), data["format"],
                            data.get("name"), report)
        except (OperationalError, KeyError, TypeError, ValueError):
            log.warning("job %s: could not keep its data report", self.job_id, exc_info=True)

    def _cancel(self) -> JobStatus | None:
        for group in self.groups:
            launcher.terminate(group, self.settings.cancel_grace_s)
        left = [g.pgid for g in self.groups if launcher.group_alive(g.pgid)]
        if left:
            raise RuntimeError(f"process groups {left} survived SIGKILL")
        self.status = JobStatus.CANCELLING
        return self._finish(JobStatus.CANCELLED, "cancelled; no process of the job remains")

    def _measured(self) -> dict[str, Any]:
        with session_scope(self.url) as s:
            planned = jobs.columns(s, self.job_id, Job.planned_peak_gpu_bytes, Job.planned_host_bytes)
        if planned is None:
            raise RunLost
        return {"planned_peak_gpu_bytes": planned[0], "planned_host_bytes": planned[1],
                **self.recorder.peak_fields()}

    # ------------------------------------------------------------------ bookkeeping

    def _cleanup(self) -> None:
        try:
            for group in self.groups:
                if launcher.group_alive(group.pgid):
                    launcher.terminate(group, min(self.settings.cancel_grace_s, 5.0))
        except Exception:  # the reconciler kills what is left: the job's processes carry its markers
            log.exception("job %s: stopping its processes failed", self.job_id)
        self.nvml.close()
        for swap in self._swap_dirs:  # its checkpoints hold what a later run resumes from
            shutil.rmtree(swap, ignore_errors=True)
        try:
            if self._logs is not None:
                self._logs.poll(force=True)
            self._release()
        except Exception:  # the reconciler frees what this could not (the leases expire)
            log.exception("job %s: cleanup after the run failed", self.job_id)

    def _release(self) -> None:
        """Free the cards unless another run of the job holds them now."""
        with session_scope(self.url) as s:
            attempt = jobs.attempt_of(s, self.job_id, lock=True)
            if attempt == self.attempt:
                leasing.release(s, self.job_id)

    def _update(self, **fields: Any) -> None:
        with session_scope(self.url) as s:
            jobs.set_fields(s, self.job_id, attempt=self.attempt, **fields)

    def _event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        with session_scope(self.url) as s:
            s.add(JobEvent(job_id=self.job_id, kind=kind, actor=f"worker:{self.host}", message=message,
                           data=data))

    def _log_text(self) -> str | None:
        return self._logs.text() if self._logs is not None else None


# --------------------------------------------------------------------------- evaluation


class Evaluations:
    """The separate evaluation processes of a run: at checkpoints (``steps``) and of the final model."""

    def __init__(self, run: JobRun) -> None:
        self.run = run
        self.when, self.every, self.fits = _eval_settings(run)
        self.current: tuple[launcher.ProcessGroup, dict[str, Any]] | None = None
        self.pending: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self._last_step = 0

    # ---- at checkpoints

    def on_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        step = int(checkpoint.get("step") or 0)
        if self.when != "steps" or not self.every or step // self.every <= self._last_step // self.every:
            return
        self._last_step = step
        self.pending.append(checkpoint)  # beside training one at a time; the rest wait their turn
        self.tick()

    def tick(self) -> None:
        """Beside training (the plan says both fit): collect a finished one, start the next."""
        if self.current is not None and self.current[0].poll() is not None:
            self._collect(*self.current)
            self.current = None
        if self.fits and self.current is None and self.pending:
            self.current = self._start(self.pending.pop(0))

    # ---- after training

    def wanted_after_training(self, final: str | None) -> bool:
        work = bool(final) or bool(self.pending) or self.current is not None
        return self.when in ("end", "steps") and work

    def run_after_training(self, final: str | None) -> Watch:
        """Finish the checkpoint evaluations, then evaluate the final model; one process at a time."""
        if self.current is not None:
            verdict = self._wait(*self.current)
            if verdict is not Watch.EXITED:
                return verdict
            self.current = None
        final_step = (self.run.recorder.done or {}).get("step")
        # a checkpoint of the last step holds the final weights: the final evaluation covers it
        todo = [c for c in self.pending if not final or c.get("step") != final_step]
        self.pending = []
        if final:
            todo.append({"path": final, "step": final_step, "final": True})
        for checkpoint in todo:
            verdict = self._wait(*self._start(checkpoint))
            if verdict is not Watch.EXITED:
                return verdict
        return Watch.EXITED

    def _wait(self, group: launcher.ProcessGroup, checkpoint: dict[str, Any]) -> Watch:
        # the evaluation's memory is its own (the plan's eval figure), not the training's peak
        verdict = self.run._watch(group, lambda g: None)
        if verdict is Watch.EXITED:
            self._collect(group, checkpoint)
        return verdict

    def _start(self, checkpoint: dict[str, Any]) -> tuple[launcher.ProcessGroup, dict[str, Any]]:
        path = str(checkpoint["path"])
        result = self.run.dir / "eval" / f"{Path(path).name}.json"
        result.unlink(missing_ok=True)
        group = launcher.start_eval(self.run.dir, path, self.run.grant, self.run.settings, self.run.run_id)
        self.run.groups.append(group)
        self.run._event("eval", f"evaluating {Path(path).name} (pid {group.pids[0]})",
                        {"checkpoint": path, "pid": group.pids[0], "step": checkpoint.get("step")})
        return group, checkpoint

    def _collect(self, group: launcher.ProcessGroup, checkpoint: dict[str, Any]) -> None:
        path = str(checkpoint["path"])
        result = eval_result(self.run.dir / "eval" / f"{Path(path).name}.json", group, self.run.dir)
        ok = result.get("status") != "failed"
        step = checkpoint.get("step")
        if checkpoint.get("final"):
            self.final = result
        self._store(step, ok, result)
        message = (f"evaluation of {Path(path).name}: eval_loss {result.get('eval_loss')}" if ok else
                   f"evaluation of {Path(path).name} failed ({result.get('reason')}); training unaffected")
        self.run._event("eval", message, {"checkpoint": path, "step": step, **_brief(result)})

    def _store(self, step: Any, ok: bool, result: dict[str, Any]) -> None:
        if step is None:
            return
        with session_scope(self.run.url) as s:
            checkpoints.set_evaluation(s, self.run.job_id, int(step), ok, result)
        if ok:
            record_eval_metric(self.run.url, self.run.job_id, int(step), result.get("eval_loss"))

    def job_fields(self) -> dict[str, Any]:
        if self.final is None:
            return {}
        status = "failed" if self.final.get("status") == "failed" else "succeeded"
        return {"eval_status": status, "eval_result": self.final}


def _eval_settings(run: JobRun) -> tuple[str, int | None, bool]:
    with session_scope(run.url) as s:
        row = jobs.columns(s, run.job_id, Job.spec, Job.plan)
    if row is None:
        raise RunLost
    spec, plan = row
    ev = (spec or {}).get("eval") or {}
    # beside the training only where the plan says both fit the card (its lease then holds both)
    fits = bool(((plan or {}).get("eval") or {}).get("fits_beside_training"))
    return str(ev.get("when") or "end"), ev.get("every_steps"), fits


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "pid", "eval_loss", "perplexity", "reason", "kind")
    return {k: result[k] for k in keys if k in result}


def eval_result(path: Path, group: launcher.ProcessGroup, job_dir: Path) -> dict[str, Any]:
    """What the evaluation wrote, or a failure made from its exit and log when it wrote nothing."""
    code = group.poll()
    group.settle()
    try:
        result = json.loads(path.read_text())
        if isinstance(result, dict):
            if code not in (0, None) and result.get("status") != "failed":
                result = {**result, "status": "failed", "reason": "exit_code", "exit_code": code}
            return result
    except (OSError, ValueError):
        pass
    failure = failure_from_exit(code, "evaluation")
    return {"status": "failed", "kind": failure.kind, "reason": failure.reason, "message": failure.message,
            "pid": group.pids[0], "exit_code": code, "log_tail": _tail(job_dir / "eval.log")}


def read_failure(path: Path) -> Failure | None:
    try:
        raw = json.loads(path.read_text())
        data = raw.get("data")
        return Failure(str(raw.get("kind") or "error"), str(raw.get("reason") or "error"),
                       str(raw.get("message") or ""), data if isinstance(data, dict) else None)
    except (OSError, ValueError, AttributeError):
        return None


def failure_from_exit(code: int | None, what: str) -> Failure:
    """A failure for a process that left no failure.json: from its exit code or signal."""
    if code == -signal.SIGKILL:
        return Failure("error", "host_oom", f"the {what} process was killed (SIGKILL) without a cancel: "
                       "most likely the kernel's out-of-memory killer (host RAM)")
    if code is not None and code < 0:
        return Failure("error", "killed", f"the {what} process died of signal {signal.Signals(-code).name}")
    if code == 0:
        return Failure("error", "no_result", f"the {what} process exited without reporting its end")
    kind, reason = EXIT_REASONS.get(code or 1, ("error", "error"))
    return Failure(kind, reason, f"the {what} process exited with code {code}")


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - chars))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
