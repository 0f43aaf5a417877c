"""A job's status: the states of the lifecycle (``docs/design.md``), which are terminal and which
hold GPUs. ``store/states.py`` holds the transitions between them; the models import this module alone."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    EVALUATING = "evaluating"
    CANCELLING = "cancelling"
    PAUSING = "pausing"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def terminal(self) -> bool:
        return self in TERMINAL

    def active(self) -> bool:
        """Holds (or is about to hold) GPUs: a process of this job may exist."""
        return self in ACTIVE

    @classmethod
    def terminal_states(cls) -> frozenset[JobStatus]:
        return TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.EVALUATING, JobStatus.CANCELLING,
                    JobStatus.PAUSING})
