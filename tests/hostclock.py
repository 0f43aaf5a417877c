"""A stand-in for the host-clock probe's child process (tunebox/hostclock.py), for the tests of what
the service does with its figure; the probe itself runs for real in tests/worker/test_gpus.py."""

from __future__ import annotations

import pytest

from planner import constants as C
from tunebox import hostclock


def fake_probe(monkeypatch: pytest.MonkeyPatch, factor: float) -> list[str]:
    """Forget any figure this process measured and make the probe read ``factor`` times the
    calibration host's hooked-module time; returns the devices it is asked to probe, in order."""
    monkeypatch.setattr(hostclock, "_measured", {})
    monkeypatch.setattr(hostclock, "_taken", {})
    monkeypatch.setattr(hostclock, "_refreshing", set())
    probed: list[str] = []

    def child(device: str) -> dict[str, float]:
        probed.append(device)
        return {"hooked_module_us": factor * C.HOST_HOOK_REFERENCE_US}

    monkeypatch.setattr(hostclock, "_probe_in_child", child)
    return probed
