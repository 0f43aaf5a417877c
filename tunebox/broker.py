"""The broker between the API and the GPU workers: the Celery application's settings, the run task's
name and queue, and the one way a job is handed over (``enqueue_job``, a task carrying only the job id).

Settings for hours-long tasks: a message is acknowledged only when its task returns (``acks_late``),
a worker holds one message at a time (prefetch 1), a message whose worker died is given back
(``task_reject_on_worker_lost``), and the broker's visibility timeout is longer than any run so a
running job is never delivered a second time because it is slow. The database, not the broker, is
the truth about jobs: there is no result backend, and the task re-reads the job row before acting.
Send only after the commit that created the job row: a worker that receives the id must find the row.
"""

from __future__ import annotations

import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Queue, serialization

from tunebox.settings import Settings, get_settings

__all__ = ["GPU_QUEUE", "RUN_JOB_TASK", "broker_folders", "enqueue_job", "get_celery", "make_celery"]

RUN_JOB_TASK = "tunebox.run_job"
GPU_QUEUE = "gpu"
#: kombu's Redis transport, keeping one redis client per channel (see tunebox.redis_transport)
REDIS_TRANSPORT = "tunebox.redis_transport:Transport"


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
    """The application the API sends with and the workers consume with (their tasks: worker.tasks)."""
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
    if settings.resolved_broker_url.startswith("redis://"):
        app.conf.broker_transport = REDIS_TRANSPORT
    return app


@lru_cache(maxsize=1)
def get_celery() -> Celery:
    return make_celery(get_settings())


def enqueue_job(job_id: str, *, priority: int = 0, task_id: str | None = None) -> str:
    """Send the run task for ``job_id``; return the Celery task id (``task_id`` if given)."""
    app = get_celery()
    if app.conf.broker_transport == REDIS_TRANSPORT:
        task_id = task_id or str(uuid.uuid4())
        _publisher(app).send(job_id, _celery_priority(priority), task_id)
        return task_id
    # argsrepr/kwargsrepr: the arguments as the message's headers show them, what Celery's saferepr
    # writes for a job id, without its walk over the arguments
    result = app.send_task(RUN_JOB_TASK, args=[job_id], queue=GPU_QUEUE, priority=_celery_priority(priority),
                           task_id=task_id, argsrepr=repr([job_id]), kwargsrepr="{}")
    return str(result.id)


class RunTaskPublisher:
    """The run task's message put on a Redis broker's queue through one kombu channel.

    The message is the one ``send_task`` writes: Celery builds its headers and body, kombu's channel
    encodes it and picks the queue's priority list. What is left out is the part a run task does not
    use and that cost more CPU than the message: the producer pool, kombu's retrying wrapper and the
    routing. A send the broker refuses is tried again as Celery's publish retry policy says
    (``task_publish_retry_policy``), then given up: the job stays queued for the reconciler. The
    queue is declared once, as ``send_task`` does on its first message. The channel is shared by the
    API's threads under a lock.
    """

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._connection = app.connection_for_write()
        self._lock = threading.Lock()
        self._declared = False

    def send(self, job_id: str, priority: int, task_id: str) -> None:
        args = [job_id]
        options = {"argsrepr": repr(args), "kwargsrepr": "{}"}
        message = self._app.amqp.create_task_message(task_id, RUN_JOB_TASK, args, {},
                                                     reply_to=self._app.thread_oid, ignore_result=None,
                                                     **options)
        content_type, encoding, body = serialization.dumps(message.body, serializer="json")
        properties = {**message.properties, **options, "delivery_mode": 2}
        policy = self._app.conf.task_publish_retry_policy
        attempt = 0
        while True:
            try:
                with self._lock:
                    channel = self._connection.default_channel
                    if not self._declared:
                        self._app.amqp.queues[GPU_QUEUE](channel).declare()
                        self._declared = True
                    channel.basic_publish(channel.prepare_message(body, priority, content_type, encoding,
                                                                  message.headers, properties),
                                          exchange="", routing_key=GPU_QUEUE)
                return
            except self._connection.connection_errors:
                if attempt >= policy["max_retries"]:
                    raise
            delay = policy["interval_start"] + attempt * policy["interval_step"]
            time.sleep(min(delay, policy["interval_max"]))
            attempt += 1


@lru_cache(maxsize=1)
def _publisher(app: Celery) -> RunTaskPublisher:
    return RunTaskPublisher(app)


def _celery_priority(priority: int) -> int:
    # spec priority is -100..100 (higher first); Redis transport priorities are 0..9 (0 first)
    return max(0, min(9, round((100 - priority) / 200 * 9)))
