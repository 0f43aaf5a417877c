"""A Celery app whose ``tunebox.run_job`` task only records the job id it received (in Redis).

Run as a real worker process (``celery -A tests.api.celery_probe worker -Q gpu``) to prove that
``POST /v1/jobs`` puts a message carrying the job id on the broker, consumed by a Celery worker.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

from tunebox.broker import GPU_QUEUE, RUN_JOB_TASK

app = Celery("probe", broker=os.environ["TUNEBOX_BROKER_URL"])
app.conf.update(task_default_queue=GPU_QUEUE, task_acks_late=True, worker_prefetch_multiplier=1,
                task_ignore_result=True, broker_connection_retry_on_startup=True)


@app.task(name=RUN_JOB_TASK, bind=True)
def run_job(self: Any, job_id: str) -> None:
    record = f"{job_id} {self.request.id}"
    redis.Redis.from_url(os.environ["TUNEBOX_BROKER_URL"]).rpush(os.environ["PROBE_KEY"], record)
