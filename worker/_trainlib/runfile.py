"""The job folder's contract: ``run.json`` in, ``failure.json`` out, and the exit codes.

``run.json``::

    {"job_id": str, "spec": <JobSpec JSON>, "model_path": str, "dataset_path": str,
     "eval_dataset_path": str,               # "" unless the spec names eval.dataset
     "resolved": {"micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                  "zero_stage", "offload_optimizer", "offload_param", "num_gpus", "precision",
                  "loss_chunk_tokens", "attn_implementation"},
     "deepspeed_config": {...}, "device": "cuda" | "cpu",
     "gpu_memory_limit_bytes": int | null}   # PyTorch allocator limit per GPU, from the plan

``failure.json``: ``{"kind": "user_error" | "error", "reason": str, "message": str, "data": {...}}``;
``data`` (optional) holds the figures of the failure, e.g. a ``cuda_oom``'s allocator limit, reserved
peak and failed request.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.spec import JobSpec

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USER_ERROR = 2
EXIT_CUDA_OOM = 3
EXIT_HOST_OOM = 4
EXIT_DISK_FULL = 5
EXIT_PAUSED = 6
EXIT_TERMINATED = 143

USER_ERROR = "user_error"
ERROR = "error"


#: the worker creates this file in the job folder to ask the training to pause at its next step boundary
PAUSE_FILE = "pause.request"


class JobFailure(Exception):
    """A failure whose cause is known: who is at fault and a machine-readable reason."""

    def __init__(self, kind: str, reason: str, message: str, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.kind = kind
        self.reason = reason
        self.message = message
        self.data = data

    @property
    def exit_code(self) -> int:
        codes = {"cuda_oom": EXIT_CUDA_OOM, "host_oom": EXIT_HOST_OOM, "disk_full": EXIT_DISK_FULL}
        if self.reason in codes:
            return codes[self.reason]
        return EXIT_USER_ERROR if self.kind == USER_ERROR else EXIT_ERROR


class Terminated(BaseException):
    """Raised from the SIGTERM handler; BaseException so that no ``except Exception`` swallows it."""


@dataclass(frozen=True)
class Resolved:
    micro_batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    zero_stage: int
    offload_optimizer: str
    offload_param: str
    num_gpus: int
    precision: str
    loss_chunk_tokens: int | None = None  # None: the loss over the full logits
    #: the attention the plan was made for, which the model is loaded with; None: transformers' choice
    attn_implementation: str | None = None


@dataclass(frozen=True)
class RunConfig:
    job_dir: Path
    job_id: str
    spec: JobSpec
    model_path: Path | None  # None when the job names no local folder (the user's error, reported later)
    dataset_path: Path | None
    resolved: Resolved
    deepspeed_config: dict[str, Any]
    device: str
    gpu_memory_limit_bytes: int | None = None
    eval_dataset_path: Path | None = None  # the evaluation rows' file, when the spec names eval.dataset

    @property
    def model_dir(self) -> Path:
        if self.model_path is None:
            raise JobFailure(USER_ERROR, "bad_model", "model.path: training needs a local model folder")
        return self.model_path

    @property
    def dataset_file(self) -> Path:
        if self.dataset_path is None:
            raise JobFailure(USER_ERROR, "bad_dataset", "dataset: training needs a dataset path or id")
        return self.dataset_path

    @property
    def checkpoints_dir(self) -> Path:
        return self.job_dir / "checkpoints"

    @property
    def progress_path(self) -> Path:
        return self.job_dir / "progress.jsonl"

    @property
    def eval_split_path(self) -> Path:
        return self.job_dir / "eval_split.jsonl"


def _resolved(raw: dict[str, Any], spec: JobSpec, ds: dict[str, Any]) -> Resolved:
    """The plan's resolved settings; a value the plan left out falls back to the DeepSpeed config or spec."""
    t, r = spec.training, spec.resources

    def pick(key: str, *fallbacks: Any) -> Any:
        for value in (raw.get(key), *fallbacks):
            if value is not None and value != "auto":
                return value
        return None

    zero = ds.get("zero_optimization") or {}
    chunk = pick("loss_chunk_tokens", t.loss_chunk_tokens)
    return Resolved(
        micro_batch_size=int(pick("micro_batch_size", ds.get("train_micro_batch_size_per_gpu"),
                                  t.micro_batch_size, 1)),
        gradient_accumulation_steps=int(pick("gradient_accumulation_steps",
                                             ds.get("gradient_accumulation_steps"),
                                             t.gradient_accumulation_steps)),
        gradient_checkpointing=bool(pick("gradient_checkpointing", t.gradient_checkpointing, False)),
        zero_stage=int(pick("zero_stage", zero.get("stage"), r.zero_stage, 0)),
        offload_optimizer=str(pick("offload_optimizer", (zero.get("offload_optimizer") or {}).get("device"),
                                   "none")),
        offload_param=str(pick("offload_param", (zero.get("offload_param") or {}).get("device"), "none")),
        num_gpus=int(pick("num_gpus", r.num_gpus, 1)),
        precision=str(pick("precision", t.precision.value)),
        loss_chunk_tokens=None if chunk is None else int(chunk),
        attn_implementation=pick("attn_implementation", t.attn_implementation),
    )


def _path(raw: dict[str, Any], key: str) -> Path | None:
    value = raw.get(key)
    return Path(value) if isinstance(value, str) and value.strip() else None


def _positive_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or int(value) <= 0:
        raise ValueError(f"not a positive byte count: {value!r}")
    return int(value)


def load_run(job_dir: Path) -> RunConfig:
    """Read and check ``job_dir/run.json``; a bad file is the system's fault (the worker wrote it)."""
    path = job_dir / "run.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        spec = JobSpec.model_validate(raw["spec"])
        ds = dict(raw.get("deepspeed_config") or {})
        return RunConfig(
            job_dir=job_dir,
            job_id=str(raw["job_id"]),
            spec=spec,
            model_path=_path(raw, "model_path"),
            dataset_path=_path(raw, "dataset_path"),
            resolved=_resolved(dict(raw.get("resolved") or {}), spec, ds),
            deepspeed_config=ds,
            device=str(raw.get("device", "cuda")),
            gpu_memory_limit_bytes=_positive_int(raw.get("gpu_memory_limit_bytes")),
            eval_dataset_path=_path(raw, "eval_dataset_path"),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JobFailure(ERROR, "bad_run_file", f"cannot use {path}: {exc}") from exc


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def write_failure(job_dir: Path, failure: JobFailure) -> None:
    # a full disk must not hide the exit code, which still says what happened
    with contextlib.suppress(OSError):
        body: dict[str, Any] = {"kind": failure.kind, "reason": failure.reason,
                                "message": failure.message[:4000]}
        if failure.data:
            body["data"] = failure.data
        write_json_atomic(job_dir / "failure.json", body)


def classify(exc: BaseException) -> JobFailure:
    """Map an unexpected exception to a failure kind and reason."""
    if isinstance(exc, JobFailure):
        return exc
    if type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch"):
        return JobFailure(ERROR, "cuda_oom", f"CUDA out of memory: {exc}")
    if isinstance(exc, MemoryError) or _cpu_allocator_failed(exc):
        return JobFailure(ERROR, "host_oom", f"host out of memory: {exc}")
    if _disk_full(exc):
        return JobFailure(ERROR, "disk_full", f"disk full: {type(exc).__name__}: {exc}")
    if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower() and "CUDA" in str(exc):
        return JobFailure(ERROR, "cuda_oom", f"CUDA out of memory: {exc}")
    return JobFailure(ERROR, "error", f"{type(exc).__name__}: {exc}")


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT anywhere in the exception's chain, or in the text of a library's own error
    that carries the OS error (safetensors' Rust writer: "No space left on device (os error 28)")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return True
        text = str(seen)
        if any(f"(os error {code})" in text or os.strerror(code) in text for code in _DISK_FULL):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cpu_allocator_failed(exc: BaseException) -> bool:
    # torch's CPU allocator reports a failed malloc as a RuntimeError, not a MemoryError
    return isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
