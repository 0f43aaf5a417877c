"""The Celery application of the GPU workers (``celery -A worker.celery_app worker -Q gpu``).

Settings for hours-long tasks: a message is acknowledged only when its task returns (``acks_late``),
a worker holds one message at a time (prefetch 1), a message whose worker died is given back
(``task_reject_on_worker_lost``), and the broker's visibility timeout is longer than any run so a
running job is never delivered a second time because it is slow. The database, not the broker, is
the truth about jobs: there is no result backend, and the task re-reads the job row before acting.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Queue

from tunebox.settings import Settings, get_settings
from worker.queues import GPU_QUEUE


def broker_folders(settings: Settings) -> dict[str, Path]:
    """The folders of the server-less filesystem broker (embedded mode)."""
    base = settings.data_dir / "broker"
    return {"data_folder_in": base / "queue", "data_folder_out": base / "queue",
            "processed_folder": base / "processed", "control_folder": base / "control"}


def transport_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.resolved_broker_url.startswith("filesystem"):
        folders = broker_folders(settings)
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        options.update({k: str(v) for k, v in folders.items()}, store_processed=False)
    return options


def make_celery(settings: Settings) -> Celery:
    app = Celery("tunebox", broker=settings.resolved_broker_url, include=["worker.tasks"])
    app.conf.update(
        task_default_queue=GPU_QUEUE,
        task_queues=[Queue(GPU_QUEUE)],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options(settings),
        broker_connection_retry_on_startup=True,
        # a broker hiccup must not kill hours of training; a redelivery finds the job running
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        enable_utc=True,
    )
    return app


@lru_cache(maxsize=1)
def get_celery() -> Celery:
    return make_celery(get_settings())


def __getattr__(name: str) -> Any:
    """``app``, which ``celery -A worker.celery_app`` looks up: built on first use, not at import (the
    filesystem broker's folders are made then)."""
    if name == "app":
        return get_celery()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
