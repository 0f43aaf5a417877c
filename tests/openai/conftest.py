"""The official ``openai`` SDK as the client of a real tunebox API (uvicorn on a port), on Postgres and
on the embedded default's SQLite; the run task is recorded instead of sent (the worker is tested in
``test_sdk_training.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from tests.api.conftest import Enqueued, issue_tokens, make_settings, roots, serve_in_thread
from tests.conftest import truncate_all
from tests.tinydata import messages_rows, write_jsonl

__all__ = ["roots"]  # the API tests' model and dataset roots, as a fixture here too


@dataclass
class Box:
    url: str
    base_url: str
    enqueued: Enqueued
    tokens: dict[str, str]
    chat_file: Path

    def client(self, who: str = "alice", **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.tokens[who], **kwargs)


@pytest.fixture(params=["postgresql", "sqlite"])
def box(request: pytest.FixtureRequest, roots: tuple[Path, Path], tmp_path: Path) -> Iterator[Box]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    truncate_all(url)
    enqueued = Enqueued()
    app = create_app(
        make_settings(url, roots, tmp_path, max_body_bytes=4 * 2**20), enqueue=enqueued, token_cache_ttl_s=0
    )
    chat = write_jsonl(tmp_path / "chat.jsonl", messages_rows(24))
    with serve_in_thread(app) as base_url:
        yield Box(url, base_url, enqueued, issue_tokens(url), chat)
