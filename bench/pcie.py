"""How fast this box moves bytes between host memory and its GPUs: the rate behind the planner's
offload traffic (``PCIE_BYTES_PER_S``).

Times ``copy_`` of pinned (and, for comparison, pageable) host tensors to and from each GPU, one GPU
at a time and every GPU at once (one thread per GPU, each on its own stream), and prints one JSON
object. Run from the repository root on a GPU box: ``python3 -m bench.pcie [--mib 1024]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

#: Timed copies per direction and case; the median is reported.
REPEATS = 5


def _rate(torch: Any, device: int, mib: int, direction: str, pinned: bool) -> float:
    """Median bytes per second of ``REPEATS`` copies of ``mib`` MiB in ``direction`` (h2d or d2h)."""
    n = mib * 1024 * 1024
    host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    gpu = torch.empty(n, dtype=torch.uint8, device=f"cuda:{device}")
    src, dst = (host, gpu) if direction == "h2d" else (gpu, host)
    stream = torch.cuda.Stream(device=device)
    times = []
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=pinned)  # warm-up
        stream.synchronize()
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=pinned)
            stream.synchronize()
            times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def _together(torch: Any, devices: list[int], mib: int, direction: str) -> list[float]:
    """Each GPU's pinned rate while every GPU copies at once."""
    rates = [0.0] * len(devices)
    start = threading.Barrier(len(devices))

    def one(i: int, device: int) -> None:
        torch.cuda.set_device(device)
        start.wait()
        rates[i] = _rate(torch, device, mib, direction, True)

    threads = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


def measure(mib: int) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench.pcie needs a CUDA GPU")
    devices = list(range(torch.cuda.device_count()))
    gb = 1e9
    out: dict[str, Any] = {
        "gpu_name": torch.cuda.get_device_name(0),
        "gpu_count": len(devices),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "mib": mib,
        "repeats": REPEATS,
        "alone_gb_per_s": {},
        "together_gb_per_s": {},
    }
    for d in devices:
        out["alone_gb_per_s"][str(d)] = {
            f"{way}_{'pinned' if pinned else 'pageable'}": round(_rate(torch, d, mib, way, pinned) / gb, 2)
            for way in ("h2d", "d2h")
            for pinned in (True, False)
        }
    if len(devices) > 1:
        for way in ("h2d", "d2h"):
            out["together_gb_per_s"][way] = [round(r / gb, 2) for r in _together(torch, devices, mib, way)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB per copy (default 1024)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.mib)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
