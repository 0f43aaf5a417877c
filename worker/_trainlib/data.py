"""Tokenisation with prompt masking, the eval split, and the deterministic order of micro-batches.

Shared by the training and the evaluation process so that eval loss is measured on exactly the
tokens training optimises: assistant turns (and their end-of-turn marker) carry labels, everything
else is ``-100``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebox.datasets import Format

IGNORE = -100
Messages = list[dict[str, str]]
Span = tuple[int, int]

_PLAIN_HEADERS = {"system": "### System:\n", "user": "### Instruction:\n", "assistant": "### Response:\n"}


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]

    @property
    def num_targets(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


# --------------------------------------------------------------------------- rendering


def _apply(tokenizer: Any, messages: Messages, generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=generation_prompt))


def _chat_spans_every_turn(tokenizer: Any, messages: Messages) -> tuple[str, list[Span]] | None:
    """Render and find each assistant turn, if the template renders conversations prefix by prefix."""
    full = _apply(tokenizer, messages, False)
    spans: list[Span] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _apply(tokenizer, messages[:i], True) if i else ""
        upto = _apply(tokenizer, messages[: i + 1], False)
        if not (full.startswith(upto) and upto.startswith(before)):
            return None
        spans.append((len(before), len(upto)))
    return full, spans


def _chat_spans_last_turn(tokenizer: Any, messages: Messages) -> tuple[str, list[Span]] | None:
    """Templates that rewrite earlier turns (e.g. drop reasoning) still render the last one faithfully."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    before = _apply(tokenizer, messages[:last], True) if last else ""
    full = _apply(tokenizer, messages[: last + 1], False)
    if not full.startswith(before):
        return None
    return full, [(len(before), len(full))]


def _plain_render(tokenizer: Any, messages: Messages) -> tuple[str, list[Span]]:
    text = tokenizer.bos_token or ""
    eos = tokenizer.eos_token or ""
    spans: list[Span] = []
    for message in messages:
        text += _PLAIN_HEADERS[message["role"]]
        if message["role"] == "assistant":
            start = len(text)
            text += message["content"] + eos
            spans.append((start, len(text)))
            text += "\n\n"
        else:
            text += message["content"] + "\n\n"
    return text, spans


def render(tokenizer: Any, messages: Messages, fmt: Format) -> tuple[str, list[Span]]:
    """The training text of one record and the character spans that carry labels."""
    if fmt == "text":
        bos, eos = tokenizer.bos_token or "", tokenizer.eos_token or ""
        text = bos + messages[0]["content"] + eos
        return text, [(len(bos), len(text))]
    if getattr(tokenizer, "chat_template", None):
        for attempt in (_chat_spans_every_turn, _chat_spans_last_turn):
            try:
                rendered = attempt(tokenizer, messages)
            except Exception:  # a template that rejects a conversation shape (e.g. no system turn)
                rendered = None
            if rendered is not None:
                return rendered
    return _plain_render(tokenizer, messages)


def render_prompt(tokenizer: Any, messages: Messages, fmt: Format) -> tuple[str, str]:
    """``(prompt, reference)`` for generation: everything up to the last answer, and that answer."""
    if fmt == "text":
        content = messages[0]["content"]
        cut = max(1, len(content) // 2)
        return (tokenizer.bos_token or "") + content[:cut], content[cut:]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    reference = messages[last]["content"]
    if getattr(tokenizer, "chat_template", None) and last:
        try:
            return _apply(tokenizer, messages[:last], True), reference
        except Exception:  # fall back to the plain template below, as render() does
            pass
    text, spans = _plain_render(tokenizer, messages[: last + 1])
    return text[: spans[-1][0]], reference


# --------------------------------------------------------------------------- tokenising


def _tokenise_with_offsets(tokenizer: Any, text: str, spans: list[Span]) -> tuple[list[int], list[bool]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    learn = [any(s <= start < e for s, e in spans) for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), learn


def _tokenise_by_segment(tokenizer: Any, text: str, spans: list[Span]) -> tuple[list[int], list[bool]]:
    """Slow tokenizers have no offsets: tokenise the prompt and answer pieces one by one."""
    ids: list[int] = []
    learn: list[bool] = []
    cursor = 0
    for start, end in [*spans, (len(text), len(text))]:
        for piece, flag in ((text[cursor:start], False), (text[start:end], True)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids.extend(piece_ids)
                learn.extend([flag] * len(piece_ids))
        cursor = end
    return ids, learn


def encode(tokenizer: Any, messages: Messages, fmt: Format, seq_len: int) -> Example | None:
    """Token ids and labels truncated to ``seq_len``; None when no answer token survives truncation."""
    text, spans = render(tokenizer, messages, fmt)
    if getattr(tokenizer, "is_fast", False):
        ids, learn = _tokenise_with_offsets(tokenizer, text, spans)
    else:
        ids, learn = _tokenise_by_segment(tokenizer, text, spans)
    ids, learn = ids[:seq_len], learn[:seq_len]
    labels = [t if flag else IGNORE for t, flag in zip(ids, learn, strict=True)]
    example = Example(ids, labels)
    # one label predicts nothing after the causal shift when it is the first token
    return example if sum(1 for x in labels[1:] if x != IGNORE) else None


def encode_all(tokenizer: Any, rows: Sequence[Messages], fmt: Format, seq_len: int) -> list[Example]:
    out = [encode(tokenizer, r, fmt, seq_len) for r in rows]
    return [e for e in out if e is not None]


def pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def collate(examples: Sequence[Example], pad: int) -> dict[str, list[list[int]]]:
    """Right-pad a micro-batch to its longest row (as lists; the caller makes tensors)."""
    width = max(len(e.input_ids) for e in examples)
    ids, labels, mask = [], [], []
    for e in examples:
        gap = width - len(e.input_ids)
        ids.append(e.input_ids + [pad] * gap)
        labels.append(e.labels + [IGNORE] * gap)
        mask.append([1] * len(e.input_ids) + [0] * gap)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


# --------------------------------------------------------------------------- split and order


def eval_size(num_rows: int, fraction: float) -> int:
    if fraction <= 0 or num_rows < 2:
        return 0
    return min(num_rows - 1, max(1, round(num_rows * fraction)))


def split_rows(rows: Sequence[Messages], fraction: float, seed: int) -> tuple[list[Messages], list[Messages]]:
    """``(train, eval)``; which rows go to eval depends only on the seed and the row count."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[: eval_size(len(rows), fraction)])
    train = [r for i, r in enumerate(rows) if i not in held]
    evals = [rows[i] for i in sorted(held)]
    return train, evals


def write_eval_split(path: Path, rows: Sequence[Messages], fmt: Format) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"format": fmt, "messages": row}, ensure_ascii=False) + "\n")
    tmp.replace(path)


EvalRow = tuple[Format, Messages]


def read_eval_split(path: Path) -> list[EvalRow]:
    if not path.is_file():
        return []
    out: list[EvalRow] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            out.append((record["format"], record["messages"]))
    return out


class MicroBatchOrder:
    """The endless, seed-determined sequence of this rank's micro-batches, epoch after epoch.

    Micro-batch ``k`` is a pure function of ``k`` (and the seed, rank and sizes), so a resumed run
    that starts at ``k = step * gradient_accumulation_steps`` sees the data the first run would have.
    """

    def __init__(self, num_rows: int, micro_batch_size: int, world_size: int, rank: int, seed: int):
        if num_rows < 1:
            raise ValueError("no rows to train on")
        self.num_rows = num_rows
        self.mbs = micro_batch_size
        self.world = world_size
        self.rank = rank
        self.seed = seed
        self.per_epoch = math.ceil(num_rows / (micro_batch_size * world_size))
        self._cache: tuple[int, list[int]] | None = None

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._cache is None or self._cache[0] != epoch:
            order = list(range(self.num_rows))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            need = self.per_epoch * self.mbs * self.world
            order = (order * math.ceil(need / len(order)))[:need]  # wrap so every rank gets full batches
            self._cache = (epoch, order)
        return self._cache[1]

    def indices(self, k: int) -> list[int]:
        epoch, pos = divmod(k, self.per_epoch)
        order = self._epoch_order(epoch)
        start = (pos * self.world + self.rank) * self.mbs
        return order[start : start + self.mbs]

    def epoch_of(self, k: int) -> float:
        return k / self.per_epoch


def total_steps(order: MicroBatchOrder, grad_accum: int, epochs: float | None, max_steps: int | None) -> int:
    if max_steps is not None:
        return max_steps
    assert epochs is not None
    return max(1, math.ceil(epochs * order.per_epoch / grad_accum))
