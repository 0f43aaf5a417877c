"""Alembic environment: the target is ``store.base.Base.metadata`` (all models imported)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, pool

import store.models  # noqa: F401  (registers every table on Base.metadata)
from store.base import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from tunebox.settings import get_settings

    return get_settings().resolved_database_url


def _configure(**kwargs: object) -> None:
    url = _url()
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER columns or constraints; batch mode copies the table instead
        render_as_batch=url.startswith("sqlite"),
        compare_type=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_with(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    from sqlalchemy import create_engine

    existing = config.attributes.get("connection")
    if existing is not None:
        _run_with(existing)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        _run_with(connection)
    engine.dispose()


if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    run_offline()
else:
    run_online()
