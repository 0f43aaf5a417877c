"""The allocator rules of the estimator against the records that are their evidence.

A rule is a count constant of ``planner/data/calibration.json`` that adds a cached block to the
allocator's slack where its condition holds (``planner/memory.py``: ``_extra_loss_block``,
``_accumulated_partition_block``). Each rule's records must hold configurations it applies to, and
at least one of them must be planned short of the -3% bound without it: a rule no record needs
would be a special case without evidence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.accuracy import Row, error, load_records, plan_records
from planner import plan
from planner.calibration import CALIBRATION, trial

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RULES = ("ALLOCATOR_SOFTCAP_BLOCKS", "ALLOCATOR_MOMENTS_BLOCKS", "ALLOCATOR_ACCUMULATION_BLOCKS")
LOWER_BOUND = -0.03


def _applied(name: str) -> list[tuple[Row, float, float]]:
    """(record, NVML error with the rule, without it) of each record the rule's constant names
    where the rule adds a block."""
    files = [RESULTS / r for r in CALIBRATION.constants[name].records if r.endswith(".jsonl")]
    out = []
    for row in plan_records(load_records(files)):
        nvml = row.measured("nvml_peak_bytes") if row.status == "ok" else None
        if row.plan is None or not nvml:
            continue
        with trial(**{name: 0}):
            without = plan(row.record["spec"]).per_gpu.total_bytes
        if without != row.plan.per_gpu.total_bytes:
            out.append((row, error(row.plan.per_gpu.total_bytes, nvml), error(without, nvml)))
    return out


@pytest.mark.parametrize("name", RULES)
def test_a_rule_is_needed_by_the_records_it_names(name: str) -> None:
    assert CALIBRATION.constants[name].kind == "count"
    applied = _applied(name)
    assert applied, f"{name}: no record it names is a configuration the rule applies to"
    needs = [(row.case, without) for row, _, without in applied
             if without is not None and without < LOWER_BOUND]
    assert needs, f"{name}: every record it applies to is within {LOWER_BOUND:+.0%} without it"
    for row, with_rule, _ in applied:
        assert with_rule is not None and with_rule >= LOWER_BOUND, (row.case, with_rule)
