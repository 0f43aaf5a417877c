"""Hostile or careless input: paths out of the roots, shell metacharacters, compressed bodies, GPU limits.

What tests/api already covers (``..``/absolute/URL model paths, dataset size, schema and UTF-8
errors, rate limits, body size) is not repeated here; these fill the gaps.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from store.db import session_scope
from store.models import Dataset, Job, User
from tests.api.conftest import SMALL_CONFIG, Env, build_env, job_spec
from tests.reliability.support import TERMINAL, Stack, job_processes, lora_spec, submit
from tests.tinydata import alpaca_rows, write_dataset
from tests.worker.harness import REPO, wait_for, wait_job
from tunebox import gpus

PROBLEM = "application/problem+json"
GIB = 2**30


@pytest.fixture(scope="module")
def api_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-roots")
    models, data, outside, nvme = base / "models", base / "data", base / "outside", base / "nvme"
    for folder in (models / "small", outside, nvme):
        folder.mkdir(parents=True)
    (models / "small" / "config.json").write_text(json.dumps(SMALL_CONFIG))
    (outside / "config.json").write_text(json.dumps(SMALL_CONFIG))
    write_dataset(data / "train.jsonl", "alpaca", n=12)
    write_dataset(outside / "secret.jsonl", "alpaca", n=12)
    os.symlink(outside, models / "link-out")  # a link inside a root pointing out of it
    os.symlink(outside / "secret.jsonl", data / "link-out.jsonl")
    return {"models": models, "data": data, "outside": outside, "nvme": nvme}


@pytest.fixture
def api(pg_url: str, api_roots: dict[str, Path], tmp_path: Path) -> Iterator[Env]:
    yield from build_env(pg_url, (api_roots["models"], api_roots["data"]), tmp_path,
                         nvme_path=api_roots["nvme"], nvme_bytes=2**40, max_gpus_per_user=2)


def _refused(env: Env, path: str, body: dict[str, Any], field: str) -> None:
    res = env.client.post(path, json=body, headers=env.auth())
    assert res.status_code == 422, res.text
    assert res.headers["content-type"] == PROBLEM
    assert field in [e["field"] for e in res.json()["errors"]], res.json()


def _escapes(roots: dict[str, Path], name: str) -> list[str]:
    return [f"../outside/{name}", str(roots["outside"] / name), "link-out" if name == "config.json" else
            "link-out.jsonl", f"file://{roots['outside'] / name}", "https://example.com/x", "s3://bucket/x",
            "//server/share/x", "~/x", f"{roots['data']}/../outside/{name}"]


@pytest.mark.parametrize("index", range(9))
def test_model_and_dataset_paths_out_of_their_roots_are_refused(api: Env, api_roots: dict[str, Path],
                                                                index: int) -> None:
    model = _escapes(api_roots, "config.json")[index].replace("/config.json", "")
    dataset = _escapes(api_roots, "secret.jsonl")[index]
    _refused(api, "/v1/jobs", job_spec(model={"path": model}), "model.path")
    _refused(api, "/v1/plans", job_spec(model={"path": model}), "model.path")
    _refused(api, "/v1/jobs", job_spec(dataset={"path": dataset}), "dataset.path")
    assert api.count(Job) == 0 and api.enqueued.calls == []


WHAT_IF = {"gpu_count": 4, "gpu_memory_bytes": 80 * GIB, "host_memory_bytes": 512 * GIB, "nvme_bytes": 2**40}
NVME = {"zero_stage": 3, "offload_optimizer": "nvme", "num_gpus": 1}


def _nvme_path(job: dict[str, Any]) -> str:
    return str(job["plan"]["deepspeed_config"]["zero_optimization"]["offload_optimizer"]["nvme_path"])


def test_nvme_swap_folder_is_confined_to_the_boxs(api: Env, api_roots: dict[str, Path]) -> None:
    """NVMe offload writes where the spec says: a spec naming another folder could write anywhere."""
    elsewhere = {"offload_optimizer": {"nvme_path": str(api_roots["outside"])}}
    _refused(api, "/v1/jobs", job_spec(hardware=WHAT_IF, resources={**NVME, "deepspeed": elsewhere}),
             "resources.deepspeed.offload_optimizer.nvme_path")
    _refused(api, "/v1/jobs", job_spec(hardware={**WHAT_IF, "nvme_path": "/etc"}, resources=NVME),
             "hardware.nvme_path")
    assert api.count(Job) == 0
    # what-if planning writes nothing: any folder may be named there
    plan = api.client.post("/v1/plans", json=job_spec(hardware={**WHAT_IF, "nvme_path": "/etc"},
                                                      resources=NVME), headers=api.auth())
    assert plan.status_code == 200, plan.text

    inside = {"offload_optimizer": {"nvme_path": str(api_roots["nvme"])}}
    named = api.submit(hardware=WHAT_IF, resources={**NVME, "deepspeed": inside})
    assert _nvme_path(named) == str(api_roots["nvme"])
    default = api.submit(name="default-nvme", hardware={**WHAT_IF, "nvme_path": None}, resources=NVME)
    assert _nvme_path(default) == str(api_roots["nvme"])  # the box's folder, not a made-up one
    problem = gpus.nvme_offload_problem()  # DeepSpeed's own check of its async I/O op on this box
    if problem is None:
        on_the_box = api.submit(name="box-nvme", resources=NVME)
        assert _nvme_path(on_the_box) == str(api_roots["nvme"])
    else:  # a job for this box that needs NVMe offload is refused at plan time, saying why
        res = api.client.post("/v1/jobs", json=job_spec(name="box-nvme", resources=NVME), headers=api.auth())
        assert res.status_code == 422, res.text
        [error] = [e for e in res.json()["errors"] if e["field"] == "resources.offload_optimizer"]
        assert problem in error["message"]
        plan = api.client.post("/v1/plans", json=job_spec(resources={"zero_stage": 3}), headers=api.auth())
        assert plan.status_code == 200 and plan.json()["nvme"]["capacity_bytes"] == 0


def test_job_needing_more_gpus_than_its_owner_may_hold_is_refused(api: Env) -> None:
    four = job_spec(hardware=WHAT_IF, resources={"num_gpus": 4})
    _refused(api, "/v1/jobs", four, "resources.num_gpus")  # the box-wide limit is 2
    with session_scope(api.url) as s:
        s.execute(update(User).where(User.name == "alice").values(max_gpus=1))
    api.client.app.state.token_cache.clear()
    _refused(api, "/v1/jobs", job_spec(hardware=WHAT_IF, resources={"num_gpus": 2}), "resources.num_gpus")
    assert api.count(Job) == 0
    two = api.client.post("/v1/jobs", json=job_spec(hardware=WHAT_IF, resources={"num_gpus": 2}),
                          headers=api.auth("bob"))
    assert two.status_code == 201, two.text


def _jsonl(n: int) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in alpaca_rows(n)).encode()


def test_compressed_bodies_are_refused_unread(api: Env) -> None:
    bomb = gzip.compress(b"\n" * (200 * 2**20))  # 200 MiB of newlines in ~200 KiB
    cases = [("/v1/datasets", gzip.compress(_jsonl(3)), "gzip"), ("/v1/datasets", bomb, "gzip"),
             ("/v1/datasets", _jsonl(3), "br"), ("/v1/jobs", gzip.compress(json.dumps(job_spec()).encode()),
                                                 "gzip, identity")]
    for path, body, encoding in cases:
        res = api.client.post(path, content=body, headers={**api.auth(), "Content-Encoding": encoding,
                                                           "Content-Type": "application/json"})
        assert res.status_code == 415, res.text
        assert res.headers["content-type"] == PROBLEM and res.headers["accept-encoding"] == "identity"
        assert res.json()["errors"][0]["field"] == "Content-Encoding"
    assert api.count(Dataset) == 0 and api.count(Job) == 0
    plain = api.client.post("/v1/datasets", content=_jsonl(3), headers={**api.auth(),
                                                                        "Content-Encoding": "identity"})
    assert plain.status_code == 201


def test_uploads_over_the_row_limit_or_not_utf8_are_422_naming_where(pg_url: str, api_roots: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    for env in build_env(pg_url, (api_roots["models"], api_roots["data"]), tmp_path, max_dataset_rows=5):
        many = env.client.post("/v1/datasets", content=_jsonl(6), headers=env.auth())
        assert many.status_code == 422 and "more than 5 rows" in many.json()["detail"]
        bad = _jsonl(2) + b'{"instruction": "caf\xe9", "input": "", "output": "x"}\n'
        res = env.client.post("/v1/datasets", content=bad, headers=env.auth())
        assert res.status_code == 422 and res.headers["content-type"] == PROBLEM
        assert "UTF-8" in res.json()["detail"] and "line 3" in res.json()["detail"]
        assert env.count(Dataset) == 0
        assert not [p for p in (tmp_path / "datasets").iterdir()]  # no spooled upload left behind


# --------------------------------------------------------------------------- no shell


PACKAGES = ("api", "worker", "store", "tunebox", "planner")
SHELL_CALLS = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
               "asyncio.create_subprocess_shell", "os.spawnlp", "os.spawnvp", "os.execlp", "os.execvp"}
PROCESS_CALLS = {"subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
                 "subprocess.check_output", "asyncio.create_subprocess_exec", "os.execv", "Popen"}


def _calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """Each call with its dotted name (``subprocess.run``; a bare ``Popen``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                yield f"{func.value.id}.{func.attr}", node
            elif isinstance(func, ast.Name):
                yield func.id, node


def test_no_process_is_started_through_a_shell() -> None:
    starts = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name, call in _calls(ast.parse(path.read_text(), str(path))):
                where = f"{path.relative_to(REPO)}:{call.lineno}"
                assert name not in SHELL_CALLS, f"{where}: {name} runs a shell"
                for kw in call.keywords:
                    assert not (kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                           and kw.value.value is False)), f"{where}: shell="
                if name in PROCESS_CALLS and call.args:
                    assert not isinstance(call.args[0], ast.Constant | ast.JoinedStr | ast.BinOp), \
                        f"{where}: a command line as one string"
                    starts.append(where)
    assert any(s.startswith("worker/launcher.py") for s in starts)  # the scan sees the launcher


@pytest.mark.slow
def test_shell_metacharacters_in_a_spec_are_inert(fake_stack: Stack, roots: dict[str, Path]) -> None:
    marker = f"pwned-{secrets.token_hex(4)}"
    evil = f"$(touch {marker}) `touch {marker}`; touch {marker} && echo >{marker} | cat '\" #"
    dataset = roots["data"] / f"x;$(touch {marker});`touch {marker}`.jsonl"
    write_dataset(dataset, "alpaca", n=12)
    spec = {**lora_spec(f"fake:{evil}", max_steps=25, save_steps=100), "dataset": {"path": dataset.name}}
    with fake_stack.client() as client:
        job_id = submit(client, spec)
        procs = wait_for(lambda: job_processes(job_id), 30, "the training process")
        argv = procs[0].cmdline()
        done = wait_job(client, job_id, TERMINAL, 60, *fake_stack.workers)
    job_dir = fake_stack.job_dir(job_id)
    assert done["status"] == "succeeded" and done["name"] == f"fake:{evil}"
    assert argv[1:] == ["-m", "tests.worker.fake_train", "--job-dir", str(job_dir)]
    run = json.loads((job_dir / "run.json").read_text())
    assert run["dataset_path"] == str(dataset) and run["spec"]["name"] == f"fake:{evil}"
    for folder in (job_dir, fake_stack.data_dir, roots["base"], REPO, Path.cwd(), Path("/tmp")):
        assert not list(folder.rglob(f"{marker}*")) if folder == job_dir else not (folder / marker).exists()
