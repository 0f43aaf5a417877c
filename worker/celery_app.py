"""The GPU workers' Celery application, for Celery's command line (``celery -A worker.celery_app worker
-Q gpu``): the one ``tunebox.broker`` makes, whose tasks are ``worker.tasks``."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``app``, which ``celery -A worker.celery_app`` looks up: built on first use, not at import (the
    filesystem broker's folders are made then)."""
    if name == "app":
        from tunebox.broker import get_celery

        return get_celery()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
