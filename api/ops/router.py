"""``/healthz`` (the process answers), ``/readyz`` (database and broker reachable, a worker consuming
the queue, the embedded worker not failing), ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.errors import FieldError, ServiceUnavailable
from api.workers import no_worker
from tunebox.settings import Settings

router = APIRouter(tags=["ops"])

CHECK_TIMEOUT_S = 2.0


@router.get("/healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _database_problems(sessions: sessionmaker[Session], settings: Settings) -> tuple[str | None, str | None]:
    """What is wrong with the database, else whether a worker reports to it."""
    try:
        with sessions() as session:
            session.execute(text("SELECT 1"))
            return None, no_worker(session, settings)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300], None


def _broker_problem(settings: Settings) -> str | None:
    url = settings.resolved_broker_url
    try:
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(url, socket_timeout=CHECK_TIMEOUT_S,
                                          socket_connect_timeout=CHECK_TIMEOUT_S)
            try:
                client.ping()
            finally:
                client.close()
        elif url.startswith("filesystem://"):
            folder = Path(settings.data_dir) / "broker"
            folder.mkdir(parents=True, exist_ok=True)
        else:
            from kombu.connection import Connection

            with Connection(url, connect_timeout=CHECK_TIMEOUT_S) as conn:  # type: ignore[no-untyped-call]
                conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return None


def _readiness(sessions: sessionmaker[Session], settings: Settings,
               worker_problem: Callable[[], str | None]) -> list[FieldError]:
    problems = []
    db, silent = _database_problems(sessions, settings)
    if db is not None:
        problems.append(FieldError("database", db))
    if (broker := _broker_problem(settings)) is not None:
        problems.append(FieldError("broker", broker))
    if (worker := worker_problem() or silent) is not None:
        problems.append(FieldError("worker", worker))
    return problems


@router.get("/readyz", summary="Database and broker reachable, and a worker consuming the queue",
            responses={503: {"content": {"application/problem+json": {}}}})
async def readyz(request: Request) -> dict[str, str]:
    state = request.app.state
    problems = await run_in_threadpool(_readiness, state.read_sessions, state.settings, state.worker_problem)
    if problems:
        raise ServiceUnavailable("not ready: " + "; ".join(p["field"] for p in problems), errors=problems)
    return {"status": "ready", "database": "ok", "broker": "ok", "worker": "ok"}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    payload = await run_in_threadpool(generate_latest, registry)
    return Response(payload, media_type=CONTENT_TYPE_LATEST)
