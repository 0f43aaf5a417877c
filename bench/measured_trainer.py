"""The service's trainer (``worker.train.Trainer``) on a case's ``run.json``, with what
``bench/measure.py`` records read around its own steps.

The model, the data, the DeepSpeed config (the plan's, completed as the trainer completes it), the
optimizer, the loss and the steps are the job's; this module only reads the allocator, the host and
the clock between the phases the trainer reports (``Trainer.on_phase``): the allocated peak of each
warm-up micro-step and of each measured step, the forward/backward and optimizer-step peaks of the
last measured step, host RSS at each stage, the wall time of each measured step, and forward,
backward and optimizer-step seconds of the phase-timed steps after them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from worker.train import Trainer

_NEXT = {"forward": "backward", "backward": "step", "step": "forward"}


class Peaks:
    """Running max of torch's allocator peaks across resets (the phases reset them)."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.allocated = 0
        self.reserved = 0

    def fold(self) -> None:
        if self.cuda:
            self.allocated = max(self.allocated, int(self.torch.cuda.max_memory_allocated()))
            self.reserved = max(self.reserved, int(self.torch.cuda.max_memory_reserved()))

    def reset(self) -> None:
        self.fold()
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def since_reset(self) -> int | None:
        return int(self.torch.cuda.max_memory_allocated()) if self.cuda else None


def host_now(torch: Any, cuda: bool) -> dict[str, int | None]:
    """This rank's resident set and its pinned host memory (torch's pinned allocator) right now."""
    import psutil

    now: dict[str, int | None] = {"rss_bytes": int(psutil.Process().memory_info().rss),
                                  "pinned_bytes": None, "pinned_active_bytes": None}
    if cuda:
        with contextlib.suppress(Exception):  # host_memory_stats is new in torch 2.x
            stats = torch.cuda.host_memory_stats()
            now["pinned_bytes"] = int(stats["allocated_bytes.current"])
            now["pinned_active_bytes"] = int(stats["active_bytes.current"])
    return now


def count_parameters(model: Any) -> tuple[int, int]:
    """(all, trainable) parameters, a ZeRO-3 partitioned one by its full size."""
    total = trainable = 0
    for p in model.parameters():
        n = int(getattr(p, "ds_numel", p.numel()))
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


class MeasuredTrainer(Trainer):
    def __init__(self, run: Any, result: dict[str, Any], mark: Callable[[str], None]) -> None:
        import torch

        super().__init__(run)
        self.torch = torch
        self.cuda = run.device == "cuda"
        self.result = result
        self.host = result["host_phases"]
        self.peaks = Peaks(torch, self.cuda)
        self.mark = mark
        result["peaks"] = self.peaks

    def _load_model(self) -> Any:
        # deepspeed.init_distributed has run; the model is loaded and prepared as for a job
        self.host["after_init_distributed"] = self._host()
        self._init_started = time.perf_counter()
        model = super()._load_model()
        self.host["after_model"] = self._host()
        self.result["param_count"], self.result["trainable_param_count"] = count_parameters(model)
        self.result["attn_implementation"] = self.attn_implementation
        self.result["partitioned_at_init"] = any(hasattr(p, "ds_id") for p in model.parameters())
        return model

    def _host(self) -> dict[str, int | None]:
        return host_now(self.torch, self.cuda)

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def measure(self, warmup_steps: int, measured_steps: int, phase_steps: int) -> None:
        self.preflight()
        self.load_data()
        self.build_engine()
        self.result["init_seconds"] = round(time.perf_counter() - self._init_started, 3)
        self.host["after_initialize"] = self._host()
        self.result["phase_peaks"]["after_init_allocated"] = (
            int(self.torch.cuda.memory_allocated()) if self.cuda else None)
        self.plan_steps()
        self.mark("initialised")
        self._warm_up(warmup_steps)
        self.host["after_warmup"] = self._host()
        self.result["step_seconds"] = self._measured(measured_steps)
        self.host["after_measure"] = self._host()
        self.result["phase_seconds"] = [self._phase_timed() for _ in range(phase_steps)]

    def _micro_steps(self, after: Callable[[str, int], None]) -> dict[str, Any]:
        """One optimizer step of the trainer; ``after(phase, micro_step)`` as each phase is issued."""
        current = 0

        def on_phase(phase: str) -> None:
            nonlocal current
            after(phase, current)
            if phase == "step":
                current += 1
            # a mark names the phase it begins (the forward's includes building its micro-batch)
            self.mark(f"{_NEXT[phase]} {self.step}.{current}")

        self.on_phase = on_phase
        try:
            return self.train_step()
        finally:
            self.on_phase = None

    def _warm_up(self, steps: int) -> None:
        peaks = self.result["step_allocated_peaks"]["warmup_micro_steps"]
        self.peaks.reset()

        def after(phase: str, _: int) -> None:
            if phase == "step":
                peaks.append(self.peaks.since_reset())
                self.peaks.reset()

        for _ in range(steps):
            self._micro_steps(after)

    def _measured(self, steps: int) -> list[float]:
        """Wall times of the measured optimizer steps; the last one also records phase peaks."""
        phases = self.result["phase_peaks"]
        measured_peaks = self.result["step_allocated_peaks"]["measured_steps"]
        last_micro = self.grad_accum - 1
        times: list[float] = []
        for s in range(steps):
            last = s == steps - 1

            def after(phase: str, micro: int, last: bool = last) -> None:
                if last and phase == "backward" and micro == last_micro:
                    phases["forward_backward_allocated_peak"] = self.peaks.since_reset()
                    self.peaks.reset()

            self._sync()
            self.peaks.reset()
            t0 = time.perf_counter()
            stats = self._micro_steps(after)
            self._sync()
            times.append(time.perf_counter() - t0)
            self.result["loss"] = float(stats["loss"])
            if last:
                phases["optimizer_step_allocated_peak"] = self.peaks.since_reset()
                fb, step = phases["forward_backward_allocated_peak"], phases["optimizer_step_allocated_peak"]
                measured_peaks.append(None if fb is None else max(fb, step or 0))
            else:
                measured_peaks.append(self.peaks.since_reset())
        return times

    def _phase_timed(self) -> dict[str, float]:
        """Seconds of forward, backward and optimizer step (``engine.step``, which is light except at
        the accumulation boundary) summed over one optimizer step's micro-steps, synchronised at every
        phase boundary: where a step's time goes, not its length. The forward includes building its
        micro-batch."""
        self._sync()
        parts = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        last = time.perf_counter()

        def after(phase: str, _: int) -> None:
            nonlocal last
            self._sync()
            now = time.perf_counter()
            parts[phase] += now - last
            last = now

        self._micro_steps(after)
        return {k: round(v, 4) for k, v in parts.items()}
