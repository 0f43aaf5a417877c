"""The reads and writes of one job row that the API, the worker and the reconciler share, by name.

Status changes are not here: they go through ``store.states.transition`` (guarded, with their event).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Row,
    Select,
    Table,
    Text,
    bindparam,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from store.base import utcnow
from store.models import GpuLease, Job, JobEvent, User
from store.status import ACTIVE, JobStatus

__all__ = ["active_on_host", "active_without_live_lease", "attempt_of", "by_ids", "columns",
           "count_by_status", "count_with_status", "create", "exists", "latest_succeeded_on", "lock",
           "newest_first", "queued_of_owner", "queued_of_owner_count", "queued_unsent_since", "set_fields",
           "status_of", "succeeded_hosts", "summaries", "using_dataset", "with_owner"]

_ACTIVE = [s.value for s in ACTIVE]


_JOBS, _JOB_EVENTS = cast(Table, Job.__table__), cast(Table, JobEvent.__table__)
#: the JSON columns ``create`` takes as JSON text, written once by the caller (who answers with it too)
JSON_TEXT_COLUMNS = ("spec", "plan")
# each column's Python-side default (scalars and callables such as utcnow), applied by ``create``
_DEFAULTS: dict[str, Any] = {c.name: c.default for c in _JOBS.c if c.default is not None}
_EVENT_COLUMNS = ("job_id", "kind", "actor", "message", "data", "created_at")
# built once per dialect and set of columns (and number of events): executed with each job's values
# as parameters, their compiled forms are cached
_INSERTS: dict[tuple[Any, ...], Any] = {}


def _job_insert(dialect: str, names: tuple[str, ...]) -> Any:
    if (statement := _INSERTS.get((dialect, names))) is None:
        def param(name: str) -> Any:
            if name not in JSON_TEXT_COLUMNS:
                return bindparam(name, type_=_JOBS.c[name].type)
            json_text = bindparam(f"{name}_json", type_=Text)
            # SQLite stores JSON as its text; Postgres casts the text to jsonb
            return cast_(json_text, JSONB) if dialect == "postgresql" else json_text

        statement = insert(_JOBS).values({name: param(name) for name in names})
        _INSERTS[(dialect, names)] = statement
    return statement


def _event_params(n: int) -> list[Any]:
    return [bindparam(f"{c}_{i}", type_=Text if c == "data" else _JOB_EVENTS.c[c].type)
            for c in _EVENT_COLUMNS for i in range(n)]


def _events_insert(dialect: str, n: int) -> Any:
    """One INSERT of ``n`` event rows, their ``data`` as JSON text: one statement where an executemany
    costs a pipeline, and as SQL text because SQLAlchemy does not cache a multi-row ``insert()``'s
    compiled form."""
    if (statement := _INSERTS.get((dialect, n))) is None:
        rows = ", ".join(f"(:job_id_{i}, :kind_{i}, :actor_{i}, :message_{i}, :data_{i}, :created_at_{i})"
                         for i in range(n))
        sql = f"INSERT INTO {_JOB_EVENTS.name} ({', '.join(_EVENT_COLUMNS)}) VALUES {rows}"
        statement = text(sql).bindparams(*_event_params(n))
        _INSERTS[(dialect, n)] = statement
    return statement


def _job_and_events_insert(names: tuple[str, ...], n: int) -> Any:
    """Postgres: the job and its ``n`` events in one statement (one round trip), the events' INSERT
    reading the job's from a CTE; events are numbered so their ids follow their order."""
    if (statement := _INSERTS.get(("postgresql", names, n))) is None:
        values = ", ".join(f"CAST(:{c}_json AS JSONB)" if c in JSON_TEXT_COLUMNS else f":{c}" for c in names)
        rows = ", ".join(f"({i}, :kind_{i}, :actor_{i}, :message_{i}, CAST(:data_{i} AS JSONB), "
                         f":created_at_{i})" for i in range(n))
        sql = (f"WITH job AS (INSERT INTO {_JOBS.name} ({', '.join(names)}) VALUES ({values}) RETURNING id) "
               f"INSERT INTO {_JOB_EVENTS.name} ({', '.join(_EVENT_COLUMNS)}) "
               "SELECT job.id, e.kind, e.actor, e.message, e.data, e.created_at "
               f"FROM job CROSS JOIN (VALUES {rows}) AS e(n, kind, actor, message, data, created_at) "
               "ORDER BY e.n")
        job_params = [bindparam(f"{c}_json", type_=Text) if c in JSON_TEXT_COLUMNS
                      else bindparam(c, type_=_JOBS.c[c].type) for c in names]
        events = [p for p in _event_params(n) if not p.key.startswith("job_id_")]
        statement = text(sql).bindparams(*job_params, *events)
        _INSERTS[("postgresql", names, n)] = statement
    return statement


def create(session: Session, values: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Insert a new job and its first events in this transaction; returns the stored row as a dict
    of every column (defaults filled), what ``JobRead`` is built from.

    ``values`` holds the columns of ``JSON_TEXT_COLUMNS`` as JSON text, stored as it is: the caller
    writes each document once, for the row and for its answer. The statement writes the given
    columns and those with a default (filled here, as the ORM would); the others stay NULL. So the
    returned dict is the row as stored without reading it back. One statement on Postgres, two on
    SQLite; no unit of work."""
    written = {c: d.arg if d.is_scalar else d.arg(None) for c, d in _DEFAULTS.items() if c not in values}
    written.update(values)
    names = tuple(sorted(written))
    params = {(f"{c}_json" if c in JSON_TEXT_COLUMNS else c): v for c, v in written.items()}
    event_params: dict[str, Any] = {}
    for i, event in enumerate(events):
        row = {"job_id": written["id"], "created_at": utcnow(), **event}
        row["data"] = json.dumps(row["data"])  # None too: a JSON null, as the JSON column type writes it
        event_params.update({f"{c}_{i}": row[c] for c in _EVENT_COLUMNS})
    conn = session.connection()
    dialect = conn.dialect.name
    if dialect == "postgresql" and events:
        conn.execute(_job_and_events_insert(names, len(events)),
                     {**params, **{k: v for k, v in event_params.items() if not k.startswith("job_id_")}})
    else:
        conn.execute(_job_insert(dialect, names), params)
        if events:
            conn.execute(_events_insert(dialect, len(events)), event_params)
    return {c.name: written.get(c.name) for c in _JOBS.c}


def lock(session: Session, job_id: str) -> Job | None:
    """The job row, locked for this transaction (``SELECT ... FOR UPDATE``), or None."""
    return session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()


def with_owner(session: Session, job_id: str) -> tuple[Job, str] | None:
    """The job and its owner's name, or None."""
    row = session.execute(select(Job, User.name).join(User, User.id == Job.owner_id)
                          .where(Job.id == job_id)).first()
    return (row[0], row[1]) if row is not None else None


def columns(session: Session, job_id: str, *cols: InstrumentedAttribute[Any]) -> Row[Any] | None:
    """Some columns of the job, without loading the row (its spec and plan are large), or None."""
    return session.execute(select(*cols).where(Job.id == job_id)).first()


def status_of(session: Session, job_id: str) -> JobStatus | None:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return JobStatus(status) if status is not None else None


def attempt_of(session: Session, job_id: str, *, lock: bool = False) -> int | None:
    """Which run of the job is current (each start after a requeue is a new attempt); ``lock`` holds
    the row until the transaction ends, so the attempt cannot change under the caller."""
    query = select(Job.attempt).where(Job.id == job_id)
    return session.scalar(query.with_for_update() if lock else query)


def set_fields(session: Session, job_id: str, *, attempt: int | None = None, **values: Any) -> int:
    """Write columns of the job (never its status: see ``store.states.transition``); with ``attempt``,
    only while that run is still the job's current one. Returns how many rows changed (0 or 1)."""
    if "status" in values:
        raise ValueError("a job's status changes through store.states.transition")
    query = update(Job).where(Job.id == job_id)
    if attempt is not None:
        query = query.where(Job.attempt == attempt)
    result = session.execute(query.values(**values).execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def exists(session: Session, job_id: str) -> bool:
    return session.scalar(select(Job.id).where(Job.id == job_id)) is not None


def by_ids(session: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """The jobs of these ids that exist, by id."""
    return {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(set(job_ids))))}


def active_without_live_lease(session: Session, now: datetime) -> list[str]:
    """Jobs that hold (or are about to hold) GPUs while no lease of theirs is live."""
    live = select(GpuLease.job_id).where(GpuLease.expires_at > now)
    return list(session.scalars(select(Job.id).where(Job.status.in_(_ACTIVE), Job.id.not_in(live))))


def active_on_host(session: Session, host: str) -> list[Row[Any]]:
    """(id, worker_pid, updated_at) of the active jobs a worker on ``host`` runs."""
    return list(session.execute(select(Job.id, Job.worker_pid, Job.updated_at).where(
        Job.status.in_(_ACTIVE), Job.worker_host == host)))


def queued_unsent_since(session: Session, cutoff: datetime) -> list[str]:
    """Queued jobs whose message was last sent (or, never checked, the job created) before ``cutoff``."""
    return list(session.scalars(select(Job.id).where(
        Job.status == JobStatus.QUEUED,
        or_(Job.dispatch_checked_at < cutoff,
            Job.dispatch_checked_at.is_(None) & (Job.created_at < cutoff)))))


def summaries(query: Select[tuple[Job]]) -> Select[tuple[Job, str]]:
    """``query``'s jobs with their owner's name, without the large columns a summary does not show."""
    return (query.add_columns(User.name).join(User, User.id == Job.owner_id)
            .options(defer(Job.spec), defer(Job.plan), defer(Job.eval_result), defer(Job.log_tail)))


def newest_first(session: Session, limit: int, *, after: str | None = None, statuses: Iterable[str] = (),
                 owner_id: str | None = None, owner_name: str | None = None, model: str | None = None,
                 summary: bool = True) -> list[tuple[Job, str]]:
    """A page of jobs with their owners' names, newest first (ids sort by creation time): those
    before ``after``, of ``statuses``, owned by ``owner_id`` or the user named ``owner_name``, of
    ``model``; without the large columns where ``summary``."""
    query = (summaries(select(Job)) if summary
             else select(Job, User.name).join(User, User.id == Job.owner_id))
    query = query.order_by(Job.id.desc()).limit(limit)
    wanted = [str(s) for s in statuses]
    if wanted:
        query = query.where(Job.status.in_(wanted))
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    if owner_name is not None:
        query = query.where(User.name == owner_name)
    if after is not None:
        query = query.where(Job.id < after)
    if model is not None:
        query = query.where(Job.model == model)
    return list(session.execute(query).tuples())


def queued_of_owner_count() -> Any:
    """How many queued jobs the owner ``:owner_id`` has, counted up to ``:limit``, as a scalar
    subquery (to read beside other columns in one statement)."""
    return select(func.count()).select_from(
        select(Job.id).where(Job.owner_id == bindparam("owner_id"), Job.status == JobStatus.QUEUED)
        .limit(bindparam("limit")).subquery()).scalar_subquery()


# counted up to the limit, as a Core statement: no ORM on the submission's path
_QUEUED_OF_OWNER = select(queued_of_owner_count())


def queued_of_owner(connection: Connection, owner_id: str, up_to: int) -> int:
    """How many queued jobs ``owner_id`` has, counted up to ``up_to``."""
    return int(connection.scalar(_QUEUED_OF_OWNER, {"owner_id": owner_id, "limit": up_to}) or 0)


def count_with_status(session: Session, status: JobStatus) -> int:
    return int(session.scalar(select(func.count()).select_from(Job).where(Job.status == status)) or 0)


def count_by_status(session: Session) -> dict[str, int]:
    return {str(status): int(n) for status, n in session.execute(
        select(Job.status, func.count()).group_by(Job.status))}


def succeeded_hosts(session: Session, host: str | None = None) -> list[str]:
    """The hosts whose workers finished a job successfully (``host`` alone, if it did)."""
    query = select(Job.worker_host).where(Job.status == JobStatus.SUCCEEDED, Job.worker_host.is_not(None))
    if host is not None:
        query = query.where(Job.worker_host == host)
    return sorted({h for h in session.scalars(query.distinct()) if h})


def latest_succeeded_on(session: Session, host: str, limit: int) -> list[Job]:
    """The ``limit`` jobs a worker on ``host`` finished successfully last, newest first."""
    return list(session.scalars(select(Job).where(Job.status == JobStatus.SUCCEEDED, Job.worker_host == host)
                                .order_by(Job.finished_at.desc()).limit(limit)))


def using_dataset(session: Session, dataset_id: str) -> tuple[str, bool] | None:
    """(the newest job that trains or evaluates on the dataset, whether it trains on it), or None."""
    row = session.execute(select(Job.id, Job.dataset_id == dataset_id)
                          .where(or_(Job.dataset_id == dataset_id, Job.eval_dataset_id == dataset_id))
                          .order_by(Job.id.desc()).limit(1)).first()
    return (row[0], bool(row[1])) if row is not None else None
