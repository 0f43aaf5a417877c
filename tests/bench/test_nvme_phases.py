"""bench/nvme_offload.rss_by_phase: where in a run the training process's host RSS peaked."""

from __future__ import annotations

from bench.nvme_offload import rss_by_phase

LINES = [{"type": "op_build", "time": 5.0}, {"type": "start", "time": 10.0},
         {"type": "progress", "step": 1, "time": 20.0}, {"type": "progress", "step": 2, "time": 25.0},
         {"type": "checkpoint", "step": 2, "time": 40.0}, {"type": "done", "step": 2, "time": 40.0}]


def test_each_phase_keeps_its_largest_sample() -> None:
    timeline = [(1.0, 100), (9.0, 900), (10.5, 300), (19.0, 700), (21.0, 400), (24.0, 500), (30.0, 1200),
                (39.0, 600)]
    assert rss_by_phase(timeline, LINES) == {"load": 900, "first_step": 700, "steps": 500, "save": 1200}


def test_a_run_that_failed_before_its_first_step_ends_in_that_phase() -> None:
    never_started = rss_by_phase([(1.0, 100), (7.0, 250)], [{"type": "op_build", "time": 5.0}])
    assert never_started == {"load": 250, "first_step": None, "steps": None, "save": None}
    started = rss_by_phase([(1.0, 100), (12.0, 450)], LINES[:2])
    assert started == {"load": 100, "first_step": 450, "steps": None, "save": None}
