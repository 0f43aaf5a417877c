"""How the API hands a job to the GPU workers: a Celery task carrying only the job id, on queue ``gpu``.

Send only after the commit that created the job row: a worker that receives the id must find the row.
"""

from __future__ import annotations

from worker.queues import GPU_QUEUE, RUN_JOB_TASK

__all__ = ["GPU_QUEUE", "RUN_JOB_TASK", "enqueue_job"]


def enqueue_job(job_id: str, *, priority: int = 0, task_id: str | None = None) -> str:
    """Send the run task for ``job_id``; return the Celery task id (``task_id`` if given)."""
    from worker.celery_app import get_celery

    result = get_celery().send_task(RUN_JOB_TASK, args=[job_id], queue=GPU_QUEUE,
                                    priority=_celery_priority(priority), task_id=task_id)
    return str(result.id)


def _celery_priority(priority: int) -> int:
    # spec priority is -100..100 (higher first); Redis transport priorities are 0..9 (0 first)
    return max(0, min(9, round((100 - priority) / 200 * 9)))
