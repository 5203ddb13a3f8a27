"""outboxd's RabbitMQ provider against a raw pika client publishing with confirms: the same
broker, the same messages (persistent, ``message_id``, the provider's headers), the same
number of publishing threads, each with one connection and one confirm-mode channel.

Run as ``python -m bench.rabbitmq_compare [MESSAGES]`` (a scratch database), or from ``make bench``
(skipped, with a line saying so, when no broker listens on 127.0.0.1:5672).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pika

from bench.daemon_runs import drain, fill, prepare

URL = "amqp://127.0.0.1:5672/%2F"


def available() -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(URL)).close()
    except Exception:
        return False
    return True


def raw_pika(queue: str, messages: int, concurrency: int) -> float:
    """Messages per second, published with confirms by ``concurrency`` threads."""
    local = threading.local()

    def channel() -> object:
        if getattr(local, "channel", None) is None:
            conn = pika.BlockingConnection(pika.URLParameters(URL))
            local.channel = conn.channel()
            local.channel.confirm_delivery()
        return local.channel

    def publish(i: int) -> None:
        channel().basic_publish(  # type: ignore[attr-defined]
            "", queue, json.dumps({"n": i, "text": "benchmark payload"}).encode(),
            pika.BasicProperties(
                content_type="application/json", delivery_mode=pika.DeliveryMode.Persistent,
                message_id=f"bench:op:{i}",
                headers={"outbox-operation-id": f"op:{i}", "outbox-fencing-token": 1,
                         "outbox-tenant": "bench"}),
            mandatory=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(publish, range(messages)))
    return messages / (time.perf_counter() - t0)


def compare(dsn: str, messages: int, concurrency: int = 32) -> tuple[float, float]:
    """(outboxd rows/s, raw pika messages/s), each into a fresh durable queue."""
    queues = [f"outbox-bench-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    admin = pika.BlockingConnection(pika.URLParameters(URL))
    channel = admin.channel()
    try:
        for q in queues:
            channel.queue_declare(q, durable=True)
        raw = raw_pika(queues[0], messages, concurrency)
        prepare(dsn)
        fill(dsn, messages, provider="mq")
        provider = (f'[providers.mq]\nkind = "rabbitmq"\nurl = "{URL}"\n'
                    f'routing_key = "{queues[1]}"\n')
        ours = drain(dsn, messages, batch=concurrency, provider=provider)["rows_per_s"]
    finally:
        for q in queues:
            channel.queue_delete(q)
        admin.close()
    return ours, raw


if __name__ == "__main__":
    from bench.harness import scratch_database

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
    with scratch_database() as scratch:
        ours, raw = compare(scratch, count)
    print(f"outboxd rabbitmq {ours:,.0f} rows/s, raw pika {raw:,.0f} msg/s, "
          f"ratio {ours / raw:.2f}")
