"""Prefixed, sortable, unguessable ids: ``job_01J...``-style (time-ordered prefix + randomness)."""

from __future__ import annotations

import re
import secrets
import time

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 36)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """``prefix_`` + 9 chars of milliseconds (sortable by creation) + 12 random chars."""
    millis = int(time.time() * 1000)
    return f"{prefix}_{_base36(millis, 9)}{_base36(secrets.randbits(62), 12)}"


def id_pattern(prefix: str) -> re.Pattern[str]:
    """What ``new_id(prefix)`` makes, to find such ids in text."""
    return re.compile(rf"\b{re.escape(prefix)}_[0-9a-z]{{21}}\b")
