"""Small JSONL datasets whose answers follow a learnable pattern, so loss falls within ~20 steps.

The pattern: the answer to "Repeat the word: W" is always "W W W". A random-init model first learns
the fixed wording, then the copy, so both LoRA and full fine-tuning show a clear loss drop early.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket", "garden", "silver",
         "window", "forest", "candle", "orange", "planet", "bridge"]

CORPUS = "\n".join(
    [f"Repeat the word: {w}\n{w} {w} {w}" for w in WORDS]
    + ["The quick brown fox jumps over the lazy dog. Once upon a time there was a small model.",
       "### Instruction:\n### Response:\n### System:\n### Input:\n"]
)


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n)]
    return [(f"Repeat the word: {w}", f"{w} {w} {w}") for w in words]


def alpaca_rows(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    return [{"instruction": q, "input": "", "output": a} for q, a in _pairs(n, seed)]


def sharegpt_rows(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    return [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": q},
                               {"from": "gpt", "value": a}]} for q, a in _pairs(n, seed)]


def messages_rows(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in _pairs(n, seed)]


def text_rows(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    return [{"text": f"{q}\n{a}"} for q, a in _pairs(n, seed)]


ROWS = {"alpaca": alpaca_rows, "sharegpt": sharegpt_rows, "messages": messages_rows, "text": text_rows}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_dataset(dest: Path, kind: str = "alpaca", n: int = 48, seed: int = 0) -> Path:
    """Write ``dest`` (JSONL) with ``n`` rows of ``kind`` (alpaca | sharegpt | messages | text)."""
    return write_jsonl(dest, ROWS[kind](n, seed))
