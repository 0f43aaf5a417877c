"""The broker's Redis transport (tunebox.redis_transport): one redis client per channel for its
publishes, the messages those of kombu's own transport; the run task put on its queue
(``enqueue_job``) as Celery's ``send_task`` writes it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.connection import Connection as KombuConnection

from tunebox.broker import GPU_QUEUE, RUN_JOB_TASK, make_celery
from tunebox.redis_transport import Channel
from tunebox.settings import Settings

StockConnection: Any = KombuConnection  # kombu's, with its own Redis transport


def test_a_redis_broker_publishes_through_one_client_per_channel(redis_url: str) -> None:
    app = make_celery(Settings(broker_url=redis_url))
    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, Channel)
        channel: Any = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first  # kombu's own builds one per command
        assert first.connection_pool is channel.pool
        channel._disconnect_pools()  # as after a fork: the channel makes a new pool
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool
        assert channel._create_client(asynchronous=True) is not again  # the poller's: kombu's own


def test_messages_are_read_by_kombus_own_redis_transport(redis_url: str) -> None:
    """What a worker consuming with the stock transport receives: each task, once, in order, with
    its id and the job id (tests/api/test_celery.py runs a real worker on it)."""
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{GPU_QUEUE}*"):
        client.delete(key)
    app = make_celery(Settings(broker_url=redis_url))
    sent = [(f"job_{n}", str(uuid.uuid4())) for n in range(3)]
    for job_id, task_id in sent:
        app.send_task(RUN_JOB_TASK, args=[job_id], queue=GPU_QUEUE, task_id=task_id)
    received = []
    with StockConnection(redis_url) as conn:
        assert type(conn.default_channel).__module__ == "kombu.transport.redis"
        queue = conn.SimpleQueue(GPU_QUEUE)
        for _ in sent:
            message = queue.get(timeout=5)
            received.append((message.payload[0][0], message.headers["id"], message.headers["task"]))
            message.ack()
        queue.close()
    assert received == [(job_id, task_id, RUN_JOB_TASK) for job_id, task_id in sent]


def test_other_brokers_keep_their_transport() -> None:
    app = make_celery(Settings(broker_url="memory://"))
    assert app.conf.broker_transport is None


@contextlib.contextmanager
def _broker_at(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``enqueue_job`` as the API runs it (its settings and Celery app built anew), sending to ``url``."""
    from tunebox import broker
    from tunebox.settings import get_settings

    monkeypatch.setenv("TUNEBOX_BROKER_URL", url)
    get_settings.cache_clear()
    broker.get_celery.cache_clear()
    try:
        yield
    finally:
        get_settings.cache_clear()
        broker.get_celery.cache_clear()


@pytest.fixture
def redis_enqueue(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """``enqueue_job`` on this session's Redis; its queue empty."""
    with _broker_at(redis_url, monkeypatch):
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{GPU_QUEUE}*"):
            client.delete(key)
        yield client


def _queued(client: redis.Redis) -> dict[bytes, list[dict[str, Any]]]:
    """Every list of the queue (one per priority step) and its raw messages, oldest first."""
    return {key: [json.loads(m) for m in reversed(client.lrange(key, 0, -1))]
            for key in client.scan_iter(match=f"{GPU_QUEUE}*") if client.type(key) == b"list"}


def test_enqueue_job_sends_the_task_as_celery_writes_it(redis_enqueue: redis.Redis, redis_url: str) -> None:
    """``enqueue_job``'s message: the job id, the task id, and the headers'
    display of the arguments as Celery's saferepr writes it."""
    from celery.utils.saferepr import saferepr

    from tunebox import broker

    task_id = str(uuid.uuid4())
    assert broker.enqueue_job("job_0abc9", priority=7, task_id=task_id) == task_id
    with StockConnection(redis_url) as conn:
        queue = conn.SimpleQueue(GPU_QUEUE)
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    assert message.payload[0] == ["job_0abc9"] and message.headers["id"] == task_id
    assert message.headers["argsrepr"] == saferepr(["job_0abc9"], 1024)
    assert message.headers["kwargsrepr"] == saferepr({}, 1024)


@pytest.mark.parametrize("priority", [100, 30, 0, -100])
def test_enqueue_job_stores_the_message_send_task_stores(redis_enqueue: redis.Redis, priority: int) -> None:
    """Byte for byte the message of Celery's ``send_task`` with the same ids, in the same priority
    list, but for the delivery tag kombu draws for each message."""
    from tunebox import broker

    task_id = str(uuid.uuid4())
    assert broker.enqueue_job("job_0abc9", priority=priority, task_id=task_id) == task_id
    ours = _queued(redis_enqueue)
    for key in ours:
        redis_enqueue.delete(key)
    broker.get_celery().send_task(RUN_JOB_TASK, args=["job_0abc9"], queue=GPU_QUEUE, task_id=task_id,
                                  priority=broker._celery_priority(priority),
                                  argsrepr="['job_0abc9']", kwargsrepr="{}")
    theirs = _queued(redis_enqueue)
    assert list(ours) == list(theirs) and len(next(iter(ours.values()))) == 1
    (key, [mine]), [other] = next(iter(ours.items())), theirs[key]
    assert mine["properties"].pop("delivery_tag") != other["properties"].pop("delivery_tag")
    assert mine == other


def test_enqueue_job_from_many_threads_sends_each_task_once(redis_enqueue: redis.Redis,
                                                            redis_url: str) -> None:
    from tunebox import broker

    sent = [(f"job_{n}", str(uuid.uuid4())) for n in range(120)]

    def send(part: list[tuple[str, str]]) -> None:
        for job_id, task_id in part:
            broker.enqueue_job(job_id, priority=0, task_id=task_id)

    threads = [threading.Thread(target=send, args=(sent[n::6],)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    received = []
    with StockConnection(redis_url) as conn:
        queue = conn.SimpleQueue(GPU_QUEUE)
        for _ in sent:
            message = queue.get(timeout=5)
            received.append((message.payload[0][0], message.headers["id"]))
            message.ack()
        queue.close()
    assert sorted(received) == sorted(sent) and _queued(redis_enqueue) == {}


def _redis_server(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return server
        except redis.ConnectionError:
            time.sleep(0.05)
    raise AssertionError(f"redis-server on port {port} did not start")


def test_a_send_outlives_a_broker_restart_within_celerys_publish_retries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's publish retry policy (three more tries over 0.6 s): a broker back within it gets the
    message; one that stays down fails the send, which leaves the job to the reconciler."""
    from tunebox import broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _redis_server(port)
    servers = [server]
    with _broker_at(f"redis://127.0.0.1:{port}/0", monkeypatch):
        try:
            broker.enqueue_job("job_before", task_id=str(uuid.uuid4()))
            server.terminate()
            server.wait()
            started = time.monotonic()
            with pytest.raises(redis.ConnectionError):
                broker.enqueue_job("job_down", task_id=str(uuid.uuid4()))
            assert 0.5 < time.monotonic() - started < 5
            restart = threading.Timer(0.1, lambda: servers.append(_redis_server(port)))
            restart.start()
            task_id = str(uuid.uuid4())
            broker.enqueue_job("job_back", task_id=task_id)
            restart.join()
            queued = [m for ms in _queued(redis.Redis(port=port)).values() for m in ms]
            assert [m["headers"]["id"] for m in queued] == [task_id]
        finally:
            for each in servers:
                each.kill()
