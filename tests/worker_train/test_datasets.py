"""tunebox.datasets: each format is read, each kind of bad file is refused with field and row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunebox.datasets import DatasetError, inspect_dataset, iter_records, load_records

LIMITS = {"max_rows": 1000, "max_bytes": 1 << 20}

ALPACA = [{"instruction": "Add one", "input": "2", "output": "3"}, {"instruction": "Say hi", "output": "hi"}]
SHAREGPT = [{"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"},
                               {"from": "gpt", "value": "hello"}]}]
MESSAGES = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
TEXT = [{"text": "once upon a time"}, {"text": "the end"}]


def _jsonl(tmp_path: Path, rows: list, name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(("rows", "fmt"), [(ALPACA, "alpaca"), (SHAREGPT, "sharegpt"),
                                           (MESSAGES, "openai"), (TEXT, "text")])
def test_detects_each_format_in_jsonl_and_json(tmp_path: Path, rows: list, fmt: str) -> None:
    info = inspect_dataset(_jsonl(tmp_path, rows), **LIMITS)
    assert (info.format, info.num_rows, info.sample) == (fmt, len(rows), rows[:3])
    array = tmp_path / "d.json"
    array.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    info2 = inspect_dataset(array, fmt, **LIMITS)
    assert (info2.format, info2.num_rows) == (fmt, len(rows))
    assert info2.size_bytes == array.stat().st_size


def test_load_records_gives_chat_turns(tmp_path: Path) -> None:
    fmt, rows = load_records(_jsonl(tmp_path, ALPACA + [{"instruction": "x", "input": None, "output": "y"}]))
    assert fmt == "alpaca"
    assert rows[0] == {"messages": [{"role": "user", "content": "Add one\n\n2"},
                                    {"role": "assistant", "content": "3"}]}
    assert rows[2]["messages"][0]["content"] == "x"
    _, conv = load_records(_jsonl(tmp_path, SHAREGPT, "s.jsonl"))
    assert [t["role"] for t in conv[0]["messages"]] == ["system", "user", "assistant"]
    _, text = load_records(_jsonl(tmp_path, TEXT, "t.jsonl"), "text")
    assert text[1] == {"messages": [{"role": "assistant", "content": "the end"}]}


def test_blank_lines_and_bom_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    first, second = (json.dumps(r).encode() for r in TEXT)
    path.write_bytes(b"\xef\xbb\xbf" + first + b"\n\n  \n" + second)
    assert inspect_dataset(path, **LIMITS).num_rows == 2


def _error(path: Path, declared: str = "auto", **limits: int) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        inspect_dataset(path, declared, **{**LIMITS, **limits})
    assert isinstance(info.value, ValueError)
    return info.value


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(TEXT[0]).encode() + b'\n{"text": "\xff\xfe"}\n')
    err = _error(path)
    assert err.field == "dataset" and "UTF-8" in err.message and err.line == 2


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(TEXT[0]) + "\n" + json.dumps(TEXT[1]) + "\n{\"text\": oops}\n")
    err = _error(path)
    assert err.line == 3 and "line 3" in err.message
    array = tmp_path / "d.json"
    array.write_text('[\n {"text": "a"},\n {"text": }\n]')
    assert _error(array).line == 3


def test_mixed_schema(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path, ALPACA + TEXT))
    assert err.field == "dataset" and "mixed" in err.message and err.row == 3


def test_unknown_schema_and_non_objects(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path, [{"question": "q", "answer": "a"}]))
    assert "unknown record schema" in err.message and "answer" in err.message and err.row == 1
    assert "JSON object" in _error(_jsonl(tmp_path, [TEXT[0], [1, 2]])).message


@pytest.mark.parametrize(("row", "field"), [
    ({"instruction": "x"}, "output"),
    ({"instruction": 3, "output": "y"}, "instruction"),
    ({"instruction": "x", "input": [1], "output": "y"}, "input"),
    ({"text": "   "}, "text"),
    ({"conversations": []}, "conversations"),
    ({"conversations": [{"from": "bot", "value": "x"}]}, "conversations[0].from"),
    ({"messages": [{"role": "user", "content": "only a question"}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": 5}]}, "messages[0].content"),
])
def test_bad_records_name_the_field(tmp_path: Path, row: dict, field: str) -> None:
    err = _error(_jsonl(tmp_path, [row]))
    assert err.field == field and err.row == 1


def test_empty_dataset(tmp_path: Path) -> None:
    assert "no records" in _error(_jsonl(tmp_path, [])).message
    array = tmp_path / "d.json"
    array.write_text("[]")
    assert "no records" in _error(array).message


def test_json_must_be_an_array(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('{"data": [1]}\n{"x": 1}')
    assert _error(path).field == "dataset"


def test_row_and_byte_limits(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, TEXT * 3)
    err = _error(path, max_rows=5)
    assert "limit" in err.message and err.row == 6
    assert inspect_dataset(path, max_rows=6, max_bytes=1 << 20).num_rows == 6
    err = _error(path, max_bytes=10)
    assert "over the limit" in err.message


def test_declared_format_must_match(tmp_path: Path) -> None:
    err = _error(_jsonl(tmp_path, ALPACA), "sharegpt")
    assert err.field == "dataset.format" and "alpaca" in err.message
    assert _error(_jsonl(tmp_path, ALPACA), "csv").field == "dataset.format"


def test_missing_file(tmp_path: Path) -> None:
    assert "no such file" in _error(tmp_path / "absent.jsonl").message
    with pytest.raises(DatasetError):
        list(iter_records(tmp_path / "absent.jsonl"))
