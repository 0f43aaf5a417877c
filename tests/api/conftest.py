"""API fixtures: the app on a migrated database (Postgres, or SQLite for the core subset), tokens,
a model root with config-only model folders and a dataset root."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from api.auth.service import create_token
from store.db import session_scope
from tests.conftest import truncate_all
from tests.tinydata import write_dataset
from tunebox.settings import Settings

GiB = 2**30
SMALL_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
BIG_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
BOX = {"gpu_count": 1, "gpu_memory_bytes": 24 * GiB, "host_memory_bytes": 64 * GiB}


@pytest.fixture(scope="session")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("roots")
    models, data = base / "models", base / "data"
    for name, config in (("small", SMALL_CONFIG), ("big", BIG_CONFIG)):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(json.dumps(config))
    write_dataset(data / "train.jsonl", "alpaca", n=12)
    (base / "outside").mkdir()
    (base / "outside" / "config.json").write_text(json.dumps(SMALL_CONFIG))
    return models, data


def job_spec(**overrides: Any) -> dict[str, Any]:
    """A small LoRA job that fits the test box."""
    spec: dict[str, Any] = {"name": "test-job", "model": {"path": "small"},
                            "dataset": {"path": "train.jsonl"}, "method": "lora",
                            "training": {"max_steps": 10, "seq_len": 512}}
    spec.update(overrides)
    return spec


@dataclass
class Enqueued:
    calls: list[tuple[str, int]] = field(default_factory=list)
    task_ids: list[str | None] = field(default_factory=list)
    fail: bool = False

    def __call__(self, job_id: str, *, priority: int = 0, task_id: str | None = None) -> str:
        if self.fail:
            raise ConnectionError("broker down")
        self.calls.append((job_id, priority))
        self.task_ids.append(task_id)
        return task_id or f"task-{len(self.calls)}"


@dataclass
class Env:
    url: str
    settings: Settings
    client: TestClient
    enqueued: Enqueued
    tokens: dict[str, str]

    def auth(self, who: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def count(self, model: Any) -> int:
        with session_scope(self.url) as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)

    def submit(self, who: str = "alice", **overrides: Any) -> dict[str, Any]:
        res = self.client.post("/v1/jobs", json=job_spec(**overrides), headers=self.auth(who))
        assert res.status_code == 201, res.text
        return dict(res.json())


def make_settings(url: str, roots: tuple[Path, Path], tmp: Path, **extra: Any) -> Settings:
    values: dict[str, Any] = dict(
        database_url=url, data_dir=tmp, broker_url="redis://127.0.0.1:6379/15",
        model_roots=[roots[0]], dataset_roots=[roots[1]], gpu_count=BOX["gpu_count"],
        gpu_memory_bytes=BOX["gpu_memory_bytes"], host_memory_bytes=BOX["host_memory_bytes"],
        submit_rate_per_minute=10_000, max_queued_jobs_per_user=1000, max_body_bytes=256 * 1024)
    values.update(extra)
    return Settings(**values)


def issue_tokens(url: str) -> dict[str, str]:
    with session_scope(url) as session:
        return {"alice": create_token(session, "alice").token, "bob": create_token(session, "bob").token,
                "root": create_token(session, "root", admin=True).token}


def build_env(url: str, roots: tuple[Path, Path], tmp: Path, *, worker: bool = True,
              **settings: Any) -> Iterator[Env]:
    """The API on a fresh database; ``worker``: a worker has reported this box's GPUs, as its
    housekeeping does (without one, readiness fails and new jobs get a waiting event)."""
    truncate_all(url)
    enqueued = Enqueued()
    app = create_app(make_settings(url, roots, tmp, **settings), enqueue=enqueued, token_cache_ttl_s=0)
    if worker:
        report_gpus(url, app.state.settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Env(url, app.state.settings, client, enqueued, issue_tokens(url))


def report_gpus(url: str, settings: Settings) -> None:
    """What a worker's housekeeping writes each ``inventory_interval_s``: this box's GPU rows."""
    from tunebox.gpus import sync_inventory

    with session_scope(url) as session:
        sync_inventory(session, settings)


@pytest.fixture
def pg_env(pg_url: str, roots: tuple[Path, Path], tmp_path: Path) -> Iterator[Env]:
    yield from build_env(pg_url, roots, tmp_path)


@pytest.fixture(params=["postgresql", "sqlite"])
def env(request: pytest.FixtureRequest, roots: tuple[Path, Path], tmp_path: Path) -> Iterator[Env]:
    """The core subset runs on both backends: Postgres (production) and SQLite (embedded default)."""
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    yield from build_env(url, roots, tmp_path)



@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """``app`` under a real uvicorn in a thread; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
