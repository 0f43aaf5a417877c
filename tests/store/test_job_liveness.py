"""Random event sequences through the real store, leases, broker and reconciler never strand a job.

After a reconciler pass every job that is not terminal has someone who will move it on: an active job
(starting, running, evaluating, cancelling) holds a live GPU lease of its run, and a queued job has a
message on the broker (waiting, or held unacknowledged by a worker). No job that is queued or finished
holds a lease. The events are what the API, the workers and the failures around them do: submit (with
the send failing or not), a worker taking a message, a run's own moves, cancel, a worker dying with
its lease left to expire or its process gone at once, the broker losing its messages, a duplicate
message, and the reconciler's pass.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import select, update

from api.auth.service import Principal
from api.jobs.service import cancel_job
from store.base import utcnow
from store.db import session_scope
from store.models import GpuLease, Job
from store.states import ACTIVE, TERMINAL, IllegalTransition, JobStatus, transition
from tests.conftest import truncate_all
from tests.worker.factories import make_job, make_user
from tests.worker.harness import worker_env
from tunebox import gpus
from tunebox.broker import GPU_QUEUE, enqueue_job, get_celery
from tunebox.settings import Settings, get_settings
from worker import leasing, reconcile, tasks

S = JobStatus
HOST = "prop-host"
ADMIN = Principal(user_id="usr_admin", name="admin", is_admin=True, token_id="tok_admin")
# what a live run does next from each state (picked by the event's choice)
RUN_MOVES = {
    S.STARTING: (S.RUNNING, S.RUNNING, S.FAILED),
    S.RUNNING: (S.EVALUATING, S.SUCCEEDED, S.FAILED),
    S.EVALUATING: (S.SUCCEEDED, S.SUCCEEDED, S.FAILED),
    S.CANCELLING: (S.CANCELLED, S.CANCELLED, S.CANCELLED),
}
EVENTS = ("submit", "submit_send_fails", "deliver", "deliver", "run_moves", "run_moves", "cancel",
          "lease_expires", "worker_process_dies", "broker_loses_messages", "duplicate_message",
          "reconcile")


@pytest.fixture(scope="module")
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def box(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """This process as the workers and reconciler of a two-GPU host on Redis and Postgres."""
    env = worker_env(pg_url, redis_url, tmp_path_factory.mktemp("box"), worker_host=HOST, gpu_count=2,
                     max_attempts=2, requeue_after_s=0.001)
    saved = {k: v for k, v in os.environ.items() if k.startswith("TUNEBOX_")}
    os.environ.update({k: v for k, v in env.items() if k.startswith("TUNEBOX_")})
    nvml, gpus._nvml_inventory = gpus._nvml_inventory, lambda: []
    get_settings.cache_clear()
    get_celery.cache_clear()
    yield get_settings()
    gpus._nvml_inventory = nvml
    for key in [k for k in os.environ if k.startswith("TUNEBOX_")]:
        del os.environ[key]
    os.environ.update(saved)
    get_settings.cache_clear()
    get_celery.cache_clear()


@dataclass
class World:
    settings: Settings
    dead_pid: int
    owner: str = ""
    jobs: list[str] = field(default_factory=list)
    live_runs: dict[str, int] = field(default_factory=dict)  # job -> attempt of a run whose worker lives

    @property
    def url(self) -> str:
        return self.settings.resolved_database_url

    def reset(self) -> None:
        truncate_all(self.url)
        redis.Redis.from_url(self.settings.resolved_broker_url).flushdb()
        with session_scope(self.url) as s:
            self.owner = make_user(s).id
            gpus.sync_inventory(s, self.settings)

    # ------------------------------------------------------------------ the broker

    def _client(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.resolved_broker_url)

    def take_message(self, job_id: str) -> bool:
        """A worker takes one waiting message of ``job_id`` off the queue (as Celery delivers it)."""
        client = self._client()
        for key in client.scan_iter(match=f"{GPU_QUEUE}*"):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                if job_id.encode() in raw and client.lrem(key, 1, raw):
                    return True
        return False

    def on_broker(self, job_id: str) -> bool:
        return any(job_id in m for m in reconcile.broker_messages(self.settings))

    # ------------------------------------------------------------------ events

    def submit(self, send: bool) -> None:
        with session_scope(self.url) as s:
            job_id = make_job(s, _Owner(self.owner), peak=None).id
        self.jobs.append(job_id)
        if send:  # only after the commit, as the API does
            enqueue_job(job_id)

    def deliver(self, job_id: str) -> None:
        if not self.take_message(job_id):
            return
        claimed = tasks.claim(job_id, self.settings, task_id=None)
        if claimed is tasks.Skip.WAIT:
            enqueue_job(job_id)  # the task's retry publishes it again
        elif not isinstance(claimed, tasks.Skip):
            self.live_runs[job_id] = claimed[1]

    def run_moves(self, job_id: str, choice: int) -> None:
        attempt = self.live_runs.get(job_id)
        with session_scope(self.url) as s:
            row = s.execute(select(Job.status, Job.attempt).where(Job.id == job_id)).one()
        status = S(row.status)
        if attempt is None or row.attempt != attempt or status not in RUN_MOVES:
            return  # no live run of this job: nothing moves it but the reconciler
        target = RUN_MOVES[status][choice % 3]
        fields = {"failure_kind": "error", "failure_reason": "error"} if target is S.FAILED else {}
        with session_scope(self.url) as s:
            try:
                transition(s, job_id, target, expected=status, actor="worker", **fields)
            except IllegalTransition as exc:
                if exc.current is not S.CANCELLING:
                    raise
                target = S.CANCELLED  # a cancel raced the move: the run ends its processes
        if target is S.CANCELLED and status is not S.CANCELLING:
            with session_scope(self.url) as s:
                transition(s, job_id, S.CANCELLED, expected=S.CANCELLING, actor="worker")
        if target.terminal():
            with session_scope(self.url) as s:  # the run's cleanup frees its cards
                leasing.release(s, job_id)
            del self.live_runs[job_id]

    def cancel(self, job_id: str) -> None:
        from api.errors import Conflict

        with session_scope(self.url) as s, contextlib.suppress(Conflict):  # already finished
            cancel_job(s, ADMIN, job_id)

    def lease_expires(self, job_id: str) -> None:
        """The worker went silent: it renews nothing any more and its lease runs out."""
        self.live_runs.pop(job_id, None)
        with session_scope(self.url) as s:
            s.execute(update(GpuLease).where(GpuLease.job_id == job_id)
                      .values(expires_at=utcnow() - timedelta(seconds=1)))

    def worker_process_dies(self, job_id: str) -> None:
        """The worker process on this host is gone while its lease still looks live."""
        self.live_runs.pop(job_id, None)
        with session_scope(self.url) as s:
            s.execute(update(Job).where(Job.id == job_id, Job.worker_host == HOST)
                      .values(worker_pid=self.dead_pid))

    def broker_loses_messages(self) -> None:
        self._client().flushdb()

    def reconcile(self) -> None:
        reconcile.reconcile_once(self.settings)

    def apply(self, event: str, index: int, choice: int) -> None:
        if event in ("submit", "submit_send_fails"):
            return self.submit(send=event == "submit")
        if event == "broker_loses_messages":
            return self.broker_loses_messages()
        if event == "reconcile":
            return self.reconcile()
        if not self.jobs:
            return None
        job_id = self.jobs[index % len(self.jobs)]
        if event == "duplicate_message":
            return None if self._status(job_id).terminal() else enqueue_job(job_id)
        if event == "run_moves":
            return self.run_moves(job_id, choice)
        return getattr(self, event)(job_id)

    # ------------------------------------------------------------------ the property

    def _status(self, job_id: str) -> JobStatus:
        with session_scope(self.url) as s:
            return S(s.scalar(select(Job.status).where(Job.id == job_id)))

    def stranded(self) -> list[str]:
        """Jobs that nobody will move on, or that hold cards they should not."""
        now = utcnow()
        with session_scope(self.url) as s:
            statuses = dict(s.execute(select(Job.id, Job.status)).all())
            live = set(s.scalars(select(GpuLease.job_id).where(GpuLease.expires_at > now)))
            leased = set(s.scalars(select(GpuLease.job_id)))
        out = []
        for job_id, status in statuses.items():
            status = S(status)
            if status in ACTIVE and job_id not in live:
                out.append(f"{job_id} {status.value} with no live lease")
            if status is S.QUEUED and not self.on_broker(job_id):
                out.append(f"{job_id} queued with no message on the broker")
            if (status in TERMINAL or status is S.QUEUED) and job_id in leased:
                out.append(f"{job_id} {status.value} still holds a lease")
        return out


@dataclass(frozen=True)
class _Owner:
    id: str


def _check(world: World) -> None:
    world.reconcile()
    assert world.stranded() == []


events = st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 7), st.integers(0, 2)),
                  min_size=1, max_size=24)


@hsettings(max_examples=40, deadline=None, derandomize=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sequence=events)
def test_no_event_sequence_strands_a_job(box: Settings, dead_pid: int,
                                         sequence: list[tuple[str, int, int]]) -> None:
    world = World(box, dead_pid)
    world.reset()
    for event, index, choice in sequence:
        world.apply(event, index, choice)
        if event == "reconcile":
            assert world.stranded() == [], f"after {event}"
    _check(world)


def test_a_lost_worker_and_a_lost_broker_together_leave_the_job_findable(box: Settings,
                                                                       dead_pid: int) -> None:
    """One sequence written out: a started job's worker dies and the broker empties; the job runs again."""
    world = World(box, dead_pid)
    world.reset()
    world.submit(send=True)
    job_id = world.jobs[0]
    world.deliver(job_id)
    assert world._status(job_id) is S.STARTING
    world.lease_expires(job_id)
    world.broker_loses_messages()
    _check(world)
    assert world._status(job_id) is S.QUEUED and world.on_broker(job_id)
    world.deliver(job_id)
    world.run_moves(job_id, 0)
    world.run_moves(job_id, 1)
    assert world._status(job_id) is S.SUCCEEDED
    _check(world)
