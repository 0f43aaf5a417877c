"""Progress lines (JSON, one per line, flushed) and the memory/CPU figures they carry."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any


class ProgressLog:
    """Appends events to ``progress.jsonl``; only rank 0 writes, other ranks hold a silent one."""

    def __init__(self, path: Path, enabled: bool):
        self.enabled = enabled
        self._fh = path.open("a", encoding="utf-8") if enabled else None
        self._lock = threading.Lock()  # the op-build watcher writes from its own thread

    def emit(self, kind: str, **fields: Any) -> None:
        if self._fh is None:
            return
        line = {"type": kind, **fields, "time": time.time()}
        with self._lock:
            self._fh.write(json.dumps(line) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def host_peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def host_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return host_peak_rss_bytes()


class Meter:
    """Host and GPU resource figures of this process; NVML is optional and failures make it None."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.nvml_peak: int | None = None
        self._nvml = self._init_nvml() if cuda else None
        self._proc = self._init_psutil()

    @staticmethod
    def _init_nvml() -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception:  # no driver or no library: the figure is simply absent
            return None

    @staticmethod
    def _init_psutil() -> Any:
        try:
            import psutil

            proc = psutil.Process()
            proc.cpu_percent(None)  # the first call only starts the interval
            return proc
        except Exception:
            return None

    def cpu_percent(self) -> float | None:
        return float(self._proc.cpu_percent(None)) if self._proc is not None else None

    def peak_gpu_bytes(self) -> int | None:
        if not self.cuda:
            return None
        import torch

        return int(torch.cuda.max_memory_reserved())

    def peak_allocated_bytes(self) -> int | None:
        """PyTorch's allocated peak: what the plan's terms add up to, without the allocator's cache."""
        if not self.cuda:
            return None
        import torch

        return int(torch.cuda.max_memory_allocated())

    def nvml_bytes(self) -> int | None:
        """This pid's memory on any GPU as NVML sees it (context and non-PyTorch memory included)."""
        if self._nvml is None:
            return None
        nv, pid, total, seen = self._nvml, os.getpid(), 0, False
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == pid and proc.usedGpuMemory is not None:
                        total, seen = total + int(proc.usedGpuMemory), True
        except Exception:
            return self.nvml_peak
        if seen:
            self.nvml_peak = max(self.nvml_peak or 0, total)
        return self.nvml_peak

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_gpu_bytes": self.peak_gpu_bytes(),
                               "peak_allocated_gpu_bytes": self.peak_allocated_bytes(),
                               "host_rss_bytes": host_rss_bytes(), "host_cpu_percent": self.cpu_percent()}
        nvml = self.nvml_bytes()
        if nvml is not None:
            out["nvml_peak_bytes"] = nvml
        return out
