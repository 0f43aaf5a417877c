"""The allocation-trace reduction: from the caching allocator's history to the segments it reserved,
what was allocated when each was reserved, the reserved peak, and the free blocks left in each."""

from __future__ import annotations

import pytest

from bench.measure import TRACE_MARK_BYTES, alloc_trace_summary

MIB = 2**20


def _ev(action: str, size: int, filename: str = "/x/transformers/models/qwen2/modeling_qwen2.py",
        name: str = "forward") -> dict[str, object]:
    return {"action": action, "size": size, "addr": 0, "stream": 0,
            "frames": [{"filename": "/x/torch/cuda/memory.py", "line": 1, "name": "inner"},
                       {"filename": filename, "line": 42, "name": name}]}


def test_segments_are_listed_with_the_allocated_total_before_them_and_the_reserved_peak():
    events = [
        _ev("segment_alloc", 100 * MIB), _ev("alloc", 80 * MIB), _ev("alloc", 20 * MIB),
        _ev("free_requested", 80 * MIB), _ev("free_completed", 80 * MIB),
        # 80 MiB free in the first segment, yet a 90 MiB request needs a new segment
        _ev("segment_alloc", 90 * MIB, "/x/deepspeed/runtime/zero/stage3.py", "reduce"),
        _ev("alloc", 90 * MIB),
        _ev("free_completed", 90 * MIB), _ev("segment_free", 90 * MIB),
    ]
    snapshot = {"device_traces": [events, []], "segments": [
        {"device": 0, "total_size": 100 * MIB, "allocated_size": 20 * MIB,
         "blocks": [{"size": 20 * MIB, "state": "active_allocated"},
                    {"size": 80 * MIB, "state": "inactive"}]},
        {"device": 1, "total_size": 7 * MIB, "allocated_size": 0, "blocks": []},
    ]}
    out = alloc_trace_summary(snapshot, 0)
    assert out["events"] == len(events)
    assert out["peak_allocated"] == 110 * MIB
    assert out["peak_reserved"] == 190 * MIB
    assert out["at_peak_reserved"] == {"event": 5, "reserved": 190 * MIB, "allocated": 20 * MIB}
    first, second = out["segment_allocs"]
    assert (first["segment_bytes"], first["allocated_before"]) == (100 * MIB, 0)
    assert (second["segment_bytes"], second["allocated_before"], second["reserved_after"]) == (
        90 * MIB, 20 * MIB, 190 * MIB)
    # torch's own frames are dropped; the caller's remain
    assert second["where"] == ["stage3.py:42 reduce"]
    assert out["segments_at_end"] == [
        {"total_bytes": 100 * MIB, "allocated_bytes": 20 * MIB, "free_blocks": [80 * MIB],
         "free_bytes": 80 * MIB}]


def _at(action: str, size: int, addr: int, name: str = "forward", filename: str = "/x/deepspeed/engine.py"
        ) -> dict[str, object]:
    ev = _ev(action, size, filename, name)
    ev["addr"] = addr
    return ev


def _mark(addr: int) -> dict[str, object]:
    return _at("alloc", TRACE_MARK_BYTES, addr, "_trace_mark", "/x/bench/measure.py")


def _unmark(addr: int) -> dict[str, object]:
    return _at("free_completed", TRACE_MARK_BYTES, addr)


def _stackless(ev: dict[str, object]) -> dict[str, object]:
    return {**ev, "frames": []}


@pytest.mark.parametrize("stacks", [True, False], ids=["python-stacks", "sizes-only"])
def test_each_phase_lists_its_allocated_peak_and_what_was_live_there(stacks: bool):
    events = [
        _at("alloc", 10 * MIB, 1, "init_weights"),
        _mark(99), _unmark(99),
        _at("alloc", 30 * MIB, 2, "forward"), _at("alloc", 5 * MIB, 3, "forward"),
        _at("free_completed", 5 * MIB, 3),
        _mark(98), _unmark(98),
        # the autograd engine's allocations carry no Python frame
        {"action": "alloc", "size": 40 * MIB, "addr": 4, "frames": []},
        _at("free_completed", 30 * MIB, 2),
        {"action": "alloc", "size": 20 * MIB, "addr": 5, "frames": []},
    ]
    if not stacks:  # without stacks the marks are found by their size
        events = [_stackless(ev) for ev in events]
    out = alloc_trace_summary({"device_traces": [events], "segments": []}, 0, marks=["fwd", "bwd"])
    assert out["peak_allocated"] == 80 * MIB
    first, fwd, bwd = out["phases"]
    assert (first["phase"], first["peak_allocated"]) == ("before the first mark", 10 * MIB)
    # the marks themselves are freed at once and never counted at a peak
    assert (fwd["phase"], fwd["peak_allocated"]) == ("fwd", 45 * MIB)
    by_where = [10 * MIB, 35 * MIB] if stacks else [5 * MIB, 10 * MIB, 30 * MIB]
    assert sorted(g["bytes"] for g in fwd["live"]) == by_where
    # in backward the forward's 30 MiB block was freed before the second gradient: the peak is at the
    # first gradient, with the forward's block still live
    assert (bwd["phase"], bwd["peak_allocated"]) == ("bwd", 80 * MIB)
    live = {g["where"]: (g["bytes"], g["count"]) for g in bwd["live"]}
    autograd = "(no Python frame: the autograd engine), {} B each"
    if stacks:
        assert live == {autograd.format(40 * MIB): (40 * MIB, 1), "engine.py:42 forward": (30 * MIB, 1),
                        "engine.py:42 init_weights": (10 * MIB, 1)}
    else:  # grouped by size
        assert live == {autograd.format(size): (size, 1) for size in (10 * MIB, 30 * MIB, 40 * MIB)}
    assert out["at_peak_allocated"]["live"] == bwd["live"]
