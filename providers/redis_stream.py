"""The ``redis_stream`` provider: append each operation to a Redis stream, once per key
for a declared window.

Client: ``redis-py`` (the ``redis`` extra) — Redis's own maintained Python client; its
connection pool is thread-safe, so the dispatcher's send threads share it.

**The append is a server-side script** (atomic: Redis runs a script alone)::

    GET <key_prefix><idempotency key>        -- seen within the window?
      → yes: return the entry id recorded for it (a replay, nothing appended)
      → no:  XADD <stream> [MAXLEN ~ n] * fields…  and  SET <key> <entry id> PX <ttl>

So the *writer* gives the stream a real deduplication window: the key's time to live
(``key_ttl_seconds``), declared as ``dedup_retention_seconds``. A repeated key inside it
returns the first entry's id and appends nothing.

**Look-up**: the key names its entry, so ``GET`` answers FOUND (with the entry id) or —
while the window since the operation's first dispatch is still open — NOT_FOUND: declared
``strong``. Once that window may have closed, a missing key proves nothing (it may have
expired), so the look-up answers UNSUPPORTED and the operation waits for a person.

The entry's fields: ``payload`` (the payload as JSON), ``operation_id``, ``tenant``,
``fencing_token``, ``idempotency_key`` and ``traceparent`` (when the row has one).

| what happened | outcome |
|---|---|
| appended | ``APPLIED`` (receipt: stream, entry id) |
| the key is there (a repeat inside the window) | ``APPLIED``, ``replayed`` (first entry's id) |
| no connection (refused, timed out connecting) | ``RETRYABLE``, ``before_write`` |
| the server refused before writing (OOM, READONLY, LOADING, BUSY, …) | ``RETRYABLE`` |
| the stream's key holds another type (WRONGTYPE) | ``REJECTED`` |
| the connection broke or timed out after the script was sent | ``AMBIGUOUS``, ``after_write`` |

The window holds only if the server keeps the keys: at start-up the provider refuses a
server that may evict them (``maxmemory`` set with a policy other than ``noeviction``),
and warns when acknowledged appends can be lost on a crash (``appendonly`` off, or
``appendfsync`` not ``always``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import urlsplit

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from outbox.credential_refs import resolve_secret
from outbox.errors import ProviderConfigError
from providers.base import (
    Capabilities,
    Dispatch,
    LookupConsistency,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
    TransportPhase,
)
from providers.options import SectionReader, read_capabilities

log = logging.getLogger("outboxd.providers.redis_stream")
KIND: Final = "redis_stream"
LOOKUP_MARGIN: Final = 0.1
"""A missing key counts as NOT_FOUND only within the first 90% of the window (the
database's and the server's clocks may differ)."""

APPEND_ONCE: Final = """
local id = redis.call('GET', KEYS[2])
if id then return {0, id} end
if tonumber(ARGV[2]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {1, id}
"""
_REFUSED_BEFORE_WRITING: Final = ("OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN",
                                  "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN", "MISCONF")


class RedisStreamProvider:
    """Appends one dispatch per call; safe to call from many threads at once."""

    def __init__(self, name: str, *, client: redis.Redis, stream: str, key_prefix: str,
                 key_ttl_seconds: float, max_length: int, capabilities: Capabilities) -> None:
        self.name = name
        self.stream = stream
        self.key_prefix = key_prefix
        self.key_ttl_seconds = key_ttl_seconds
        self.max_length = max_length
        self.capabilities = capabilities
        self._client = client
        self._sha = hashlib.sha1(APPEND_ONCE.encode(), usedforsecurity=False).hexdigest()

    def __repr__(self) -> str:
        return f"RedisStreamProvider(name={self.name!r}, stream={self.stream!r})"

    def stream_for(self, dispatch: Dispatch) -> str:
        return self.stream.format(tenant_id=dispatch.tenant_id)

    def key_for(self, dispatch: Dispatch) -> str:
        return f"{self.key_prefix}{dispatch.idempotency_key}"

    def send(self, dispatch: Dispatch) -> Outcome:
        stream = self.stream_for(dispatch)
        fields: list[str] = [
            "payload", json.dumps(dispatch.payload, separators=(",", ":"), ensure_ascii=False),
            "operation_id", dispatch.operation_id,
            "tenant", dispatch.tenant_id,
            "fencing_token", str(dispatch.fencing_token),
            "idempotency_key", dispatch.idempotency_key,
        ]
        if dispatch.traceparent:
            fields += ["traceparent", dispatch.traceparent]
        args = [str(int(self.key_ttl_seconds * 1000)), str(self.max_length), *fields]
        pool = self._client.connection_pool
        try:
            conn = pool.get_connection()
        except (redis.exceptions.RedisError, OSError) as exc:  # nothing was written
            return _failure(OutcomeKind.RETRYABLE, TransportPhase.BEFORE_WRITE, exc,
                            "could not connect to the server")
        try:
            reply = self._run(conn, [stream, self.key_for(dispatch)], args)
        except redis.exceptions.BusyLoadingError as exc:  # a reply: the script did not run
            return _failure(OutcomeKind.RETRYABLE, TransportPhase.RESPONSE, exc,
                            "the server is loading its data")
        except redis.exceptions.ResponseError as exc:
            return _refusal(exc)
        except (redis.exceptions.RedisError, OSError) as exc:  # sent: it may have run
            self._drop(conn)
            return _failure(OutcomeKind.AMBIGUOUS, TransportPhase.AFTER_WRITE, exc,
                            "the connection broke before the server answered")
        finally:
            pool.release(conn)
        appended, entry = int(reply[0]), _text(reply[1])
        receipt = {"stream": stream, "entry_id": entry, "replayed": not appended}
        return Outcome(OutcomeKind.APPLIED, receipt=receipt, replayed=not appended,
                       evidence={"entry_id": entry})

    @staticmethod
    def _drop(conn: Any) -> None:
        conn.disconnect()

    def _run(self, conn: Any, keys: list[str], args: list[str]) -> Any:
        try:
            conn.send_command("EVALSHA", self._sha, len(keys), *keys, *args)
            return conn.read_response()
        except redis.exceptions.NoScriptError:  # a restarted server forgot the script
            conn.send_command("EVAL", APPEND_ONCE, len(keys), *keys, *args)
            return conn.read_response()

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        observed = datetime.now(UTC)
        key = self.key_for(dispatch)
        try:
            entry = self._client.get(key)
        except (redis.exceptions.RedisError, OSError) as exc:
            return LookupResult(LookupKind.INDETERMINATE, observed_at=observed,
                                evidence={"error_class": type(exc).__name__})
        stream = self.stream_for(dispatch)
        if entry is not None:
            return LookupResult(LookupKind.FOUND, observed_at=observed,
                                receipt={"stream": stream, "entry_id": _text(entry)},
                                evidence={"entry_id": _text(entry)})
        since = dispatch.first_dispatched_at or dispatch.created_at
        trusted = timedelta(seconds=self.key_ttl_seconds * (1 - LOOKUP_MARGIN))
        if since is None or observed - since >= trusted:
            return LookupResult(LookupKind.UNSUPPORTED, observed_at=observed, evidence={
                "key": "missing, and the window may have closed: it may have expired"})
        return LookupResult(LookupKind.NOT_FOUND, observed_at=observed,
                            evidence={"stream": stream, "key": "missing"})

    def close(self) -> None:
        self._client.close()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _failure(kind: OutcomeKind, phase: TransportPhase, exc: BaseException,
             reason: str) -> Outcome:
    return Outcome(kind, transport_phase=phase, error_class=type(exc).__name__, reason=reason)


def _refusal(exc: redis.exceptions.ResponseError) -> Outcome:
    """An error reply: the server answered, so whether anything was written is known."""
    code = str(exc).split(" ", 1)[0].upper()
    if code in _REFUSED_BEFORE_WRITING or isinstance(
            exc, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError):
        return _failure(OutcomeKind.RETRYABLE, TransportPhase.RESPONSE, exc,
                        f"the server refused before writing ({code})")
    if code == "WRONGTYPE":
        return _failure(OutcomeKind.REJECTED, TransportPhase.RESPONSE, exc,
                        "the stream's key holds a value of another type")
    # an error from inside the script after it may have written: the look-up decides
    return _failure(OutcomeKind.AMBIGUOUS, TransportPhase.RESPONSE, exc,
                    f"the script failed ({code})")


def build_redis_stream(name: str, reader: SectionReader) -> RedisStreamProvider:
    """Build from a ``[providers.NAME]`` table with ``kind = "redis_stream"``."""
    if reader.has("dedup_retention_seconds"):
        raise reader.error("dedup_retention_seconds",
                           "is the key's time to live: set key_ttl_seconds instead")
    url = reader.string("url", "redis://127.0.0.1:6379/0")
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise reader.error("url", "must be a redis:// or rediss:// URL with a host")
    if parts.password:
        raise reader.error("url", "must not carry a password: set password = \"env:NAME\"")
    stream = reader.string("stream", required=True)
    try:
        stream.format(tenant_id="t")
    except (KeyError, IndexError, ValueError):
        raise reader.error("stream", "may only use {tenant_id}") from None
    key_prefix = reader.string("key_prefix", f"outboxd:key:{stream}:")
    ttl = reader.number("key_ttl_seconds", 86400.0, exclusive_minimum=True)
    max_length = reader.integer("max_length", 0, minimum=0)
    user = reader.optional_string("user")
    password = (resolve_secret(reader.raw("password"), reader.key("password")).reveal()
                if reader.has("password") else None)
    declared = read_capabilities(reader, lookup_available=True,
                                 default_consistency=LookupConsistency.STRONG)
    reader.finish()
    if ttl * 1000 < 1:
        raise reader.error("key_ttl_seconds", "must be at least 0.001")
    capabilities = dataclasses.replace(declared, dedup_retention_seconds=ttl)
    client = redis.Redis.from_url(
        url, username=user, password=password, socket_timeout=capabilities.timeout_seconds,
        socket_connect_timeout=capabilities.timeout_seconds,
        retry=Retry(NoBackoff(), 0),  # one attempt per send: the dispatcher retries
        protocol=2, driver_info=None)  # no HELLO, no CLIENT SETINFO: a new connection's
    # first command is the append (one round trip, and nothing else that can hang)
    check_server(name, client)
    return RedisStreamProvider(name, client=client, stream=stream, key_prefix=key_prefix,
                               key_ttl_seconds=ttl, max_length=max_length,
                               capabilities=capabilities)


def check_server(name: str, client: redis.Redis) -> None:
    """Refuse a server that may evict the keys; warn when appends are not crash-safe. A
    server that cannot be reached (or hides its configuration) is checked by nobody: said."""
    try:
        config: dict[str, str] = {
            _text(k): _text(v) for k, v in client.config_get(
                "maxmemory", "maxmemory-policy", "appendonly", "appendfsync").items()}
    except (redis.exceptions.RedisError, OSError) as exc:
        log.warning("redis_stream provider=%s: the server's configuration could not be read "
                    "(%s); its eviction policy and durability are unchecked", name,
                    type(exc).__name__)
        return
    policy = config.get("maxmemory-policy", "noeviction")
    if config.get("maxmemory", "0") != "0" and policy != "noeviction":
        raise ProviderConfigError(
            f"providers.{name}.url: the server may evict deduplication keys "
            f"(maxmemory-policy {policy}); set maxmemory-policy noeviction")
    if config.get("appendonly") != "yes" or config.get("appendfsync") != "always":
        log.warning("redis_stream provider=%s: appendonly=%s appendfsync=%s — an append the "
                    "server acknowledged can be lost if it crashes (appendfsync always "
                    "makes it durable)", name, config.get("appendonly"),
                    config.get("appendfsync"))
