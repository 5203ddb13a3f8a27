"""The Redis Streams provider under faults, against a real, throwaway ``redis-server``
(its own port and data, ``appendfsync always``): the dispatcher is SIGKILLed, and the
server is SIGKILLed and started again on the same data, in the middle of a drain; the
stream's entries are counted by idempotency key.

The writer deduplicates (the key's time to live is the declared window) and the look-up is
strong, so every operation ends ``applied`` with exactly one entry:

- once the first dispatcher has started, the server is frozen (SIGSTOP) and the first half
  staged; the dispatcher is killed once the server holds appends it sent, which the server
  does once continued. The operations the killed dispatcher left ``dispatching`` go
  ``unknown`` and the look-up settles each: found → applied, not found → sent again;
- the next dispatcher drains the first half; the server is frozen, the second half staged,
  and the server killed once it holds appends of it: those appends are ambiguous, and are
  repeated inside the window, where the script appends only what was not appended."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from providers.redis_stream import APPEND_ONCE
from tests.dispatcher import both, engine_at, key_of, rows, stage, url_for
from tests.support.daemon import DaemonProcess, status_counts, wait_until, write_config
from tests.support.redis_server import RedisServer

N = 300
STREAM = "effects"
pytestmark = pytest.mark.slow


def entries_per_key(server: RedisServer) -> Counter[str]:
    client = server.client()
    try:
        return Counter(fields[b"idempotency_key"].decode()
                       for _, fields in client.xrange(STREAM))
    finally:
        client.close()


@pytest.mark.parametrize("dialect", both())
def test_kills_and_a_server_restart_leave_exactly_one_entry_per_operation(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    db_url = url_for(request, dialect)
    with RedisServer(tmp_path / "redis") as server, engine_at(db_url) as engine:
        cfg = write_config(tmp_path, db_url, {"bus": {
            "kind": "redis_stream", "url": server.url, "stream": STREAM,
            "key_ttl_seconds": 600, "timeout_seconds": 2, "in_flight_seconds": 2,
            "max_attempts": 20, "max_elapsed_seconds": 600, "retry_max_delay_seconds": 0.5}},
            dispatcher={"lease_seconds": 2, "batch_size": 10, "concurrency": 4})
        loaded = server.client()
        loaded.script_load(APPEND_ONCE)  # what it holds when frozen is appends, not NOSCRIPT
        loaded.close()
        kills = 0
        with DaemonProcess(cfg) as first:
            wait_until(lambda: "dispatcher started" in first.log_text(), timeout=60,
                       message="the dispatcher started")
            server.pause()  # the appends it holds are done only after their sender has died
            ids = stage(engine, N // 2, provider="bus")
            wait_until(lambda: server.unread_bytes() > 0, timeout=30,
                       message="an append in flight to the frozen server")
            first.signal(signal.SIGKILL)
            first.wait()
            kills += 1
        server.resume()
        with DaemonProcess(cfg):
            wait_until(lambda: status_counts(engine).get("applied", 0) == N // 2, timeout=60,
                       message="the first half applied")
            server.pause()  # frozen with appends in flight: they can only time out or break
            ids += stage(engine, N - N // 2, provider="bus", start=N // 2)
            wait_until(lambda: server.unread_bytes() > 0, timeout=30,
                       message="an append in flight to the frozen server")
            server.restart()
            wait_until(lambda: status_counts(engine).get("applied", 0) == N, timeout=120,
                       interval=0.2, message="every operation applied")
        seen = entries_per_key(server)
        settled = rows(engine, "SELECT reason, count(*) AS n FROM outbox_events WHERE "
                               "from_status = 'unknown' GROUP BY reason")
        ambiguous = rows(engine, "SELECT count(*) AS n FROM outbox_attempts "
                                 "WHERE result_class = 'ambiguous'")[0]["n"]
    assert set(seen) == {key_of(op) for op in ids}  # nothing lost, nothing foreign
    assert max(seen.values()) == 1, "an entry was appended twice"
    by_reason = {r["reason"]: r["n"] for r in settled}
    assert set(by_reason) <= {"reconciled_found", "reconciled_not_applied"}
    assert by_reason.get("reconciled_found", 0) >= 1  # appended after its sender died
    assert ambiguous >= 1  # the append the frozen server held when it was killed
    print(f"redis_stream chaos [{dialect}]: {N} operations, {kills} kill(s), "
          f"{server.restarts} server restart(s): {N} applied, {sum(seen.values())} entries, "
          f"0 duplicates; unknowns settled by look-up: "
          f"{by_reason.get('reconciled_found', 0)} found, "
          f"{by_reason.get('reconciled_not_applied', 0)} not found (sent again); "
          f"{ambiguous} ambiguous attempt(s) repeated in the window")
