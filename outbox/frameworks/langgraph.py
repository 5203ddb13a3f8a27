"""LangGraph: a node's effects are committed in the same transaction as its checkpoint writes.

LangGraph saves what a node returned (its *writes*) when the node finishes, through the
checkpointer's ``put_writes``; a run resumed after a crash replays saved writes instead of
running their node again, and runs again the nodes whose writes were not saved. An effect
staged in a transaction of its own beside that save can therefore exist without the
writes (staged, then the crash: the node runs again) or the writes without the effect.
:class:`OutboxSqliteSaver` closes that gap: a node returns its effects under one state key
(``outbox`` by default, a list that accumulates), and the saver writes them into
``outbox_operations`` in the transaction that saves the node's writes — both or neither.

* The operation id comes from where the node ran — ``lg:<thread>:<checkpoint ns>:<name>``,
  and LangGraph's namespace of a running task ends with its task id, a hash of the
  checkpoint it runs from, the step and the node (:func:`effect` derives it). A node run
  again after a crash stages the same operation; a regenerated, different payload under
  that id is refused (:class:`~outbox.errors.PayloadMismatch`) and the node's writes are
  not saved with it.
* The dispatcher (``outboxd run``) sends it as any other operation. A later node waits for
  the receipt with :func:`receipt`; an operation that needs a person (``blocked``) or that
  nobody can yet tell happened (``unknown`` past the patience) becomes a LangGraph
  ``interrupt`` that a resume, after the approval or the resolution, continues from.

The outbox tables live in the checkpoints' database (one transaction needs one database):
run ``outboxd migrate`` on it. Use a durability that saves writes as nodes finish
(``"sync"`` or the default ``"async"``), not ``"exit"``. Needs the ``langgraph`` extra.
"""

from __future__ import annotations

import operator
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

import psycopg
import sqlalchemy as sa
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import interrupt
from psycopg.rows import DictRow, dict_row, tuple_row

from outbox import db, errors, staging
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from outbox.waiting import wait_for

EFFECTS_KEY = "outbox"
Effects = Annotated[list[dict[str, Any]], operator.add]
"""The state key's type: ``outbox: Effects`` in the graph's state (a list that
accumulates the effects of every node)."""

NEEDS_A_PERSON = (OperationStatus.BLOCKED, OperationStatus.UNKNOWN)


def operation_id_for(config: RunnableConfig, name: str) -> str:
    """The operation id of effect ``name`` of the node running with ``config``: thread,
    checkpoint namespace (which ends with the task id), name."""
    conf = config.get("configurable", {})
    thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
    task = str(conf.get("__pregel_task_id", ""))
    if task and not ns.endswith(task):
        ns = f"{ns}:{task}"
    return f"lg:{thread}:{ns}:{name}"


def effect(
    config: RunnableConfig,
    name: str,
    *,
    tenant_id: str,
    provider: str,
    payload: Mapping[str, Any],
    task_id: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """One effect of the running node, to return under the effects key
    (``return {"outbox": [effect(config, "ticket", ...)]}``). ``task_id`` (the outbox
    task) defaults to the thread; ``options`` are :class:`~outbox.api.StagedOperation`
    fields that JSON can carry (``requires_approval``, ``idempotency_key``, ...)."""
    thread = str(config.get("configurable", {})["thread_id"])
    return {
        "tenant_id": tenant_id,
        "task_id": task_id or thread,
        "operation_id": operation_id_for(config, name),
        "provider": provider,
        "payload": dict(payload),
        **options,
    }


class _StagesEffects:
    """What both savers add to LangGraph's: the effects of a node's writes (and of a
    checkpoint that carries them) are taken aside, then staged on the saver's own
    connection in the transaction its statements run in, and committed with them."""

    effects_key: str
    _pending: threading.local
    _engine: sa.Engine

    def _join(self, conn: Any, url: str, effects_key: str) -> None:
        self.effects_key = effects_key
        self._pending = threading.local()
        # our statements on the saver's own connection, inside its transaction: no pool
        # of ours, no reset (a rollback) when SQLAlchemy hands the connection back
        self._engine = sa.create_engine(url, creator=lambda: conn,
                                        poolclass=sa.pool.StaticPool, pool_reset_on_return=None)
        # SQLAlchemy's first connect reads the server version and rolls back: now, not
        # inside the first save
        with self._as_sqlalchemy_wants(conn), self._engine.connect():
            pass

    @contextmanager
    def _as_sqlalchemy_wants(self, raw: Any) -> Iterator[None]:
        """The driver connection as SQLAlchemy reads it, while our statements run."""
        yield

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._pending.effects = effects_in(writes, self.effects_key, task_id)
        try:
            super().put_writes(config, writes, task_id, task_path)  # type: ignore[misc]
        finally:
            self._pending.effects = None

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # the checkpoint that carries the effects commits with them too: a checkpoint
        # saved after a step whose writes could not be saved (LangGraph saves it with the
        # writes it holds in memory) is refused with the same error
        if self.effects_key in new_versions:
            values = checkpoint["channel_values"].get(self.effects_key) or []
            self._pending.effects = effects_in([(self.effects_key, values)], self.effects_key)
        try:
            saved: RunnableConfig = super().put(  # type: ignore[misc]
                config, checkpoint, metadata, new_versions)
            return saved
        finally:
            self._pending.effects = None

    def _take_effects(self) -> list[dict[str, Any]] | None:
        effects: list[dict[str, Any]] | None = getattr(self._pending, "effects", None)
        self._pending.effects = None
        return effects

    def _stage(self, effects: list[dict[str, Any]], raw: Any) -> None:
        """Stage ``effects`` in the transaction open on ``raw`` (the saver's connection)
        and commit it with them; on any error roll the whole transaction back (the node's
        writes with it) and raise."""
        with self._as_sqlalchemy_wants(raw), self._engine.connect() as conn:
            try:
                for e in effects:
                    staging.enqueue(conn, **e)
                conn.commit()
            except BaseException:
                conn.rollback()
                raw.rollback()  # also where nothing of ours ran yet: the writes too
                raise


class OutboxSqliteSaver(_StagesEffects, SqliteSaver):
    """LangGraph's ``SqliteSaver`` that stages each node's effects (the writes under
    ``effects_key``) in the transaction that saves the node's writes."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        effects_key: str = EFFECTS_KEY,
        serde: SerializerProtocol | None = None,
    ) -> None:
        SqliteSaver.__init__(self, conn, serde=serde)
        self._join(conn, "sqlite://", effects_key)

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        with super().cursor(transaction) as cur:
            yield cur
            effects = self._take_effects()
            if effects:
                self._stage(effects, self.conn)


class OutboxPostgresSaver(_StagesEffects, PostgresSaver):
    """LangGraph's ``PostgresSaver`` that stages each node's effects (the writes under
    ``effects_key``) in the transaction that saves the node's writes.

    ``conn``: one psycopg connection as ``PostgresSaver`` wants it (``autocommit=True``,
    ``prepare_threshold=0``, ``row_factory=dict_row``), not a pool and not a pipeline: a
    save that carries effects switches it to a transaction for that save."""

    def __init__(
        self,
        conn: psycopg.Connection[DictRow],
        *,
        effects_key: str = EFFECTS_KEY,
        serde: SerializerProtocol | None = None,
    ) -> None:
        if not isinstance(conn, psycopg.Connection):
            raise errors.ConfigError(
                "OutboxPostgresSaver takes one psycopg Connection (not a pool): the effects "
                "and the checkpoint commit on one connection")
        PostgresSaver.__init__(self, conn, serde=serde)
        self._join(conn, "postgresql+psycopg://", effects_key)

    @contextmanager
    def _as_sqlalchemy_wants(self, raw: Any) -> Iterator[None]:
        # PostgresSaver's connection makes dict rows; SQLAlchemy reads tuples (the saver
        # names its row factory on each of its cursors, so none of its reads change)
        kept = raw.row_factory
        raw.row_factory = tuple_row
        try:
            yield
        finally:
            raw.row_factory = kept

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor[DictRow]]:
        effects = self._take_effects()
        if not effects:
            with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        conn = self.conn
        assert isinstance(conn, psycopg.Connection)
        with self.lock:
            conn.autocommit = False  # the saver's statements and ours: one transaction
            try:
                with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
                self._stage(effects, conn)
            except BaseException:
                conn.rollback()
                raise
            finally:
                conn.autocommit = True


@contextmanager
def open_saver(url: str) -> Iterator[OutboxSqliteSaver | OutboxPostgresSaver]:
    """The saver for the database at ``url`` (the outbox's, migrated), on a connection of
    its own that is closed at the end: ``sqlite:///path`` or ``postgresql://…``."""
    url = db.normalise_url(url)
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False)
        try:
            yield OutboxSqliteSaver(conn)
        finally:
            conn.close()
        return
    if not url.startswith("postgresql+psycopg://"):
        raise errors.ConfigError("open_saver takes a sqlite:/// or postgresql:// URL, "
                                 f"not {url.split(':')[0]}:")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1),
                         autocommit=True, prepare_threshold=0, row_factory=dict_row) as pg:
        saver = OutboxPostgresSaver(pg)
        saver.setup()
        yield saver


def effects_in(
    writes: Sequence[tuple[str, Any]], key: str, task_id: str | None = None
) -> list[dict[str, Any]]:
    """The effects among a task's writes, checked: each a mapping :func:`effect` made,
    its operation id derived from the task ``task_id`` (when given)."""
    found: list[dict[str, Any]] = []
    for channel, value in writes:
        if channel != key:
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if not isinstance(item, Mapping) or "operation_id" not in item:
                raise errors.InvalidPayload(
                    f"a write to {key!r} must be a list of outbox.frameworks.langgraph.effect() "
                    "values", task_id=task_id)
            if task_id is not None and task_id not in str(item["operation_id"]):
                raise errors.InvalidPayload(
                    "an effect's operation id must come from the node that stages it "
                    "(outbox.frameworks.langgraph.effect)",
                    operation_id=item["operation_id"], task_id=task_id)
            found.append(dict(item))
    return found


def receipt(
    engine: sa.Engine,
    staged: Mapping[str, Any],
    *,
    timeout: float,
    unknown_patience: float | None = None,
) -> OperationRecord:
    """Wait for the effect ``staged`` (an :func:`effect` value from the state) to settle
    and return its record. ``blocked`` (and ``unknown`` once ``unknown_patience`` has
    passed) interrupt the graph with the operation's id, status and reason; resume it
    (``Command(resume=...)``) after the approval or the resolution, and the wait goes on.
    Call it in a node after the one that staged the effect (its transaction must have
    committed)."""
    while True:
        op = wait_for(engine, tenant_id=str(staged["tenant_id"]),
                      operation_id=str(staged["operation_id"]), timeout=timeout,
                      unknown_patience=unknown_patience)
        if op.status not in NEEDS_A_PERSON:
            return op
        interrupt({"operation_id": op.operation_id, "status": op.status.value,
                   "reason": op.status_reason})
