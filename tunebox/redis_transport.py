"""kombu's Redis transport with one redis client per channel for the commands sent outside the poller.

kombu's Redis channel builds a new ``redis.Redis`` object for each such command: every published
message, so every job handed to the workers. Building one costs more CPU than sending the message
(its response callbacks are set up anew each time). Here a channel keeps the one it built and
reuses it while the channel's connection pool is the same: the pool, not the client object, holds
the connections, and a redis client is safe to share between threads. A pool the channel replaced
(after a fork, a disconnect) gets a new client.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]

_create_client: Any = kombu_redis.Channel._create_client


class Channel(kombu_redis.Channel):
    _publish_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return _create_client(self, asynchronous=True)
        client = self._publish_client
        if client is None or client.connection_pool is not self.pool:
            client = self._publish_client = _create_client(self)
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
