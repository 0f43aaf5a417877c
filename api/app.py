"""The FastAPI application factory; ``app`` (built on first access) is what uvicorn serves."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from api.auth.service import TokenCache
from api.catalogue.router import router as catalogue_router
from api.dashboard import install as install_dashboard
from api.datasets.router import router as datasets_router
from api.db import SUBMIT_THREADS, THREADS, close_async_reads, open_async_reads, open_database
from api.errors import document_problems, install_handlers
from api.gpus.router import router as gpus_router
from api.jobs.router import queue_router
from api.jobs.router import router as jobs_router
from api.jobs.service import Enqueue
from api.jobs.stream import StreamTiming
from api.me.router import router as me_router
from api.middleware import BodyLimitMiddleware, MetricsMiddleware, NulRefusalMiddleware
from api.openai import files_router, fine_tuning_router
from api.ops.metrics import ApiMetrics, CalibrationCollector, calibration_reader
from api.ops.router import router as ops_router
from api.plans.router import router as plans_router
from api.ratelimit import TokenBuckets
from api.workers import WorkerWatch
from store import jobs
from tunebox.gpus import box_host_clock
from tunebox.settings import Settings, get_settings

TOKEN_CACHE_TTL_S = 5.0


def _job_counts(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as session:
        return jobs.count_by_status(session)


def create_app(
    settings: Settings | None = None,
    *,
    enqueue: Enqueue | None = None,
    token_cache_ttl_s: float = TOKEN_CACHE_TTL_S,
    stream_timing: StreamTiming | None = None,
    worker_problem: Callable[[], str | None] | None = None,
) -> FastAPI:
    """Build the API. ``enqueue`` replaces :func:`tunebox.broker.enqueue_job` (tests);
    ``worker_problem`` says why the worker that ``tunebox serve`` runs beside it cannot run jobs
    (None while it can): readiness reports it and new jobs are refused."""
    settings = settings or get_settings()
    if enqueue is None:
        from tunebox.broker import enqueue_job

        enqueue = enqueue_job
    db = open_database(settings.resolved_database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        state.db_slots = anyio.Semaphore(db.slots)  # made here: it belongs to the serving loop
        state.async_reads = open_async_reads(settings.resolved_database_url)  # so does this pool
        # the threads a submission runs in (api.deps.in_thread): its checks, plan, INSERTs, commit, enqueue
        submit_threads = state.submit_threads = ThreadPoolExecutor(SUBMIT_THREADS,
                                                                   thread_name_prefix="tunebox-submit")
        # this box's host clock is probed in a child process, once; plans read the figure
        threading.Thread(target=box_host_clock, args=(settings,), name="host-clock-probe",
                         daemon=True).start()
        try:
            yield
        finally:
            await close_async_reads(state.async_reads)
            state.async_reads = None
            if state.submit_threads is submit_threads:  # not another lifespan's, run meanwhile
                state.submit_threads = None
            submit_threads.shutdown(wait=True)
            db.dispose()

    app = FastAPI(title="tunebox", version="0.1.0", openapi_url="/openapi.json", lifespan=lifespan,
                  description="Plan and run fine-tuning jobs on a shared GPU box.")
    state: Any = app.state
    state.db_slots = None
    state.async_reads = None  # until the lifespan starts: reads take the threaded path
    state.settings = settings
    state.sessions = db.sessions
    state.read_sessions = db.reads
    state.enqueue = enqueue
    state.submit_threads = None  # until the lifespan starts: submissions take anyio's threads
    state.worker_watch = WorkerWatch()
    state.worker_problem = worker_problem or (lambda: None)
    state.token_cache = TokenCache(token_cache_ttl_s)
    state.submit_buckets = TokenBuckets(settings.submit_rate_per_minute)
    state.stream_timing = stream_timing or StreamTiming()
    state.metrics = ApiMetrics(lambda: _job_counts(db.reads))
    state.metrics.registry.register(CalibrationCollector(calibration_reader(db.reads)))
    install_handlers(app)
    document_problems(app)
    for router in (ops_router, plans_router, jobs_router, queue_router, datasets_router, gpus_router,
                   catalogue_router, me_router):
        app.include_router(router)
    install_dashboard(app)
    app.include_router(files_router)
    app.include_router(fine_tuning_router)
    # added last = outermost: the limit applies before anything reads the body
    app.add_middleware(NulRefusalMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # `uvicorn api.app:app`: built on first access, so importing create_app reads no settings
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(name)
