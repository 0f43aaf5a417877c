"""Confining the paths users name in specs to the configured roots.

A path is taken relative to each root in turn, or as given if absolute; symlinks are resolved
before the check, so a link inside a root pointing elsewhere is refused. ``..``, URLs, ``~`` and
NUL bytes are refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from api.errors import InvalidInput

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _refuse(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", errors=[{"field": field, "message": message}])


def _check_form(raw: str, field: str) -> None:
    if "\x00" in raw:
        raise _refuse(field, "contains a NUL byte")
    if _URL.match(raw) or raw.startswith("//"):
        raise _refuse(field, "must be a local path, not a URL")
    if raw.startswith("~"):
        raise _refuse(field, "'~' is not expanded; give the path under a root")
    if ".." in PurePosixPath(raw).parts:
        raise _refuse(field, "'..' is not allowed")


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def confine(raw: str, roots: Sequence[Path], field: str) -> Path:
    """The resolved, existing path if it lies under one of ``roots`` (after resolving symlinks)."""
    _check_form(raw, field)
    if not roots:
        raise _refuse(field, "no root folders are configured for this kind of path on the server")
    real_roots = [Path(r).resolve() for r in roots]
    given = Path(raw)
    bases = [given] if given.is_absolute() else [root / given for root in real_roots]
    inside = [p for p in (b.resolve() for b in bases) if any(_within(p, r) for r in real_roots)]
    if not inside:
        raise _refuse(field, f"{raw} is outside the allowed folders ({', '.join(map(str, roots))})")
    for path in inside:
        if path.exists():
            return path
    raise _refuse(field, f"{raw} does not exist")
