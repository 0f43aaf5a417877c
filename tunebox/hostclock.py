"""How fast this host runs what sets a training step's host clock.

A small step is bound by its host, not its GPU: Python, kernel launches, and the hooks ZeRO-3 and
transformers add to every module of every pass. Boxes of the same kind differ here (a probe of the
same H200 box type read 15.8-32.7 us per hooked module call over six device sessions, and the step
times moved with it), so the planner scales its host clock by this box's reading
(``hardware.host_clock_factor``; see ``planner.host_clock_factor``), to a fitted power below one:
one probe is itself a noisy figure (eight in a row on an idle box read 15.5-22.4 us).

The probe times one small module call through a forward pre-hook and a forward hook on the
training device. It runs in a child process (``python -m tunebox.hostclock``), so the service's own
process never creates a CUDA context; ``bench/measure.py`` records the same figures with every
benchmark run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from planner import host_clock_factor
from tunebox.settings import Settings

__all__ = ["box_host_clock_factor", "probe"]

#: Seconds the probe child may take (importing torch dominates).
PROBE_TIMEOUT_S = 120.0

_lock = threading.Lock()
_measured: dict[str, float | None] = {}
_taken: dict[str, float] = {}  # time.monotonic() of each figure in _measured
_refreshing: set[str] = set()


def probe(device_name: str, repeats: int = 5) -> dict[str, Any]:
    """The host's speed on ``device_name`` (``cuda`` or ``cpu``): the least time per call over
    ``repeats`` rounds of a pure-Python loop of 1000 additions, an in-place op on a small tensor,
    and a ``Linear(64, 64)`` call through two Python hooks, in microseconds."""
    import torch

    # the process's current CUDA device (the first in a fresh child): the probe never picks another
    cuda = device_name == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def best_of(fn: Callable[[], object], n: int) -> float:
        fn()  # warm-up
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            times.append((time.perf_counter() - t0) / n)
        return min(times)

    def python_loop() -> None:
        acc = 0
        for i in range(1000):
            acc += i

    x = torch.zeros(1024, device=device)
    layer = torch.nn.Linear(64, 64).to(device)
    layer.register_forward_pre_hook(lambda module, args: None)
    layer.register_forward_hook(lambda module, args, output: None)
    inp = torch.zeros(1, 64, device=device)
    with torch.no_grad():
        return {
            "device": device.type,
            "python_loop_1000_us": round(best_of(python_loop, 200) * 1e6, 2),
            "tensor_op_us": round(best_of(lambda: x.mul_(1.0), 2000) * 1e6, 2),
            "hooked_module_us": round(best_of(lambda: layer(inp), 2000) * 1e6, 2),
        }


def _probe_in_child(device_name: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tunebox.hostclock", "--device", device_name],
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def box_host_clock_factor(settings: Settings, has_cuda_gpu: Callable[[], bool]) -> float | None:
    """This box's ``hardware.host_clock_factor``: the settings' figure where given; on a box with
    NVIDIA GPUs, the probe's hooked-module time over the calibration host's, measured on first use
    and again, in a background thread, whenever the figure is older than
    ``settings.host_probe_max_age_s`` (the plan that finds it old gets the last figure); None (the
    planner's calibration host) on a box without them, whose CPU stand-ins the step-time constants
    do not describe, or where the probe fails.

    The same H200 box read 15.5-30.9 us from one benchmark case to the next within one run, and the
    steps followed the case's own reading more closely than the run's first one (16 of 22 ten-step
    records within 25% against 8; ``bench/accuracy.py``, "Step time over ten steps")."""
    if settings.host_clock_factor is not None:
        return settings.host_clock_factor
    if not settings.host_probe:
        return None
    with _lock:
        if "cuda" not in _measured and not has_cuda_gpu():
            _measured["cuda"], _taken["cuda"] = None, float("inf")  # no GPU: nothing to probe, ever
        if "cuda" not in _measured:
            _measured["cuda"], _taken["cuda"] = _read_factor(), time.monotonic()
        elif time.monotonic() - _taken.get("cuda", 0.0) > settings.host_probe_max_age_s \
                and "cuda" not in _refreshing:
            _refreshing.add("cuda")
            threading.Thread(target=_refresh, args=("cuda",), name="host-clock-refresh", daemon=True).start()
        return _measured["cuda"]


def _read_factor() -> float | None:
    try:
        return host_clock_factor(float(_probe_in_child("cuda")["hooked_module_us"]))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return None


def _refresh(device: str) -> None:
    try:
        value = _read_factor()
        with _lock:
            if value is not None or _measured.get(device) is None:  # a failed re-probe keeps the figure
                _measured[device] = value
            _taken[device] = time.monotonic()
    finally:
        with _lock:
            _refreshing.discard(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
