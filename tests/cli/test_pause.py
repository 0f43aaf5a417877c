"""``tunebox pause`` / ``tunebox resume`` and the native routes behind them, against a live server."""

from __future__ import annotations

import pytest

from store.db import session_scope
from store.states import JobStatus as S
from store.states import transition
from tests.api.conftest import Env
from tunebox.cli import main


def _moves(url: str, job_id: str, *targets: S) -> None:
    with session_scope(url) as s:
        for target in targets:
            transition(s, job_id, target, actor="worker:test")


def test_pause_a_running_job_then_resume_it(server: Env, capsys: pytest.CaptureFixture[str]) -> None:
    job_id = server.submit()["id"]
    assert main(["pause", job_id]) == 1  # queued: nothing trains yet
    assert "409" in capsys.readouterr().err
    _moves(server.url, job_id, S.STARTING, S.RUNNING)
    res = server.client.post(f"/v1/jobs/{job_id}/pause", headers=server.auth("bob"))
    assert res.status_code == 403  # only its owner or an admin
    assert main(["pause", job_id]) == 0
    assert capsys.readouterr().out.split() == [job_id, "pausing"]
    assert main(["resume", job_id]) == 1  # still pausing: the training has not saved yet
    capsys.readouterr()
    _moves(server.url, job_id, S.PAUSED)
    assert main(["resume", job_id]) == 0
    assert capsys.readouterr().out.split() == [job_id, "queued"]
    assert [job for job, _ in server.enqueued.calls] == [job_id, job_id]  # sent again after the commit


def test_a_paused_job_cancels_at_once(server: Env, capsys: pytest.CaptureFixture[str]) -> None:
    job_id = server.submit()["id"]
    _moves(server.url, job_id, S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED)
    res = server.client.post(f"/v1/jobs/{job_id}/cancel", headers=server.auth())
    assert res.status_code == 200 and res.json()["status"] == "cancelled"
