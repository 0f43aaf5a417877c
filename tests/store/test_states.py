"""The job state machine on Postgres: guarded transitions, races with exactly one winner, final ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Job, JobEvent
from store.states import ALLOWED_FROM, TERMINAL, IllegalTransition, JobStatus, can_transition, transition

S = JobStatus
PATH = [S.STARTING, S.RUNNING, S.EVALUATING, S.SUCCEEDED]


def _status(url: str, job_id: str) -> JobStatus:
    with session_scope(url) as session:
        return JobStatus(session.scalar(select(Job.status).where(Job.id == job_id)))


def test_happy_path_sets_timestamps_and_writes_status_events(pg_url: str,
                                                             make_job: Callable[..., str]) -> None:
    job_id = make_job()
    for target in PATH:
        with session_scope(pg_url) as session:
            transition(session, job_id, target, actor="worker")
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        assert job.status is S.SUCCEEDED and job.started_at and job.finished_at
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        assert [(e.data["from"], e.data["to"]) for e in events] == [
            ("queued", "starting"), ("starting", "running"), ("running", "evaluating"),
            ("evaluating", "succeeded")]


# The job lifecycle of the design contract (pause/resume included), written out by hand and never
# derived from store.states: every (from, to) pair a job may take. Anything not listed is forbidden.
DESIGN_STATES = ("queued", "starting", "running", "evaluating", "cancelling", "pausing", "paused",
                 "succeeded", "failed", "cancelled")
DESIGN_TRANSITIONS = frozenset({
    ("queued", "starting"),      # a worker claims it
    ("queued", "cancelled"),     # cancelled before any process exists
    ("queued", "failed"),        # refused without starting (nothing to run it on, data gone)
    ("starting", "running"),
    ("starting", "cancelling"),
    ("starting", "failed"),
    ("starting", "queued"),      # its worker was lost: run again
    ("running", "evaluating"),
    ("running", "succeeded"),    # no evaluation asked for
    ("running", "failed"),
    ("running", "cancelling"),
    ("running", "queued"),
    ("running", "pausing"),
    ("evaluating", "succeeded"),
    ("evaluating", "failed"),
    ("evaluating", "cancelling"),
    ("evaluating", "queued"),
    ("cancelling", "cancelled"),
    ("cancelling", "failed"),    # the processes could not be ended
    ("pausing", "paused"),       # checkpoint saved at a step boundary, GPUs freed
    ("pausing", "failed"),
    ("pausing", "cancelling"),
    ("paused", "queued"),        # resume
    ("paused", "cancelled"),
})
DESIGN_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# states in which a process of the job may exist and holds (or is about to hold) its GPUs
DESIGN_ACTIVE = frozenset({"starting", "running", "evaluating", "cancelling", "pausing"})
STORE_STATES = [s.value for s in JobStatus]
PAIRS = [(a, b) for a in DESIGN_STATES for b in DESIGN_STATES if a in STORE_STATES and b in STORE_STATES]


def test_the_hand_written_table_keeps_terminal_states_final() -> None:
    assert not [pair for pair in DESIGN_TRANSITIONS if pair[0] in DESIGN_TERMINAL]
    assert {s.value for s in TERMINAL} == DESIGN_TERMINAL


def test_the_active_states_are_those_with_a_process() -> None:
    active = {s.value for s in JobStatus if s.active()}
    assert active == DESIGN_ACTIVE & set(STORE_STATES)
    assert not active & DESIGN_TERMINAL and "queued" not in active


def test_the_store_knows_every_state_of_the_design() -> None:
    assert set(STORE_STATES) == set(DESIGN_STATES)


def test_the_store_has_no_state_the_design_lacks() -> None:
    assert set(STORE_STATES) <= set(DESIGN_STATES)


@pytest.mark.parametrize(("current", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_table_matches_the_design_in_the_database_update(pg_url: str, make_job: Callable[..., str],
                                                         current: str, target: str) -> None:
    allowed = (current, target) in DESIGN_TRANSITIONS
    assert can_transition(S(current), S(target)) is allowed
    job_id = make_job(S(current))
    with session_scope(pg_url) as session:
        if allowed:
            assert transition(session, job_id, S(target)) is S(current)
        else:
            with pytest.raises(IllegalTransition) as info:
                transition(session, job_id, S(target))
            assert info.value.current is S(current)
    assert _status(pg_url, job_id) is S(target if allowed else current)


def test_terminal_states_are_final() -> None:
    for end in TERMINAL:
        assert not any(end in sources for sources in ALLOWED_FROM.values())
        assert end.terminal() and not end.active()


def test_expected_narrows_the_sources(pg_url: str, make_job: Callable[..., str]) -> None:
    job_id = make_job(S.RUNNING)
    with session_scope(pg_url) as session, pytest.raises(IllegalTransition):
        transition(session, job_id, S.FAILED, expected=S.QUEUED)
    assert _status(pg_url, job_id) is S.RUNNING


def test_unknown_job_is_refused(pg_url: str, make_job: Callable[..., str]) -> None:
    make_job()
    with session_scope(pg_url) as session, pytest.raises(IllegalTransition) as info:
        transition(session, "job_missing", S.STARTING)
    assert info.value.current is None


def _race(pg_url: str, job_id: str, targets: list[JobStatus]) -> list[JobStatus | None]:
    """Run one transition per thread, all released at once; return the target each winner reached."""
    barrier = threading.Barrier(len(targets))

    def attempt(target: JobStatus) -> JobStatus | None:
        barrier.wait()
        try:
            with session_scope(pg_url) as session:
                transition(session, job_id, target, actor=threading.current_thread().name)
            return target
        except IllegalTransition:
            return None

    with ThreadPoolExecutor(len(targets)) as pool:
        return list(pool.map(attempt, targets))


def test_eight_threads_racing_to_start_one_wins(pg_url: str, make_job: Callable[..., str]) -> None:
    for _ in range(3):  # a few rounds: a lucky interleaving must not pass by chance
        job_id = make_job()
        results = _race(pg_url, job_id, [S.STARTING] * 8)
        assert results.count(S.STARTING) == 1
        assert _status(pg_url, job_id) is S.STARTING
        with session_scope(pg_url) as session:
            events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()
        assert len(events) == 1


def test_cancel_racing_start_exactly_one_wins(pg_url: str, make_job: Callable[..., str]) -> None:
    for _ in range(5):
        job_id = make_job()
        results = _race(pg_url, job_id, [S.STARTING, S.CANCELLED] * 4)
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert _status(pg_url, job_id) is winners[0]


def test_cancel_racing_success_of_a_running_job(pg_url: str, make_job: Callable[..., str]) -> None:
    job_id = make_job(S.RUNNING)
    results = _race(pg_url, job_id, [S.CANCELLING, S.SUCCEEDED] * 4)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    final = _status(pg_url, job_id)
    assert final is winners[0]
    if final is S.CANCELLING:
        with session_scope(pg_url) as session:
            transition(session, job_id, S.CANCELLED)
        assert _status(pg_url, job_id) is S.CANCELLED
