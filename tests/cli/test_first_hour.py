"""A new user's first hour with the real ``tunebox`` command (a subprocess): every mistake is one
line on standard error and a non-zero exit, never a traceback; a closed pipe is not an error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from api.app import create_app
from store.db import session_scope
from store.models import User
from tests.api.conftest import Env, job_spec, serve_in_thread
from tests.conftest import create_pg_database, drop_pg_database

TIMEOUT_S = 120


def tunebox(*args: str, env: dict[str, str] | None = None,
            **kwargs: object) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TUNEBOX_")}
    return subprocess.run([sys.executable, "-m", "tunebox.cli", *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)  # type: ignore[call-overload]


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error"), res.stderr
    return lines[0]


@pytest.fixture
def live(pg_env: Env) -> Iterator[tuple[Env, dict[str, str]]]:
    """A real server, and the environment that points the command at it as alice."""
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0)
    with serve_in_thread(app) as url:
        yield pg_env, {"TUNEBOX_URL": url, "TUNEBOX_TOKEN": pg_env.tokens["alice"]}


def test_token_before_the_first_serve_makes_the_embedded_database(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "tunebox"  # no folder yet, as on a new machine
    res = tunebox("token", "create", "alice", env={"TUNEBOX_DATA_DIR": str(data)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith("tb_") and "Traceback" not in res.stderr
    with session_scope(f"sqlite:///{data / 'tunebox.db'}") as session:
        assert session.scalars(select(User.name)).all() == ["alice"]
    again = tunebox("token", "create", "bob", env={"TUNEBOX_DATA_DIR": str(data)})
    assert again.returncode == 0, again.stderr


def test_token_on_an_unmigrated_postgres_names_the_command_to_run() -> None:
    url = create_pg_database("tunebox_cli_empty")
    try:
        line = one_error_line(tunebox("token", "create", "alice", env={"TUNEBOX_DATABASE_URL": url}))
        assert "`tunebox db upgrade`" in line and url.rsplit("/", 1)[1] in line
    finally:
        drop_pg_database(url)
    gone = one_error_line(tunebox("token", "create", "alice", env={"TUNEBOX_DATABASE_URL": url}))
    assert "cannot open the database" in gone and "does not exist" in gone


def test_spec_file_mistakes_are_one_line(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\nmodel: {path: [small\n")
    a_list = tmp_path / "list.yaml"
    a_list.write_text("- 1\n- 2\n")
    cases = {str(tmp_path / "missing.yaml"): "no such file", str(bad_yaml): "not valid YAML or JSON: line",
             str(a_list): "a job spec is a mapping", str(tmp_path): "is a folder"}
    for path, message in cases.items():
        for command in ("submit", "plan"):
            line = one_error_line(tunebox(command, path, env={"TUNEBOX_URL": "http://127.0.0.1:1"}))
            assert path in line and message in line, line


def test_a_missing_server_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec()))
    for args in (("jobs",), ("show", "job_x"), ("submit", str(spec))):
        line = one_error_line(tunebox(*args, env={"TUNEBOX_URL": "http://127.0.0.1:1", "TUNEBOX_TOKEN": "t"}))
        assert "cannot reach http://127.0.0.1:1" in line and "TUNEBOX_URL" in line


def test_a_bad_or_missing_token_is_one_line_saying_how_to_get_one(live: tuple[Env, dict[str, str]]) -> None:
    _, env = live
    bad = one_error_line(tunebox("jobs", env={**env, "TUNEBOX_TOKEN": "tb_nope"}))
    assert "error 401" in bad and "unknown or revoked" in bad and "tunebox token create" in bad
    missing = one_error_line(tunebox("jobs", env={"TUNEBOX_URL": env["TUNEBOX_URL"]}))
    assert "error 401" in missing and "TUNEBOX_TOKEN" in missing


def test_a_closed_pipe_ends_quietly(live: tuple[Env, dict[str, str]]) -> None:
    server, env = live
    job_id = server.submit()["id"]
    for args in (("show", job_id, "--json"), ("jobs",)):
        proc = subprocess.Popen([sys.executable, "-m", "tunebox.cli", *args], env={**os.environ, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first write, as `| head -0` would be
        err = proc.stderr.read().decode()
        assert proc.wait(TIMEOUT_S) == 0, err
        assert err == "", err


def test_submit_prints_the_id_then_the_plan_and_its_warnings(live: tuple[Env, dict[str, str]],
                                                            tmp_path: Path) -> None:
    _, env = live
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(job_spec(training={"max_steps": 10, "seq_len": 512, "precision": "fp32"})))
    res = tunebox("submit", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith("job_") and len(res.stdout.splitlines()) == 1  # scripts read it
    err = res.stderr
    assert err.startswith("fits: yes") and "setup: lora, ZeRO-" in err and "peak (" in err
    assert "tokens/s" in err and "duration" in err
    assert "warning: fp32 training doubles weights" in err
