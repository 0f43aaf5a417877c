"""The CLI tests use the API fixtures (a live app on Postgres, tokens, model and dataset roots)."""

from tests.api.conftest import pg_env, roots  # noqa: F401
