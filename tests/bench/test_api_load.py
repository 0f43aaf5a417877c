"""The API benchmark's parts that need no server."""

from __future__ import annotations

from bench import api_load


def test_the_timeline_puts_each_answer_in_the_slot_it_came_in() -> None:
    stats = api_load.Stats()
    start = 100.0
    # slot 0: ten answers of 1-10 ms; slot 2: one slow answer; nothing in slot 1
    for i in range(10):
        stats.add((i + 1) / 1000, 200, start + 0.05 * i)
    stats.add(2.5, 200, start + 2.4)
    rows = api_load.timeline(stats, start, 1.0)
    assert [row["t_s"] for row in rows] == [0.0, 2.0]
    assert rows[0]["n"] == 10 and rows[0]["p50_ms"] == 6.0 and rows[0]["p99_ms"] == 10.0
    assert rows[1] == {"t_s": 2.0, "n": 1, "p50_ms": 2500.0, "p99_ms": 2500.0}


def test_answers_before_the_start_fall_in_negative_slots() -> None:
    stats = api_load.Stats()
    stats.add(0.001, 200, 9.5)
    stats.add(0.002, 200, 10.2)
    assert [row["t_s"] for row in api_load.timeline(stats, 10.0, 0.5)] == [-0.5, 0.0]
