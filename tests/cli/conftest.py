"""The CLI tests use the API fixtures (a live app on Postgres, tokens, model and dataset roots), and
``server``: that app served on a local port, with TUNEBOX_URL and alice's TUNEBOX_TOKEN set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from api.app import create_app
from tests.api.conftest import Env, pg_env, roots, serve_in_thread  # noqa: F401


@pytest.fixture
def server(pg_env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:  # noqa: F811
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0)
    with serve_in_thread(app) as url:
        monkeypatch.setenv("TUNEBOX_URL", url)
        monkeypatch.setenv("TUNEBOX_TOKEN", pg_env.tokens["alice"])
        yield pg_env
