"""The allocation-trace reduction: from the caching allocator's history to the segments it reserved,
what was allocated when each was reserved, the reserved peak, and the free blocks left in each."""

from __future__ import annotations

from bench.measure import alloc_trace_summary

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
