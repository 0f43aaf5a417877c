"""The launcher: run.json from the stored spec and plan, the environment, one process group per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.db import session_scope
from store.ids import new_id
from store.models import Dataset
from tests.worker.factories import job_plan, job_spec, make_job, make_user
from tunebox.settings import Settings
from worker import launcher
from worker.leasing import Grant

REPO_ROOT = launcher.REPO_ROOT

CPU2 = Grant(gpu_ids=(1, 2), indices=(0, 1), uuids=("cpu-0", "cpu-1"), exclusive=True)
CUDA = Grant(gpu_ids=(7,), indices=(3,), uuids=("GPU-abc",), exclusive=True)


def test_run_file_is_built_from_the_stored_spec_and_plan(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path)
    plan = job_plan(num_gpus=2)
    with session_scope(db_url) as s:
        user = make_user(s)
        ds = Dataset(id=new_id("ds"), owner_id=user.id, name="d", path=str(tmp_path / "d.jsonl"),
                     format="alpaca", num_rows=3, size_bytes=10, sha256="0" * 64)
        s.add(ds)
        s.flush()
        spec = job_spec(dataset={"id": ds.id}, model={"path": "models/tiny"})
        job = make_job(s, user, spec=spec, plan=plan, dataset_id=ds.id)
        run = launcher.build_run_file(s, job, CPU2, settings)
    path = launcher.write_run_file(launcher.job_dir(settings, job.id), run)
    written = json.loads(path.read_text())
    assert written["job_id"] == job.id and written["spec"] == spec
    assert written["resolved"] == plan["resolved"]
    assert written["deepspeed_config"] == plan["deepspeed_config"]
    assert written["dataset_path"] == str(tmp_path / "d.jsonl")
    assert written["model_path"].startswith("/") and written["model_path"].endswith("models/tiny")
    assert written["device"] == "cpu"
    assert written["gpu_memory_limit_bytes"] is None  # nothing to limit on the CPU
    assert path.parent == tmp_path / "jobs" / job.id


def test_run_file_names_the_eval_datasets_file(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path)
    with session_scope(db_url) as s:
        user = make_user(s)
        held = Dataset(id=new_id("ds"), owner_id=user.id, name="held", path=str(tmp_path / "held.jsonl"),
                       format="openai", num_rows=3, size_bytes=10, sha256="1" * 64)
        s.add(held)
        s.flush()
        by_id = make_job(s, user, spec=job_spec(eval={"dataset": {"id": held.id}}), eval_dataset_id=held.id)
        by_path = make_job(s, user, spec=job_spec(eval={"dataset": {"path": str(tmp_path / "e.jsonl")}}))
        neither = make_job(s, user, spec=job_spec())
        paths = [launcher.build_run_file(s, job, CPU2, settings)["eval_dataset_path"]
                 for job in (by_id, by_path, neither)]
    assert paths == [str(tmp_path / "held.jsonl"), str(tmp_path / "e.jsonl"), ""]


def test_every_job_on_a_gpu_is_held_to_its_plan_and_the_tolerance(db_url, tmp_path):
    from planner import plan as make_plan
    from planner.catalogue import lookup

    spec = {"model": {"config": lookup("Qwen/Qwen2.5-0.5B").config}, "method": "lora",
            "training": {"micro_batch_size": 2, "seq_len": 1024},
            "resources": {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none"},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": 80 * 2**30, "host_memory_bytes": 256 * 2**30}}
    planned = make_plan(spec).model_dump(mode="json")
    per_gpu = planned["per_gpu"]
    assert per_gpu["allocator_limit_bytes"] == per_gpu["required_bytes"] - per_gpu["cuda_context_bytes"]
    shared = Grant(gpu_ids=(7,), indices=(3,), uuids=("GPU-abc",), exclusive=False)
    on = Settings(data_dir=tmp_path)
    off = Settings(data_dir=tmp_path, limit_gpu_memory=False)
    card = Settings(data_dir=tmp_path, gpu_memory_limit_bytes=per_gpu["total_bytes"])
    with session_scope(db_url) as s:
        job = make_job(s, make_user(s), plan=planned)
        limits = {name: launcher.build_run_file(s, job, grant, settings)["gpu_memory_limit_bytes"]
                  for name, grant, settings in (("shared", shared, on), ("exclusive", CUDA, on),
                                                ("off", shared, off), ("card", CUDA, card))}
    expected = per_gpu["allocator_limit_bytes"] + int(0.05 * per_gpu["total_bytes"])
    assert limits["shared"] == limits["exclusive"] == expected  # alone on its card or not
    assert limits["off"] is None
    # a box that keeps the rest of each card for other work: never past its per-card limit
    assert limits["card"] == per_gpu["total_bytes"] - per_gpu["cuda_context_bytes"] < expected
    # a plan stored before the field: its total less the memory outside PyTorch's allocator
    old = {"per_gpu": {"total_bytes": 10 * 2**30, "cuda_context_bytes": 2**30}}
    assert launcher.gpu_memory_limit(old, shared, on) == 9 * 2**30 + int(0.05 * 10 * 2**30)
    assert launcher.gpu_memory_limit({"per_gpu": {}}, shared, on) is None
    limited = Settings(data_dir=tmp_path, gpu_memory_limit_bytes=10 * 2**30)
    assert launcher.gpu_memory_limit({"per_gpu": {}}, shared, limited) < 10 * 2**30


def test_environment_names_the_leased_cards(tmp_path):
    settings = Settings(data_dir=tmp_path)
    run = launcher.RunId("job_x", 2, "owner")
    cuda = launcher.base_env(CUDA, settings, run, "train")
    assert (cuda["CUDA_VISIBLE_DEVICES"], cuda["TUNEBOX_EXPECTED_GPU_UUIDS"]) == ("3", "GPU-abc")
    assert cuda["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "DS_ACCELERATOR" not in cuda
    assert cuda["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    cpu = launcher.base_env(CPU2, settings, run, "train")
    assert (cpu["CUDA_VISIBLE_DEVICES"], cpu["DS_ACCELERATOR"]) == ("", "cpu")
    assert (cpu[launcher.ENV_JOB_ID], cpu[launcher.ENV_ATTEMPT]) == ("job_x", "2")


def _deepspeed_parses(arch_list: str | None, monkeypatch) -> bool:
    """Whether DeepSpeed's op builder reads ``arch_list`` as it does before a JIT build."""
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder

    class Probe(CUDAOpBuilder):
        BUILD_VAR, NAME = "DS_BUILD_PROBE", "probe"

        def __init__(self) -> None:
            super().__init__(name=self.NAME)

        def absolute_name(self) -> str:
            return self.NAME

        def sources(self) -> list[str]:
            return []

    if arch_list is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
        return True  # unset: DeepSpeed probes the visible GPUs
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    probe = Probe()
    probe.jit_mode = True
    try:
        probe.compute_capability_args()
    except ValueError:
        return False
    except RuntimeError:  # read as empty: it probes the GPUs, and this machine has none
        return True
    return True


@pytest.mark.parametrize(("host", "passed"), [
    ("9.0a", "9.0"), ("8.0;9.0a 10.0f+PTX", "8.0;9.0;10.0+PTX"), ("9.0;9.0a", "9.0"),
    ("8.6+PTX", "8.6+PTX"), ("", None), ("sm_90", None),
])
def test_the_trainer_gets_an_arch_list_deepspeed_parses(tmp_path, monkeypatch, host, passed):
    assert _deepspeed_parses(host, monkeypatch) is (host in (passed, ""))  # the host's value as it is
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", host)
    env = launcher.base_env(CUDA, Settings(data_dir=tmp_path), launcher.RunId("job_x", 1, "o"), "train")
    assert env.get("TORCH_CUDA_ARCH_LIST") == passed
    assert _deepspeed_parses(env.get("TORCH_CUDA_ARCH_LIST"), monkeypatch)


def test_one_process_per_gpu_in_one_process_group(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, train_module="tests.worker.fake_train")
    with session_scope(db_url) as s:
        job = make_job(s, make_user(s), spec=job_spec(name="fake:long"), plan=job_plan(num_gpus=2))
        run = launcher.build_run_file(s, job, CPU2, settings)
    directory = launcher.job_dir(settings, job.id)
    launcher.write_run_file(directory, run)
    group = launcher.start_training(directory, CPU2, settings, launcher.RunId(job.id, 1, "t"))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_lines(directory / "pids.txt")) < 2:
            time.sleep(0.1)
        rows = sorted(line.split() for line in _lines(directory / "pids.txt"))
        assert {r[1] for r in rows} == {str(group.pgid)}  # every rank in the run's group
        assert sorted(r[2] for r in rows) == ["0", "1"]
        assert group.poll() is None
    finally:
        launcher.terminate(group, 2.0)
    assert not launcher.group_alive(group.pgid)
    assert group.poll() is not None and group.peak_rss_bytes


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_deepspeed_launcher_runs_the_training_in_the_runs_group(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, train_module="tests.worker.fake_train",
                        use_deepspeed_launcher=True)
    one = Grant(gpu_ids=(1,), indices=(0,), uuids=("cpu-0",), exclusive=True)
    with session_scope(db_url) as s:
        job = make_job(s, make_user(s), spec=job_spec(name="fake:ok"))
        run = launcher.build_run_file(s, job, one, settings)
    directory = launcher.job_dir(settings, job.id)
    launcher.write_run_file(directory, run)
    group = launcher.start_training(directory, one, settings, launcher.RunId(job.id, 1, "t"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and group.poll() is None:
        time.sleep(0.2)
    assert group.poll() == 0, (directory / "train.log").read_text()[-2000:]
    pid, pgid, rank = _lines(directory / "pids.txt")[0].split()
    assert (int(pgid), rank) == (group.pgid, "0") and int(pid) != group.pgid
    assert '"type": "done"' in (directory / "progress.jsonl").read_text()


ORPHAN_PROBE = r"""
import json, os, subprocess, sys, time
from pathlib import Path
import psutil
from worker import launcher

work = Path(sys.argv[1])
# the rank starts a child that outlives it, then exits at once
rank = ("import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5)']); "
        "print(p.pid, flush=True)")
group = launcher._spawn([([sys.executable, "-c", rank], dict(os.environ))], work, work / "log")
deadline = time.monotonic() + 20
while group.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
orphan = int((work / "log").read_text().split()[0])
parent = psutil.Process(orphan).ppid() if psutil.pid_exists(orphan) else None
while psutil.pid_exists(orphan) and time.monotonic() < deadline:
    group.poll()
    time.sleep(0.05)
print(json.dumps({"me": os.getpid(), "orphan_parent": parent, "gone": not psutil.pid_exists(orphan),
                  "group_gone": not launcher.group_alive(group.pgid)}))
"""


def test_a_ranks_orphans_are_reparented_to_the_worker_and_reaped_there(tmp_path):
    # where PID 1 does not reap (a container's entry point), an orphan would otherwise stay a zombie
    # in the run's process group; its own process, so the test runner does not become a subreaper
    out = subprocess.run([sys.executable, "-c", ORPHAN_PROBE, str(tmp_path)], cwd=REPO_ROOT, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["orphan_parent"] == probe["me"]
    assert probe["gone"] and probe["group_gone"]


def test_nvme_offload_writes_into_a_folder_of_the_jobs_own() -> None:
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}}}
    moved = launcher.with_job_swap(config, "job_1")
    zero = moved["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": "/nvme/job_1", "pin_memory": True}
    assert zero["offload_param"] == config["zero_optimization"]["offload_param"]
    assert config["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/nvme"  # the plan's, untouched
    assert launcher.job_swap_dirs(moved) == [Path("/nvme/job_1")]
    assert launcher.job_swap_dirs(config | {"zero_optimization": {"stage": 2}}) == []
    assert launcher.with_job_swap({"train_batch_size": 1}, "job_1") == {"train_batch_size": 1}


def test_a_jobs_resident_memory_leaves_an_op_builds_compilers_out(tmp_path: Path) -> None:
    """The worker's RSS sample of a run's processes counts the ranks, not the compilers a DeepSpeed op
    build runs under them."""
    import shutil

    import psutil

    hold = "import time; b = bytearray(64 << 20); time.sleep(30)"
    compiler = tmp_path / "cc1plus"  # a compiler as large as the rank
    shutil.copy(os.path.realpath(sys.executable), compiler)
    rank = subprocess.Popen([sys.executable, "-c", hold])
    build = subprocess.Popen([str(compiler), "-c", hold], env={**os.environ, "PYTHONHOME": sys.base_prefix})
    try:
        time.sleep(0.5)
        procs = [psutil.Process(rank.pid), psutil.Process(build.pid)]
        assert procs[1].name() == "cc1plus" and procs[1].memory_info().rss > 64 << 20
        counted = launcher.group_rss_bytes(procs)
        assert counted == pytest.approx(procs[0].memory_info().rss, rel=0.05)
        assert counted > 64 << 20
    finally:
        rank.kill()
        build.kill()
        rank.wait()
        build.wait()
