"""What training would make of a dataset: ``python -m worker.inspect_data FILE --model DIR --seq-len N``.

Tokenises every record with the model's tokenizer and chat template, exactly as the trainer does, and
prints one JSON object: the format, rows, tokens per row (p50/p95/max), rows truncated, rows dropped and
why, tokens and trained tokens, and one rendered example with its trained spans (also marked inline
between \u27e6 and \u27e7). Exit 2 with ``{"error": {"field", "message", "row"}}`` for a bad dataset or model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["inspect_file", "main"]


def inspect_file(
    path: Path, model: Path, seq_len: int, declared: str = "auto", name: str | None = None
) -> dict[str, Any]:
    """The report of :func:`worker._trainlib.data.encode_report` for every record of ``path``."""
    from tunebox.datasets import load_records
    from worker._trainlib.data import encode_report, marked_example
    from worker._trainlib.modeling import load_tokenizer

    fmt, rows = load_records(path, declared, name)
    tokenizer = load_tokenizer(model)
    _, report = encode_report(tokenizer, rows, fmt, seq_len)
    example = marked_example(tokenizer, rows[0], fmt) if rows else None
    return {"format": fmt, **report, "example": example}


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m worker.inspect_data", description=summary)
    parser.add_argument("file", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="a local Hugging Face model folder")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--format", default="auto")
    parser.add_argument("--name", default=None, help="the entry of a LLaMA-Factory dataset_info.json")
    args = parser.parse_args(argv)
    from tunebox.datasets import DatasetError
    from worker._trainlib.runfile import JobFailure

    try:
        report = inspect_file(args.file, args.model, args.seq_len, args.format, args.name)
    except DatasetError as exc:
        print(json.dumps({"error": {"field": exc.field, "message": exc.message, "row": exc.row}}))
        return 2
    except JobFailure as exc:
        print(json.dumps({"error": {"field": "model.path", "message": str(exc), "row": None}}))
        return 2
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
