"""An in-process token bucket per key (per API token for job submission)."""

from __future__ import annotations

import threading
import time


class TokenBuckets:
    """``rate_per_minute`` tokens per key, refilled continuously, burst up to the same number."""

    def __init__(self, rate_per_minute: int) -> None:
        self.capacity = float(rate_per_minute)
        self.refill_per_s = rate_per_minute / 60.0
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one token; return 0 on success, else the seconds until one is available."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.refill_per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.refill_per_s
