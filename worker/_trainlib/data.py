"""Tokenisation with prompt masking, the eval split, and the deterministic order of micro-batches.

Shared by the training and the evaluation process so that eval loss is measured on exactly the
tokens training optimises: assistant turns (and their end-of-turn marker) carry labels, everything
else is ``-100``.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebox.dataset_formats import Conversation, Format

IGNORE = -100
Messages = list[dict[str, Any]]
Row = Conversation | Messages
Span = tuple[int, int]

_PLAIN_HEADERS = {"system": "### System:\n", "user": "### Instruction:\n", "assistant": "### Response:\n",
                  "tool": "### Tool result:\n"}
_PROBE_TOOL = "tunebox_probe_tool"


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]

    @property
    def num_targets(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


def as_conversation(row: Row) -> Conversation:
    """A row as ``{"messages", "tools"?}``; a bare list of messages is a conversation without tools."""
    return {"messages": row} if isinstance(row, list) else row


def trained(message: dict[str, Any]) -> bool:
    return message["role"] == "assistant" and message.get("weight", 1) != 0


# --------------------------------------------------------------------------- rendering


def _calls_text(message: dict[str, Any]) -> str:
    calls = [c["function"] for c in message.get("tool_calls") or []]
    return "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)


def _answer_text(message: dict[str, Any]) -> str:
    """What an assistant turn says, tool calls written as JSON after its content."""
    return "\n".join(x for x in (message["content"], _calls_text(message)) if x)


_TEMPLATE_SUPPORT: dict[str, tuple[bool, bool]] = {}


def _template_support(tokenizer: Any) -> tuple[bool, bool]:
    """Whether the chat template renders ``(tools, tool_calls)``; what it does not is given as text."""
    template = str(tokenizer.chat_template)
    if template not in _TEMPLATE_SUPPORT:
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "",
                                                  "parameters": {"type": "object", "properties": {}}}}
        user = [{"role": "user", "content": "x"}]
        calls = [{"type": "function", "function": {"name": _PROBE_TOOL, "arguments": {}}}]
        call = [*user, {"role": "assistant", "content": "", "tool_calls": calls}]
        try:
            tools = _PROBE_TOOL in _apply(tokenizer, user, False, [probe])
        except Exception:  # a template that fails on tools has no use for them
            tools = False
        try:
            calls = _PROBE_TOOL in _apply(tokenizer, call, False, None)
        except Exception:
            calls = False
        _TEMPLATE_SUPPORT[template] = (tools, calls)
    return _TEMPLATE_SUPPORT[template]


def _for_template(tokenizer: Any, conversation: Conversation) -> tuple[Messages, list[Any] | None]:
    """The messages and tools as the chat template takes them, text where it would drop them."""
    tools_ok, calls_ok = _template_support(tokenizer)
    tools = conversation.get("tools")
    messages: Messages = []
    for m in conversation["messages"]:
        out = {k: v for k, v in m.items() if k != "weight"}
        if m.get("tool_calls") and not calls_ok:
            out = {"role": "assistant", "content": _answer_text(m)}
        messages.append(out)
    if tools and not tools_ok:
        listing = "Tools you may call:\n" + "\n".join(json.dumps(t["function"], ensure_ascii=False)
                                                      for t in tools)
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{listing}"}
        else:
            messages.insert(0, {"role": "system", "content": listing})
        return messages, None
    return messages, tools or None


def _apply(tokenizer: Any, messages: Messages, generation_prompt: bool, tools: list[Any] | None) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt))


def _train_flags(conversation: Conversation, messages: Messages) -> list[bool]:
    """Which of the template's ``messages`` are trained (a tools listing may lead them)."""
    flags = [trained(m) for m in conversation["messages"]]
    return [False] * (len(messages) - len(flags)) + flags


def _chat_spans_every_turn(tokenizer: Any, conversation: Conversation) -> tuple[str, list[Span]] | None:
    """Render and find each trained assistant turn, if the template renders prefix by prefix."""
    messages, tools = _for_template(tokenizer, conversation)
    full = _apply(tokenizer, messages, False, tools)
    spans: list[Span] = []
    for i, learn in enumerate(_train_flags(conversation, messages)):
        if not learn:
            continue
        before = _apply(tokenizer, messages[:i], True, tools) if i else ""
        upto = _apply(tokenizer, messages[: i + 1], False, tools)
        if not (full.startswith(upto) and upto.startswith(before)):
            return None
        spans.append((len(before), len(upto)))
    return full, spans


def _chat_spans_last_turn(tokenizer: Any, conversation: Conversation) -> tuple[str, list[Span]] | None:
    """Templates that rewrite earlier turns (e.g. drop reasoning) still render the last one faithfully."""
    messages, tools = _for_template(tokenizer, conversation)
    last = max(i for i, learn in enumerate(_train_flags(conversation, messages)) if learn)
    before = _apply(tokenizer, messages[:last], True, tools) if last else ""
    full = _apply(tokenizer, messages[: last + 1], False, tools)
    if not full.startswith(before):
        return None
    return full, [(len(before), len(full))]


def _plain_render(tokenizer: Any, conversation: Conversation) -> tuple[str, list[Span]]:
    text = tokenizer.bos_token or ""
    eos = tokenizer.eos_token or ""
    spans: list[Span] = []
    if conversation.get("tools"):
        listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in conversation["tools"])
        text += f"### Tools:\n{listing}\n\n"
    for message in conversation["messages"]:
        text += _PLAIN_HEADERS[message["role"]]
        if message["role"] == "assistant":
            start = len(text)
            text += _answer_text(message) + eos
            if trained(message):
                spans.append((start, len(text)))
            text += "\n\n"
        else:
            text += message["content"] + "\n\n"
    return text, spans


def render(tokenizer: Any, row: Row, fmt: Format) -> tuple[str, list[Span]]:
    """The training text of one record and the character spans that carry labels."""
    conversation = as_conversation(row)
    if fmt == "text":
        bos, eos = tokenizer.bos_token or "", tokenizer.eos_token or ""
        text = bos + conversation["messages"][0]["content"] + eos
        return text, [(len(bos), len(text))]
    if getattr(tokenizer, "chat_template", None):
        for attempt in (_chat_spans_every_turn, _chat_spans_last_turn):
            try:
                rendered = attempt(tokenizer, conversation)
            except Exception:  # a template that rejects a conversation shape (e.g. no system turn)
                rendered = None
            if rendered is not None:
                return rendered
    return _plain_render(tokenizer, conversation)


def render_prompt(tokenizer: Any, row: Row, fmt: Format) -> tuple[str, str]:
    """``(prompt, reference)`` for generation: everything up to the last trained answer, and that answer."""
    conversation = as_conversation(row)
    messages = conversation["messages"]
    if fmt == "text":
        content = messages[0]["content"]
        cut = max(1, len(content) // 2)
        return (tokenizer.bos_token or "") + content[:cut], content[cut:]
    last = max(i for i, m in enumerate(messages) if trained(m))
    reference = _answer_text(messages[last])
    if getattr(tokenizer, "chat_template", None) and last:
        try:
            shown, tools = _for_template(tokenizer, conversation)
            lead = len(shown) - len(messages)
            return _apply(tokenizer, shown[: last + lead], True, tools), reference
        except Exception:  # fall back to the plain template below, as render() does
            pass
    text, _ = _plain_render(tokenizer, {**conversation, "messages": messages[:last]})
    return text + _PLAIN_HEADERS["assistant"], reference


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


def tokenise(tokenizer: Any, row: Row, fmt: Format) -> tuple[list[int], list[bool]]:
    """A record's whole token ids and, per token, whether it is trained."""
    text, spans = render(tokenizer, row, fmt)
    if getattr(tokenizer, "is_fast", False):
        return _tokenise_with_offsets(tokenizer, text, spans)
    return _tokenise_by_segment(tokenizer, text, spans)


def encode(tokenizer: Any, row: Row, fmt: Format, seq_len: int) -> Example | None:
    """Token ids and labels truncated to ``seq_len``; None when no answer token survives truncation."""
    ids, learn = tokenise(tokenizer, row, fmt)
    return _example(ids[:seq_len], learn[:seq_len])


def _example(ids: list[int], learn: list[bool]) -> Example | None:
    labels = [t if flag else IGNORE for t, flag in zip(ids, learn, strict=True)]
    # one label predicts nothing after the causal shift when it is the first token
    return Example(ids, labels) if sum(1 for x in labels[1:] if x != IGNORE) else None


def encode_all(tokenizer: Any, rows: Sequence[Row], fmt: Format, seq_len: int) -> list[Example]:
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


# --------------------------------------------------------------------------- what is trained

NO_ANSWER = "no_answer_within_seq_len"
MARK_OPEN, MARK_CLOSE = "\u27e6", "\u27e7"  # around the trained text of the example


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def marked_example(tokenizer: Any, row: Row, fmt: Format) -> dict[str, Any]:
    """The rendered text of one record and its trained spans, also marked inline with \u27e6 \u27e7."""
    text, spans = render(tokenizer, row, fmt)
    marked, cursor = "", 0
    for start, end in spans:
        marked += text[cursor:start] + MARK_OPEN + text[start:end] + MARK_CLOSE
        cursor = end
    return {"text": text, "trained_spans": [list(s) for s in spans], "marked": marked + text[cursor:]}


def encode_report(tokenizer: Any, rows: Sequence[Row], fmt: Format, seq_len: int
                  ) -> tuple[list[Example], dict[str, Any]]:
    """The examples of ``rows`` and what became of them: tokens per row, rows truncated and dropped (and
    why, with their 1-based numbers), the tokens kept and the tokens trained."""
    examples: list[Example] = []
    lengths: list[int] = []
    truncated, dropped = 0, []
    for number, row in enumerate(rows, start=1):
        ids, learn = tokenise(tokenizer, row, fmt)
        lengths.append(len(ids))
        example = _example(ids[:seq_len], learn[:seq_len])
        if example is None:
            dropped.append(number)
            continue
        truncated += len(ids) > seq_len
        examples.append(example)
    ordered = sorted(lengths)
    report = {
        "rows": len(rows), "seq_len": seq_len,
        "tokens_per_row": {"p50": _percentile(ordered, 0.5), "p95": _percentile(ordered, 0.95),
                           "max": ordered[-1] if ordered else 0,
                           "mean": round(sum(ordered) / len(ordered), 1) if ordered else 0.0},
        "truncated_rows": truncated,
        "dropped_rows": len(dropped),
        "dropped": {NO_ANSWER: len(dropped)} if dropped else {},
        "dropped_row_numbers": dropped[:20],
        "kept_rows": len(examples),
        # the rows of seq_len tokens packing makes of the kept rows (every row, the evaluation's too)
        "packed_rows": len(pack(examples, seq_len)),
        "tokens": sum(len(e.input_ids) for e in examples),
        "trained_tokens": sum(e.num_targets for e in examples),
    }
    return examples, report


# --------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class Packed:
    """One training row of ``seq_len`` tokens filled with whole examples (indices into the examples)."""

    members: tuple[int, ...]


def pack(examples: Sequence[Example], seq_len: int) -> list[Packed]:
    """Whole examples into rows of at most ``seq_len`` tokens, longest first, each into the fullest row it
    fits (best fit decreasing); the result depends only on the lengths."""
    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i].input_ids), i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in order:
        size = len(examples[i].input_ids)
        at = bisect.bisect_left(free, (size, -1))
        if at < len(free):
            room, row = free.pop(at)
            rows[row].append(i)
            room -= size
        else:
            row, room = len(rows), seq_len - size
            rows.append([i])
        if room > 0:
            bisect.insort(free, (room, row))
    return [Packed(tuple(r)) for r in rows]


def collate_packed(examples: Sequence[Example], rows: Sequence[Packed], seq_len: int, pad: int
                   ) -> dict[str, list[list[int]]]:
    """Packed rows padded to ``seq_len``: position ids restart at each example (the attention masks of
    transformers and flash-attention's varlen path confine attention to it) and no label predicts
    across a boundary. No attention mask: one would turn the packed-sequence detection off."""
    ids, labels, positions = [], [], []
    for row in rows:
        r_ids: list[int] = []
        r_labels: list[int] = []
        r_pos: list[int] = []
        for i in row.members:
            e = examples[i]
            r_ids += e.input_ids
            r_labels += [IGNORE, *e.labels[1:]]
            r_pos += range(len(e.input_ids))
        gap = seq_len - len(r_ids)
        ids.append(r_ids + [pad] * gap)
        labels.append(r_labels + [IGNORE] * gap)
        positions.append(r_pos + list(range(gap)))
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def length_grouped(order: list[int], lengths: Sequence[int], group: int) -> list[int]:
    """``order`` with each run of ``group`` indices sorted by length, so a micro-batch pads little."""
    out: list[int] = []
    for start in range(0, len(order), group):
        out += sorted(order[start : start + group], key=lambda i: lengths[i])
    return out


# --------------------------------------------------------------------------- split and order


def eval_size(num_rows: int, fraction: float) -> int:
    if fraction <= 0 or num_rows < 2:
        return 0
    return min(num_rows - 1, max(1, round(num_rows * fraction)))


def split_rows(rows: Sequence[Row], fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
    """``(train, eval)``; which rows go to eval depends only on the seed and the row count."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[: eval_size(len(rows), fraction)])
    train = [r for i, r in enumerate(rows) if i not in held]
    evals = [rows[i] for i in sorted(held)]
    return train, evals


def write_eval_split(path: Path, rows: Sequence[Row], fmt: Format) -> None:
    """The held-out rows, ``{"format", "messages", "tools"?}`` a line."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"format": fmt, **as_conversation(row)}, ensure_ascii=False) + "\n")
    tmp.replace(path)


EvalRow = tuple[Format, Conversation]


def read_eval_split(path: Path) -> list[EvalRow]:
    if not path.is_file():
        return []
    out: list[EvalRow] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            fmt = record.pop("format")
            out.append((fmt, record))
    return out


class MicroBatchOrder:
    """The endless, seed-determined sequence of this rank's micro-batches, epoch after epoch.

    Micro-batch ``k`` is a pure function of ``k`` (and the seed, rank and sizes), so a resumed run
    that starts at ``k = step * gradient_accumulation_steps`` sees the data the first run would have.
    """

    def __init__(self, num_rows: int, micro_batch_size: int, world_size: int, rank: int, seed: int,
                 lengths: Sequence[int] | None = None):
        if num_rows < 1:
            raise ValueError("no rows to train on")
        self.num_rows = num_rows
        self.lengths = lengths  # given: micro-batches of similar lengths (runs of 64 batches sorted)
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
            if self.lengths is not None:
                order = length_grouped(order, self.lengths, self.mbs * self.world * 64)
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
