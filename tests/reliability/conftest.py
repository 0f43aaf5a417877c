"""Fixtures of the fault tests: real stacks (API + worker processes) on private Redis servers and
databases of their own, with the real trainer (tiny model, DeepSpeed on the CPU) or the stand-in."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_pg_database, drop_pg_database
from tests.reliability.support import GIB, RedisServer, Stack, tmpfs, unique
from tests.tinydata import WORDS, write_dataset, write_jsonl
from tests.tinymodel import build_tiny_model
from tests.worker.conftest import migrate

# Each process of a real-trainer job may map this much: a tiny LoRA run peaks near 2.9 GiB of
# address space on the CPU, a batch of 64 sequences of 512 tokens near 5 GiB.
ADDRESS_SPACE_CAP = int(3.5 * GIB)


@pytest.fixture(scope="session")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("reliability-roots")
    build_tiny_model(base / "models" / "tiny")
    write_dataset(base / "data" / "repeat.jsonl", "alpaca", n=48)
    rng = random.Random(0)
    long_rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(700))} for _ in range(64)]
    write_jsonl(base / "data" / "long.jsonl", long_rows)
    return {"base": base, "models": base / "models", "data": base / "data"}


def _overrides(roots: dict[str, Path], **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model_roots": json.dumps([str(roots["models"])]), "dataset_roots": json.dumps([str(roots["data"])]),
        # one stand-in card that two tiny jobs cannot share: the queue order is visible
        "gpu_memory_bytes": 8 * GIB, "worker_host": unique("box"),
        "progress_interval_s": 0.3, "cancel_grace_s": 5, "lease_ttl_s": 60, "reconcile_interval_s": 2,
    }
    values.update(extra)
    return values


@pytest.fixture(scope="session")
def _databases() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for url in made:
        drop_pg_database(url)


def _database(made: list[str]) -> str:
    url = create_pg_database("tunebox_rel")
    made.append(url)
    migrate(url)
    return url


@pytest.fixture(scope="session")
def real_stack(roots: dict[str, Path], _databases: list[str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real trainer on a 256 MiB tmpfs data folder (so a test can fill the disk for real)."""
    base = tmp_path_factory.mktemp("real-stack")
    redis = RedisServer(base / "redis").start()
    with tmpfs(base / "data", "256m") as mounted:
        overrides = _overrides(roots, train_module="worker.train", eval_module="worker.evaluate",
                               job_address_space_bytes=ADDRESS_SPACE_CAP)
        stack = Stack(_database(_databases), redis.url, base / "data", base, overrides, redis=redis,
                      on_tmpfs=mounted)
        try:
            stack.start_api()
            stack.start_worker()
            yield stack
        finally:
            stack.stop()
            redis.stop()


@pytest.fixture(scope="session")
def fake_stack(roots: dict[str, Path], _databases: list[str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stand-in training module (tests/worker/fake_train.py): the same contract, no torch."""
    base = tmp_path_factory.mktemp("fake-stack")
    redis = RedisServer(base / "redis").start()
    overrides = _overrides(roots, train_module="tests.worker.fake_train",
                           eval_module="tests.worker.fake_eval")
    stack = Stack(_database(_databases), redis.url, base / "data", base, overrides, redis=redis)
    try:
        stack.start_api()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        redis.stop()
