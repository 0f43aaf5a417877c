"""Reading and validating fine-tuning datasets (pure Python: the API validates uploads with it).

A dataset is a ``.json`` file holding one JSON array of records, or JSON Lines (one record per
line; blank lines are skipped). The container is sniffed from the content, not the file name, so
an upload stored under any name reads the same. Every record of a dataset has one schema:

- ``alpaca``: ``{"instruction": str, "input": str (optional), "output": str}``
- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}`` or
  ``{"messages": [{"role": "user"|"assistant"|"system", "content": str}, ...]}``
- ``text``: ``{"text": str}``

Extra keys in a record are ignored. Problems raise :class:`DatasetError`, whose ``field`` names
what is wrong (``"dataset"`` for the file as a whole, ``"dataset.format"`` for a declared format
that does not match, otherwise the key inside the record such as ``"output"`` or
``"conversations[2].from"``) and whose ``row`` is the 1-based record number where one applies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "FORMATS",
    "DatasetError",
    "DatasetInfo",
    "Format",
    "detect_format",
    "inspect_dataset",
    "iter_records",
    "load_records",
    "to_messages",
]

Format = Literal["alpaca", "sharegpt", "text"]
FORMATS: tuple[Format, ...] = ("alpaca", "sharegpt", "text")
SAMPLE_ROWS = 3

_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
_MESSAGE_ROLES = {"user", "assistant", "system"}


class DatasetError(ValueError):
    """A dataset that cannot be used, with the offending field and 1-based row (record) number."""

    def __init__(self, field: str, message: str, row: int | None = None, *, line: int | None = None):
        self.field = field
        self.message = message
        self.row = row
        self.line = line
        where = f" (row {row})" if row is not None else ""
        super().__init__(f"{field}: {message}{where}")


@dataclass(frozen=True)
class DatasetInfo:
    format: Format
    num_rows: int
    size_bytes: int
    sample: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- reading


def _first_char(path: Path) -> str:
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1].decode("ascii", errors="replace")


def _decode(raw: bytes, line: int | None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"line {line}, " if line is not None else ""
        raise DatasetError("dataset", f"not valid UTF-8 ({where}byte {exc.start})", line=line) from None


def _iter_json_array(path: Path) -> Iterator[Any]:
    text = _decode(path.read_bytes(), None).lstrip("\ufeff")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError("dataset", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                           line=exc.lineno) from None
    if not isinstance(data, list):
        raise DatasetError("dataset", "a .json dataset must be one JSON array of records")
    yield from data


def _iter_json_lines(path: Path) -> Iterator[Any]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = _decode(raw, lineno)
            if lineno == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                continue
            try:
                yield json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError("dataset", f"invalid JSON at line {lineno} column {exc.colno}: {exc.msg}",
                                   line=lineno) from None


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the records of ``path`` in file order; each is checked to be a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError("dataset", f"no such file: {path}")
    reader = _iter_json_array if _first_char(path) == "[" else _iter_json_lines
    for row, record in enumerate(reader(path), start=1):
        if not isinstance(record, dict):
            raise DatasetError("dataset", f"each record must be a JSON object, got {type(record).__name__}",
                               row)
        yield record


# --------------------------------------------------------------------------- schemas


def _need_str(record: dict[str, Any], key: str, row: int | None, *, name: str | None = None,
              non_empty: bool = False) -> str:
    value = record.get(key)
    label = name or key
    if not isinstance(value, str):
        got = "missing" if key not in record else f"a {type(value).__name__}"
        raise DatasetError(label, f"must be a string ({got})", row)
    if non_empty and not value.strip():
        raise DatasetError(label, "must not be empty", row)
    return value


def _turns(record: dict[str, Any], row: int | None) -> list[dict[str, str]]:
    if "conversations" in record:
        key, role_key, text_key, roles = "conversations", "from", "value", _SHAREGPT_ROLES
    else:
        key, role_key, text_key, roles = "messages", "role", "content", {r: r for r in _MESSAGE_ROLES}
    turns = record[key]
    if not isinstance(turns, list) or not turns:
        raise DatasetError(key, "must be a non-empty list of turns", row)
    out: list[dict[str, str]] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DatasetError(f"{key}[{i}]", "each turn must be an object", row)
        who = turn.get(role_key)
        if who not in roles:
            raise DatasetError(f"{key}[{i}].{role_key}", f"must be one of {sorted(roles)}, got {who!r}", row)
        content = _need_str(turn, text_key, row, name=f"{key}[{i}].{text_key}")
        out.append({"role": roles[who], "content": content})
    if not any(t["role"] == "assistant" for t in out):
        raise DatasetError(key, "needs at least one assistant (gpt) turn to learn from", row)
    return out


def detect_format(record: dict[str, Any], row: int | None = None) -> Format:
    """The schema of one record, or a DatasetError naming the keys it has."""
    if "conversations" in record or "messages" in record:
        return "sharegpt"
    if "instruction" in record or "output" in record:
        return "alpaca"
    if "text" in record:
        return "text"
    keys = ", ".join(sorted(record)) or "none"
    raise DatasetError("dataset", f"unknown record schema (keys: {keys}); expected alpaca "
                       "{instruction, input?, output}, sharegpt {conversations|messages} or text {text}", row)


def to_messages(record: dict[str, Any], fmt: Format, row: int | None = None) -> list[dict[str, str]]:
    """A record as chat turns ``[{role, content}]``; a text record is one assistant turn."""
    if fmt == "sharegpt":
        return _turns(record, row)
    if fmt == "alpaca":
        instruction = _need_str(record, "instruction", row)
        extra = record.get("input", "")
        if extra is None:
            extra = ""
        if not isinstance(extra, str):
            raise DatasetError("input", f"must be a string (a {type(extra).__name__})", row)
        output = _need_str(record, "output", row)
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        if not prompt.strip():
            raise DatasetError("instruction", "must not be empty", row)
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return [{"role": "assistant", "content": _need_str(record, "text", row, non_empty=True)}]


def _check_declared(declared: str) -> None:
    if declared != "auto" and declared not in FORMATS:
        raise DatasetError("dataset.format", f"unknown format {declared!r}; use one of "
                           f"{', '.join(FORMATS)} or auto")


def _validate(records: Iterator[dict[str, Any]], declared: str, max_rows: int | None
              ) -> Iterator[tuple[Format, dict[str, Any]]]:
    first: Format | None = None
    for row, record in enumerate(records, start=1):
        if max_rows is not None and row > max_rows:
            raise DatasetError("dataset", f"more than {max_rows} rows (the limit)", row)
        fmt = detect_format(record, row)
        if first is None:
            first = fmt
            if declared != "auto" and fmt != declared:
                raise DatasetError("dataset.format", f"declared {declared} but the records are {fmt}", row)
        elif fmt != first:
            raise DatasetError("dataset", f"mixed schemas: row 1 is {first}, row {row} is {fmt}", row)
        to_messages(record, fmt, row)
        yield fmt, record
    if first is None:
        raise DatasetError("dataset", "the dataset has no records")


# --------------------------------------------------------------------------- entry points


def inspect_dataset(path: Path, declared: str = "auto", *, max_rows: int, max_bytes: int) -> DatasetInfo:
    """Validate every record of ``path`` and describe it; raises DatasetError on the first problem."""
    path = Path(path)
    declared = str(declared)
    _check_declared(declared)
    if not path.is_file():
        raise DatasetError("dataset", f"no such file: {path}")
    size = path.stat().st_size
    if size > max_bytes:
        raise DatasetError("dataset", f"{size} bytes is over the limit of {max_bytes} bytes")
    fmt: Format = "text"
    count = 0
    sample: list[dict[str, Any]] = []
    for row_fmt, record in _validate(iter_records(path), declared, max_rows):
        fmt = row_fmt
        count += 1
        if len(sample) < SAMPLE_ROWS:
            sample.append(record)
    return DatasetInfo(format=fmt, num_rows=count, size_bytes=size, sample=sample)


def load_records(path: Path, declared: str = "auto") -> tuple[Format, list[list[dict[str, str]]]]:
    """Every record of ``path`` as chat turns, with the detected format (the trainer's reader)."""
    declared = str(declared)
    _check_declared(declared)
    fmt: Format = "text"
    rows: list[list[dict[str, str]]] = []
    for row_fmt, record in _validate(iter_records(path), declared, None):
        fmt = row_fmt
        rows.append(to_messages(record, fmt))
    return fmt, rows
