"""Starting and stopping a job's processes: the training ranks and the separate evaluation.

Each run gets its own process group, so one signal reaches every rank and every
child they spawn, and nothing outlives a cancel. Commands are argument lists, never a shell line.
The job's folder ``DATA_DIR/jobs/<job_id>/`` holds ``run.json`` (what to run, built from the stored
spec and plan), ``progress.jsonl`` (what the training reports), ``train.log`` and ``eval/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunebox.gpus import device_of_uuids
from worker.leasing import Grant

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from store.models import Job
    from tunebox.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
RESOLVED_KEYS = ("micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "zero_stage",
                 "offload_optimizer", "offload_param", "num_gpus", "precision", "loss_chunk_tokens",
                 "attn_implementation")
# environment markers that let the reconciler find a job's processes after a worker dies
ENV_JOB_ID = "TUNEBOX_JOB_ID"
ENV_OWNER = "TUNEBOX_PROCESS_OWNER"
ENV_ROLE = "TUNEBOX_PROCESS_ROLE"
ENV_ATTEMPT = "TUNEBOX_JOB_ATTEMPT"


@dataclass(frozen=True)
class RunId:
    """Which run of which job a process belongs to, and whose (host and database) it is."""

    job_id: str
    attempt: int
    owner: str


@dataclass
class ProcessGroup:
    """The processes of one run, all in process group ``pgid``."""

    procs: list[subprocess.Popen[bytes]]
    pgid: int
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    peak_rss: dict[int, int] = field(default_factory=dict)

    def poll(self) -> int | None:
        """None while every rank runs; else the first failing exit code (0 when all succeeded)."""
        codes = [self._reap(p) for p in self.procs]
        if any(c is not None for c in codes):  # a process is orphaned only once its rank is gone
            self.reap_orphans()
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in codes else 0

    def reap_orphans(self) -> None:
        """Reap the group's dead processes that were re-parented to this one (a rank's own children,
        once the rank is gone; see ``_become_subreaper``); the ranks themselves are ``_reap``'s."""
        import psutil

        own = {p.pid for p in self.procs}
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for child in children:
            if child.pid in own:
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if child.status() == psutil.STATUS_ZOMBIE and os.getpgid(child.pid) == self.pgid:
                    os.waitpid(child.pid, os.WNOHANG)

    def settle(self, timeout_s: float = 5.0) -> None:
        """After the run has ended: reap its dead orphans until its process group is gone (or only
        live members remain after ``timeout_s``, which ``terminate`` deals with)."""
        end = time.monotonic() + timeout_s
        while _group_exists(self.pgid) and not group_alive(self.pgid) and time.monotonic() < end:
            self.poll()
            time.sleep(0.02)

    def _reap(self, proc: subprocess.Popen[bytes]) -> int | None:
        """``poll()`` through ``wait4``, which also yields the kernel's peak RSS of the process."""
        if proc.returncode is not None:
            return proc.returncode
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return proc.poll()
        if pid == 0:
            return None
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.peak_rss[proc.pid] = int(usage.ru_maxrss) * 1024  # KiB on Linux
        return proc.returncode

    @property
    def peak_rss_bytes(self) -> int | None:
        """Sum over the exited ranks of each one's peak resident memory (the kernel's figure)."""
        return sum(self.peak_rss.values()) if self.peak_rss else None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


def job_dir(settings: Settings, job_id: str) -> Path:
    return settings.data_dir / "jobs" / job_id


def owner_tag(settings: Settings, host: str) -> str:
    """Marks processes started by workers of this host for this database (and no other)."""
    digest = hashlib.sha256(settings.resolved_database_url.encode()).hexdigest()[:16]
    return f"{host}:{digest}"


# --------------------------------------------------------------------------- run.json


def device_of(grant: Grant) -> str:
    return device_of_uuids(grant.uuids)


def build_run_file(session: Session, job: Job, grant: Grant, settings: Settings) -> dict[str, Any]:
    """What the training process needs, from the stored spec and plan."""
    plan = job.plan or {}
    resolved = plan.get("resolved") or {}
    return {
        "job_id": job.id,
        "spec": job.spec,
        "model_path": _abs((job.spec.get("model") or {}).get("path") or ""),
        "dataset_path": _abs(_dataset_path(session, job)),
        "eval_dataset_path": _abs(_source_path(session, (job.spec.get("eval") or {}).get("dataset"),
                                               job.eval_dataset_id)),
        "resolved": {k: resolved.get(k) for k in RESOLVED_KEYS},
        "deepspeed_config": with_job_swap(plan.get("deepspeed_config") or {}, job.id),
        "device": device_of(grant),
        "gpu_memory_limit_bytes": gpu_memory_limit(plan, grant, settings),
    }


def _nvme_blocks(ds_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The config's offload blocks that swap to an NVMe folder, by name."""
    zero = ds_config.get("zero_optimization")
    if not isinstance(zero, dict):
        return {}
    return {name: block for name in ("offload_optimizer", "offload_param")
            if isinstance(block := zero.get(name), dict) and block.get("device") == "nvme"
            and block.get("nvme_path")}


def with_job_swap(ds_config: dict[str, Any], job_id: str) -> dict[str, Any]:
    """The DeepSpeed config with each NVMe offload's swap folder moved into a folder of the job's own
    under the plan's ``nvme_path``: two jobs on one box never share swap files, and the worker
    removes the job's when its run ends (``job_swap_dirs``). A checkpoint carries a copy of the
    optimizer's swap files, so a resumed run needs none of the old ones."""
    blocks = _nvme_blocks(ds_config)
    if not blocks:
        return ds_config
    moved = {name: {**block, "nvme_path": str(Path(block["nvme_path"]) / job_id)}
             for name, block in blocks.items()}
    return {**ds_config, "zero_optimization": {**ds_config["zero_optimization"], **moved}}


def job_swap_dirs(ds_config: dict[str, Any]) -> list[Path]:
    """The NVMe swap folders a run's DeepSpeed config writes into."""
    return sorted({Path(block["nvme_path"]) for block in _nvme_blocks(ds_config).values()})


def gpu_memory_limit(plan: dict[str, Any], grant: Grant, settings: Settings) -> int | None:
    """The limit on PyTorch's allocator per GPU: the plan's ``allocator_limit_bytes`` plus the
    tolerance on the planned peak, on every card, shared or not (the plan is a promise), and never
    past the box's per-card limit. A plan that states no peak is held to the per-card limit, where
    the box sets one, less the memory outside PyTorch; ``None`` (no limit) on the CPU or with the
    limit turned off."""
    if not settings.limit_gpu_memory or device_of(grant) != "cuda":
        return None
    per_gpu = plan.get("per_gpu") or {}
    total = per_gpu.get("total_bytes")
    outside = int(per_gpu.get("cuda_context_bytes") or 0)
    card = settings.gpu_memory_limit_bytes
    if not total:
        from planner.constants import CUDA_CONTEXT_BYTES

        return card - CUDA_CONTEXT_BYTES if card and card > CUDA_CONTEXT_BYTES else None
    limit = per_gpu.get("allocator_limit_bytes")
    if limit is None:  # a plan stored before the field
        limit = int(total) - outside
    limit = int(limit) + int(settings.gpu_memory_tolerance * int(total))
    if card:
        limit = min(limit, card - outside)
    return limit if limit > 0 else None


def _dataset_path(session: Session, job: Job) -> str:
    return _source_path(session, job.spec.get("dataset"), job.dataset_id)


def _source_path(session: Session, source: dict[str, Any] | None, stored_id: str | None) -> str:
    """The file a spec's data source names: its path, or the stored dataset's ("" for none)."""
    source = source or {}
    if source.get("path"):
        return str(source["path"])
    from store.models import Dataset

    ds_id = stored_id or source.get("id")
    row = session.get(Dataset, ds_id) if ds_id else None
    return row.path if row is not None else ""


def _abs(path: str) -> str:
    # an empty path stays empty: the training reports it as the user's error, with the field named
    return str(Path(path).expanduser().absolute()) if path else ""


def write_run_file(directory: Path, run: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "eval").mkdir(exist_ok=True)
    path = directory / "run.json"
    tmp = directory / ".run.json.tmp"
    tmp.write_text(json.dumps(run, indent=2))
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- environment


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: ports the rendezvous takes from, just below the kernel's ephemeral range
_RENDEZVOUS_PORTS = 8192


def _ephemeral_low() -> int | None:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    """A port for a run's rendezvous (``MASTER_PORT``) that is free now and that the kernel will not
    hand to some other process's outgoing connection before the run binds it: one below the
    ephemeral range, where only explicit binds land (a port bound and released in the ephemeral
    range was taken by another job's connections in between: EADDRINUSE at init_process_group)."""
    low = _ephemeral_low()
    if low is not None and low > _RENDEZVOUS_PORTS + 1024:
        first = low - _RENDEZVOUS_PORTS
        start = int.from_bytes(os.urandom(2), "big") % _RENDEZVOUS_PORTS
        for i in range(_RENDEZVOUS_PORTS):
            port = first + (start + i) % _RENDEZVOUS_PORTS
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_ARCH = re.compile(r"^(\d+)\.(\d+)[a-z]?(\+PTX)?$")


def deepspeed_arch_list(value: str | None) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed's op builder parses, or None (unset: it probes
    the visible GPUs). Hopper and Blackwell images set arch-specific entries (``9.0a``, ``10.0f``)
    that its numeric sort cannot read; the ops it builds use no arch-specific feature, so the plain
    architecture builds the same kernels."""
    if value is None:
        return None
    out: list[str] = []
    for entry in value.replace(" ", ";").split(";"):
        match = _ARCH.match(entry.strip())
        if match is not None:
            arch = f"{match[1]}.{match[2]}{match[3] or ''}"
            if arch not in out:
                out.append(arch)
    return ";".join(out) or None


def extensions_dir(settings: Settings) -> Path:
    """The box's cache of DeepSpeed's compiled ops."""
    return settings.torch_extensions_dir or settings.data_dir / "torch_extensions"


def ops_env(settings: Settings, device: str) -> dict[str, str]:
    """The environment in which a process on ``device`` builds and loads DeepSpeed's ops: the box's
    extensions cache, the accelerator, an arch list DeepSpeed parses."""
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    extensions = extensions_dir(settings)
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(extensions),
    })
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DS_ACCELERATOR"] = "cpu"
        return env
    # the lease decides the device: a DS_ACCELERATOR=cpu left in the worker's environment would
    # silently train a GPU job on the CPU
    env.pop("DS_ACCELERATOR", None)
    arch = deepspeed_arch_list(env.get("TORCH_CUDA_ARCH_LIST"))
    if arch is None:
        env.pop("TORCH_CUDA_ARCH_LIST", None)
    else:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def base_env(grant: Grant, settings: Settings, run: RunId, role: str) -> dict[str, str]:
    env = ops_env(settings, device_of(grant))
    env.update({
        "TUNEBOX_EXPECTED_GPU_UUIDS": ",".join(grant.uuids),
        ENV_JOB_ID: run.job_id, ENV_ATTEMPT: str(run.attempt), ENV_OWNER: run.owner, ENV_ROLE: role,
    })
    if device_of(grant) == "cuda":
        # NVML numbers cards by PCI bus; CUDA's default order is "fastest first"
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in grant.indices)
    return env


def start_prebuild(settings: Settings, device: str) -> subprocess.Popen[bytes] | None:
    """Build (or load) ``settings.prebuild_ops`` in a background process (``worker.prebuild``),
    logged to ``DATA_DIR/prebuild.log``; None when there is nothing to build."""
    if not settings.prebuild_ops:
        return None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with (settings.data_dir / "prebuild.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "worker.prebuild", *settings.prebuild_ops],
                                env=ops_env(settings, device), cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_prebuild(proc: subprocess.Popen[bytes], settings: Settings, grace_s: float = 5.0) -> None:
    """Stop a prebuild that is still running (its compilers included: it leads its own session),
    and remove the build locks it held, which would otherwise hold up the next build of those ops
    until a trainer's sweeper finds them stale."""
    if proc.poll() is not None:
        return
    from worker._trainlib.extlocks import held_by

    locks = held_by(extensions_dir(settings), proc.pid)
    terminate_pgid(proc.pid, grace_s, reap=proc.poll)
    for lock in locks:
        lock.unlink(missing_ok=True)


def rank_env(env: dict[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


# --------------------------------------------------------------------------- processes


def start_training(directory: Path, grant: Grant, settings: Settings, run: RunId) -> ProcessGroup:
    """One process per leased GPU (or the ``deepspeed`` launcher), all in one new process group."""
    env = base_env(grant, settings, run, "train")
    world, port = max(1, len(grant.indices)), free_port()
    log_path = directory / "train.log"
    if settings.use_deepspeed_launcher:
        # the launcher sets CUDA_VISIBLE_DEVICES and the rank variables itself, from --include
        argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", str(port),
                "--include", "localhost:" + ",".join(str(i) for i in grant.indices), "--no_local_rank",
                "--module", settings.train_module, "--job-dir", str(directory)]
        if device_of(grant) == "cuda":
            env.pop("CUDA_VISIBLE_DEVICES", None)
        return _spawn([(capped(argv, settings), env)], directory, log_path)
    argv = capped([sys.executable, "-m", settings.train_module, "--job-dir", str(directory)], settings)
    return _spawn([(argv, rank_env(env, r, world, port)) for r in range(world)], directory, log_path)


def start_eval(directory: Path, checkpoint: str, grant: Grant, settings: Settings,
               run: RunId) -> ProcessGroup:
    """The evaluation as its own process (and group): its crash or OOM cannot take the training."""
    env = base_env(grant, settings, run, "eval")
    if device_of(grant) == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(grant.indices[0])
    argv = [sys.executable, "-m", settings.eval_module, "--job-dir", str(directory),
            "--checkpoint", checkpoint]
    return _spawn([(capped(argv, settings), env)], directory, directory / "eval.log")


def capped(argv: list[str], settings: Settings) -> list[str]:
    """``argv`` under the per-process address-space cap (``job_address_space_bytes``), if one is set."""
    limit = settings.job_address_space_bytes
    if not limit:
        return argv
    return [sys.executable, "-m", "worker.rlimit", "--address-space", str(limit), "--", *argv]


_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False


def _become_subreaper() -> None:
    """Have orphans of a run's processes re-parented to this process instead of to PID 1, so that
    ``ProcessGroup.reap_orphans`` reaps them. Where PID 1 does not reap (a container's entry point,
    a sandbox's supervisor), they would otherwise stay in the run's process group as zombies."""
    global _subreaper
    if _subreaper or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _spawn(commands: list[tuple[list[str], dict[str, str]]], cwd: Path, log_path: Path) -> ProcessGroup:
    _become_subreaper()
    procs: list[subprocess.Popen[bytes]] = []
    with log_path.open("ab") as log:
        for argv, env in commands:
            group: dict[str, Any]
            if not procs:
                # a new session detaches the run from the worker's terminal and signals; but a
                # process may only join a group of its own session, so several ranks share a new
                # group in the worker's session instead
                group = {"start_new_session": True} if len(commands) == 1 else {"process_group": 0}
            else:
                group = {"process_group": procs[0].pid}
            procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, close_fds=True, **group))
    return ProcessGroup(procs=procs, pgid=procs[0].pid, log_path=log_path)


def group_alive(pgid: int) -> bool:
    """Whether a live process of the group remains (a zombie waiting to be reaped is not one)."""
    return _group_exists(pgid) and not _only_zombies(pgid)


def terminate(group: ProcessGroup, grace_s: float) -> None:
    """SIGTERM to the whole group, SIGKILL after ``grace_s``; returns when no process remains."""
    terminate_pgid(group.pgid, grace_s, reap=group.poll)
    group.settle()


def _group_exists(pgid: int) -> bool:
    """Whether any process, a zombie included, is still in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate_pgid(pgid: int, grace_s: float, reap: Callable[[], object] | None = None) -> None:
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive_after_reap(pgid, reap):
        time.sleep(0.1)
    if _alive_after_reap(pgid, reap):
        _signal_group(pgid, signal.SIGKILL)
        end = time.monotonic() + 10
        while time.monotonic() < end and _alive_after_reap(pgid, reap):
            time.sleep(0.05)


def _alive_after_reap(pgid: int, reap: Callable[[], object] | None) -> bool:
    if reap is not None:
        reap()  # a dead child of ours stays a zombie (and a group member) until we reap it
    return group_alive(pgid)


def _only_zombies(pgid: int) -> bool:
    """True when the group holds nothing but zombies (dead, waiting to be reaped)."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.status())
    return all(s == psutil.STATUS_ZOMBIE for s in members)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_processes(group: ProcessGroup) -> list[Any]:
    """The run's processes and all their children (psutil objects)."""
    import psutil

    out: list[Any] = []
    for pid in group.pids:
        with contextlib.suppress(psutil.Error, OSError):
            root = psutil.Process(pid)
            out.extend([root, *root.children(recursive=True)])
    return out


#: the programs a DeepSpeed op's build runs under the rank that needs it: their memory is the build's,
#: not the job's
BUILD_PROGRAMS = frozenset({"ninja", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "cc1plus",
                            "cc1", "c++", "g++", "gcc", "cc", "as", "ld", "collect2"})


def group_rss_bytes(procs: list[Any]) -> int:
    """Resident memory of these processes right now, an op build's compilers left out."""
    import psutil

    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            if proc.name() not in BUILD_PROGRAMS:
                total += int(proc.memory_info().rss)
    return total
