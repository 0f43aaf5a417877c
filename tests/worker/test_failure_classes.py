"""The failure classes end to end of the exit code: what the training process exits with for each
cause, and what the worker reads back from that code when the process left no failure.json.

The codes are the contract of worker/_trainlib/runfile.py's docstring, written out here by hand:
0 ok, 1 a system error, 2 the user's error, 3 CUDA out of memory, 4 host out of memory, 5 disk full,
143 ended by SIGTERM (128 + 15, as a shell reports it).
"""

from __future__ import annotations

import errno
import signal

import pytest

from worker._trainlib import runfile
from worker._trainlib.runfile import JobFailure, classify
from worker.supervise import failure_from_exit

TorchOOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})


@pytest.mark.parametrize(("exc", "reason"), [
    (TorchOOM("CUDA out of memory. Tried to allocate 2.00 GiB"), "cuda_oom"),
    (TorchOOM("Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB"), "cuda_oom"),  # by type
    (RuntimeError("CUDA error: out of memory"), "cuda_oom"),
    (MemoryError(), "host_oom"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                  "you tried to allocate 8589934592 bytes"), "host_oom"),
    (OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
    (ValueError("bad value"), "error"),
    (RuntimeError("a cache ran out of memory"), "error"),
    (OSError(errno.EACCES, "Permission denied"), "error"),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_an_exception_is_classified_by_its_cause(exc: BaseException, reason: str) -> None:
    failure = classify(exc)
    assert (failure.kind, failure.reason) == ("error", reason)


def test_a_known_failure_keeps_its_kind_and_reason() -> None:
    known = JobFailure("user_error", "bad_lora_targets", "no module named q_proj")
    assert classify(known) is known


@pytest.mark.parametrize(("kind", "reason", "code"), [
    ("error", "cuda_oom", 3), ("error", "host_oom", 4), ("error", "disk_full", 5),
    ("user_error", "bad_dataset", 2), ("user_error", "bad_lora_targets", 2),
    ("error", "optimizer_unavailable", 1), ("error", "error", 1),
])
def test_a_failure_exits_with_its_code(kind: str, reason: str, code: int) -> None:
    assert JobFailure(kind, reason, "m").exit_code == code


def test_the_fixed_codes() -> None:
    assert (runfile.EXIT_OK, runfile.EXIT_ERROR, runfile.EXIT_USER_ERROR) == (0, 1, 2)
    assert (runfile.EXIT_CUDA_OOM, runfile.EXIT_HOST_OOM, runfile.EXIT_DISK_FULL) == (3, 4, 5)
    assert runfile.EXIT_TERMINATED == 128 + signal.SIGTERM


@pytest.mark.parametrize(("code", "kind", "reason"), [
    (3, "error", "cuda_oom"), (4, "error", "host_oom"), (5, "error", "disk_full"),
    (2, "user_error", "user_error"), (1, "error", "error"), (7, "error", "error"), (None, "error", "error"),
    (-signal.SIGKILL, "error", "host_oom"),  # the kernel's OOM killer sends SIGKILL
    (-signal.SIGSEGV, "error", "killed"), (-signal.SIGTERM, "error", "killed"),
    (0, "error", "no_result"),  # exited cleanly without saying it finished
])
def test_the_worker_reads_the_cause_from_the_exit_code(code: int | None, kind: str, reason: str) -> None:
    failure = failure_from_exit(code, "training")
    assert (failure.kind, failure.reason) == (kind, reason)
    assert "training" in failure.message


@pytest.mark.parametrize("failure", [
    JobFailure("error", "cuda_oom", "m"), JobFailure("error", "host_oom", "m"),
    JobFailure("error", "disk_full", "m"), JobFailure("user_error", "user_error", "m"),
], ids=lambda f: f.reason)
def test_a_process_that_could_not_write_its_failure_is_read_back_from_its_code(failure: JobFailure) -> None:
    read = failure_from_exit(failure.exit_code, "training")
    assert (read.kind, read.reason) == (failure.kind, failure.reason)
