"""A full disk is ``disk_full`` whichever library hit it: Python's OSError, or safetensors' own error."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker._trainlib.runfile import classify

FULL = Path("/dev/full")  # every write to it fails with ENOSPC


def test_safetensors_own_error_for_a_full_disk_is_disk_full() -> None:
    """The error type and text safetensors raised when a final save filled an H200 box's disk
    (bench/results/field-cases/nvidia-h200-2026-12-02-ranked40-heldout2.json)."""
    from safetensors import SafetensorError

    exc = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert not isinstance(exc, OSError)
    failure = classify(exc)
    assert (failure.kind, failure.reason) == ("error", "disk_full")


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
def test_a_python_write_to_a_full_disk_wrapped_in_another_error_is_disk_full() -> None:
    try:
        try:
            with FULL.open("wb") as fh:
                fh.write(b"x" * 1_000_000)
                fh.flush()
        except OSError as exc:
            raise RuntimeError("checkpoint failed") from exc
    except RuntimeError as wrapped:
        assert classify(wrapped).reason == "disk_full"


def test_an_unrelated_error_is_not_disk_full() -> None:
    assert classify(ValueError("bad value")).reason == "error"
