"""The identity of a dataset file and of a model's tokenizer, for keeping what training made of them.

A key changes when the data or the tokenizer changes: a file by its resolved path, size and mtime (a
stored dataset's file is written once), a model by its tokenizer files' paths, sizes and mtimes. The
API, the inspection and the trainer compute the same keys (``store/dataset_reports.py`` keeps the
reports under them).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: the files a Hugging Face tokenizer and its chat template are read from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json")


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()


def _stat(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def report_keys(dataset: Path, model: Path) -> tuple[str, str] | None:
    """The keys of a dataset file and of a model folder's tokenizer; None where the folder holds no
    tokenizer file or the file cannot be read."""
    try:
        found = [_stat(model / name) for name in TOKENIZER_FILES if (model / name).is_file()]
        return (_digest("file", *_stat(dataset)), _digest("tokenizer", *found)) if found else None
    except OSError:
        return None
