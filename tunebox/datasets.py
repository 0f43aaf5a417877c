"""Reading and validating fine-tuning datasets (pure Python: the API validates uploads with it).

A dataset is a ``.json`` file holding one JSON array of records, or JSON Lines (one record per
line; blank lines are skipped). The container is sniffed from the content, not the file name, so
an upload stored under any name reads the same. Every record of a dataset has one schema, one of
``alpaca``, ``sharegpt``, ``openai`` and ``text`` (see :mod:`tunebox.dataset_formats` and
``docs/datasets.md``); fields tunebox does not train (preference data, media) are refused.

Other extra keys in a record are ignored. Problems raise :class:`DatasetError`, whose ``field`` names
what is wrong (``"dataset"`` for the file as a whole, ``"dataset.format"`` for a declared format
that does not match, otherwise the key inside the record such as ``"output"`` or
``"conversations[2].from"``) and whose ``row`` is the 1-based record number where one applies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tunebox import dataset_formats as formats
from tunebox.dataset_formats import FORMATS, Conversation, Format

__all__ = [
    "FORMATS",
    "Conversation",
    "DatasetError",
    "DatasetInfo",
    "Format",
    "detect_format",
    "inspect_dataset",
    "iter_records",
    "load_records",
    "resolve_source",
    "to_conversation",
    "to_messages",
]

SAMPLE_ROWS = 3


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


# --------------------------------------------------------------------------- LLaMA-Factory dataset_info.json

_INFO_SOURCES = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
_INFO_UNTRAINED = {"chosen": "preference pairs (DPO/ORPO)", "rejected": "preference pairs (DPO/ORPO)",
                   "kto_tag": "KTO labels", "images": "images", "videos": "video", "audios": "audio"}


@dataclass(frozen=True)
class Source:
    """Where the records are and how to read them: a data file, or one entry of a dataset_info.json."""

    path: Path
    declared: str
    mapping: dict[str, str] | None = None
    entry: str | None = None


def _info_entries(path: Path) -> dict[str, Any] | None:
    """The entries of a LLaMA-Factory ``dataset_info.json``, or None when ``path`` is a data file."""
    if _first_char(path) != "{" or path.stat().st_size > 16 << 20:
        return None
    try:
        data = json.loads(_decode(path.read_bytes(), None).lstrip("\ufeff"))
    except (json.JSONDecodeError, DatasetError):
        return None
    if isinstance(data, dict) and data and all(
            isinstance(v, dict) and any(k in v for k in _INFO_SOURCES) for v in data.values()):
        return data
    return None


def _entry_source(info_path: Path, entries: dict[str, Any], name: str | None, declared: str) -> Source:
    if name is None or name not in entries:
        listed = ", ".join(sorted(entries)[:20])
        what = "a dataset_info.json needs dataset.name" if name is None else f"no entry {name!r}"
        raise DatasetError("dataset.name", f"{what}; its entries: {listed}")
    entry = entries[name]
    where = f"dataset_info.json entry {name!r}"
    if "file_name" not in entry:
        raise DatasetError("dataset.name", f"{where} names no local file_name (hub datasets are not "
                           "downloaded); download it and point file_name at it")
    if entry.get("ranking"):
        raise DatasetError("dataset.name", f"{where}: ranking (preference) data is not trained")
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        raise DatasetError("dataset.name", f"{where}: columns and tags must be objects")
    for key, what in _INFO_UNTRAINED.items():
        if key in columns:
            raise DatasetError("dataset.name", f"{where}: columns.{key} holds {what}, which tunebox does "
                               "not train (supervised chat and text only)")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise DatasetError("dataset.name", f"{where}: formatting {formatting!r} (alpaca or sharegpt)")
    if formatting == "alpaca" and "prompt" in columns and "response" not in columns and len(columns) == 1:
        formatting = "text"  # LLaMA-Factory's pre-training entries: one text column, trained whole
    if declared not in ("auto", formatting):
        raise DatasetError("dataset.format", f"declared {declared} but {where} is {formatting}")
    data = (info_path.parent / str(entry["file_name"])).resolve()
    if not data.is_file():
        raise DatasetError("dataset.name", f"{where}: file_name {entry['file_name']} is not a file next to "
                           "dataset_info.json")
    return Source(path=data, declared=formatting, mapping={**columns, **tags}, entry=name)


def resolve_source(path: Path, declared: str = "auto", name: str | None = None) -> Source:
    """The data file behind ``path``: itself, or the entry ``name`` of a LLaMA-Factory dataset_info.json."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError("dataset", f"no such file: {path}")
    entries = _info_entries(path)
    if entries is None:
        if name is not None:
            raise DatasetError("dataset.name", f"{path.name} is a data file, not a dataset_info.json")
        return Source(path=path, declared=declared)
    return _entry_source(path, entries, name, declared)


# --------------------------------------------------------------------------- schemas


def detect_format(record: dict[str, Any], row: int | None = None) -> Format:
    """The schema of one record, or a DatasetError naming the keys it has (or what it holds untrained)."""
    try:
        formats.refuse_untrainable(record)
    except formats.FormatError as exc:
        raise DatasetError(exc.field, exc.message, row) from None
    found = formats.detect_format(record)
    if found is not None:
        return found
    keys = ", ".join(sorted(record)) or "none"
    raise DatasetError("dataset", f"unknown record schema (keys: {keys}); expected alpaca "
                       "{instruction, input?, output}, sharegpt {conversations}, openai {messages} or "
                       "text {text}", row)


def to_conversation(record: dict[str, Any], fmt: Format, row: int | None = None,
                    mapping: dict[str, str] | None = None) -> Conversation:
    """A record as ``{"messages": [...], "tools"?: [...]}`` (see :mod:`tunebox.dataset_formats`)."""
    try:
        formats.refuse_untrainable(record)
        return formats.PARSERS[fmt](record, mapping)
    except formats.FormatError as exc:
        raise DatasetError(exc.field, exc.message, row) from None


def to_messages(record: dict[str, Any], fmt: Format, row: int | None = None) -> list[dict[str, Any]]:
    """A record's chat turns; a text record is one assistant turn."""
    messages: list[dict[str, Any]] = to_conversation(record, fmt, row)["messages"]
    return messages


def _check_declared(declared: str) -> None:
    if declared != "auto" and declared not in FORMATS:
        raise DatasetError("dataset.format", f"unknown format {declared!r}; use one of "
                           f"{', '.join(FORMATS)} or auto")


def _validate(source: Source, max_rows: int | None) -> Iterator[tuple[Format, dict[str, Any], Conversation]]:
    first: Format | None = None
    declared, mapping = source.declared, source.mapping
    for row, record in enumerate(iter_records(source.path), start=1):
        if max_rows is not None and row > max_rows:
            raise DatasetError("dataset", f"more than {max_rows} rows (the limit)", row)
        # an entry's mapping renames the keys detection looks at: its formatting says the schema
        fmt = cast(Format, declared) if mapping is not None else detect_format(record, row)
        if first is None:
            first = fmt
            if declared != "auto" and fmt != declared:
                raise DatasetError("dataset.format", f"declared {declared} but the records are {fmt}", row)
        elif fmt != first:
            raise DatasetError("dataset", f"mixed schemas: row 1 is {first}, row {row} is {fmt}", row)
        yield fmt, record, to_conversation(record, fmt, row, mapping)
    if first is None:
        raise DatasetError("dataset", "the dataset has no records")


# --------------------------------------------------------------------------- entry points


def inspect_dataset(path: Path, declared: str = "auto", *, max_rows: int, max_bytes: int,
                    name: str | None = None) -> DatasetInfo:
    """Validate every record of ``path`` (or of its entry ``name``) and describe it; raises DatasetError
    on the first problem."""
    declared = str(declared)
    _check_declared(declared)
    source = resolve_source(Path(path), declared, name)
    size = source.path.stat().st_size
    if size > max_bytes:
        raise DatasetError("dataset", f"{size} bytes is over the limit of {max_bytes} bytes")
    fmt: Format = "text"
    count = 0
    sample: list[dict[str, Any]] = []
    for row_fmt, record, _ in _validate(source, max_rows):
        fmt = row_fmt
        count += 1
        if len(sample) < SAMPLE_ROWS:
            sample.append(record)
    return DatasetInfo(format=fmt, num_rows=count, size_bytes=size, sample=sample)


def load_records(path: Path, declared: str = "auto", name: str | None = None
                 ) -> tuple[Format, list[Conversation]]:
    """Every record of ``path`` (or of its entry ``name``) as a conversation, with the format (the
    trainer's reader)."""
    declared = str(declared)
    _check_declared(declared)
    fmt: Format = "text"
    rows: list[Conversation] = []
    for row_fmt, _, conversation in _validate(resolve_source(Path(path), declared, name), None):
        fmt = row_fmt
        rows.append(conversation)
    return fmt, rows


def check_dropped_share(report: dict[str, Any], max_share: float, where: str = "of the training split"
                        ) -> str | None:
    """Why the rows dropped are too many (with the counts), or None. The trainer checks its training
    split; the API, at submission, a report of the whole file (``where`` says which)."""
    rows, dropped = report["rows"], report["dropped_rows"]
    if rows and dropped / rows > max_share:
        numbers = ", ".join(map(str, report["dropped_row_numbers"][:10]))
        more = ", ..." if dropped > 10 else ""
        return (f"{dropped} of {rows} rows ({dropped / rows:.1%}) would be dropped: no answer token within "
                f"seq_len {report['seq_len']} (rows {numbers}{more} {where}); the limit is "
                f"{max_share:.1%} (dataset.max_dropped_fraction). Raise seq_len, shorten the prompts, or "
                "raise the limit")
    return None
