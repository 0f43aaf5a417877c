"""The shared database package: models, the job state machine, sessions. Imports no web or torch code."""

from store.states import FailureKind, IllegalTransition, JobStatus, transition

__all__ = ["FailureKind", "IllegalTransition", "JobStatus", "transition"]
