"""api.auth.service.TokenCache: a token's lookups run one at a time and known tokens are cached."""

from __future__ import annotations

import asyncio

import pytest

from api.auth.service import Principal, TokenCache

BOB = Principal("usr_bob", "bob", False, "tok_bob", None, None)


class Lookups:
    """A token store that answers after ``delay`` and counts what it was asked."""

    def __init__(self, answer: Principal | None | Exception, delay: float = 0.05) -> None:
        self.answer, self.delay, self.calls = answer, delay, 0

    async def __call__(self, token: str) -> Principal | None:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_requests_that_miss_together_share_one_lookup_and_then_hit_the_cache() -> None:
    async def main() -> None:
        cache, store = TokenCache(60), Lookups(BOB)
        got = await asyncio.gather(*(cache.look_up("t", store) for _ in range(30)))
        assert got == [BOB] * 30 and store.calls == 1
        assert cache.get("t") == BOB
        assert await cache.look_up("t", store) == BOB and store.calls == 2  # look_up always asks

    asyncio.run(main())


def test_an_unknown_token_is_not_cached_and_is_looked_up_again() -> None:
    async def main() -> None:
        cache, store = TokenCache(60), Lookups(None)
        assert await asyncio.gather(cache.look_up("t", store), cache.look_up("t", store)) == [None, None]
        assert store.calls == 1 and cache.get("t") is None
        await cache.look_up("t", store)
        assert store.calls == 2

    asyncio.run(main())


def test_a_failed_lookup_reaches_every_waiter_and_the_next_request_tries_again() -> None:
    async def main() -> None:
        cache, store = TokenCache(60), Lookups(ConnectionError("database gone"))
        results = await asyncio.gather(*(cache.look_up("t", store) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results) and store.calls == 1
        store.answer = BOB
        assert await cache.look_up("t", store) == BOB and store.calls == 2

    asyncio.run(main())


def test_a_cancelled_request_leaves_the_lookup_to_the_others() -> None:
    async def main() -> None:
        cache, store = TokenCache(60), Lookups(BOB, delay=0.1)
        first = asyncio.ensure_future(cache.look_up("t", store))
        second = asyncio.ensure_future(cache.look_up("t", store))
        await asyncio.sleep(0.01)
        first.cancel()
        assert await second == BOB and store.calls == 1
        with pytest.raises(asyncio.CancelledError):
            await first
        assert cache.get("t") == BOB

    asyncio.run(main())


def test_with_the_cache_off_lookups_are_still_shared_but_nothing_is_kept() -> None:
    async def main() -> None:
        cache, store = TokenCache(0), Lookups(BOB)
        assert await asyncio.gather(cache.look_up("t", store), cache.look_up("t", store)) == [BOB, BOB]
        assert store.calls == 1 and cache.get("t") is None

    asyncio.run(main())
