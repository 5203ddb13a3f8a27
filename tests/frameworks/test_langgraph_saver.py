"""``outbox.frameworks.langgraph``'s savers: a node's effects and its saved writes (and the
checkpoint that carries them) are one transaction — both or neither — on a real SQLite
file and a real PostgreSQL database holding LangGraph's tables and the outbox's, with a
real compiled graph."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from outbox import db, errors
from outbox.frameworks.langgraph import Effects, OutboxPostgresSaver, OutboxSqliteSaver, effect

TENANT = "acme"


class State(TypedDict, total=False):
    case: str
    outbox: Effects
    note: str


def build(saver: OutboxSqliteSaver | OutboxPostgresSaver, payload: dict[str, Any]) -> Any:
    def draft(state: State, config: RunnableConfig) -> State:
        return {"outbox": [effect(config, "ticket", tenant_id=TENANT, provider="tickets",
                                  payload={**payload, "case": state["case"]})]}

    graph = StateGraph(State)
    graph.add_node("draft", draft)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", END)
    return graph.compile(checkpointer=saver)


class Database:
    """A migrated database of one dialect, holding LangGraph's tables and the outbox's."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = db.create_engine(url)

    @contextmanager
    def saver(self) -> Iterator[OutboxSqliteSaver | OutboxPostgresSaver]:
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), check_same_thread=False)
            try:
                yield OutboxSqliteSaver(conn)
            finally:
                conn.close()
            return
        dsn = self.url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0,
                             row_factory=dict_row) as pg:
            saver = OutboxPostgresSaver(pg)
            saver.setup()
            yield saver

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if "writes" in sql and not self.url.startswith("sqlite"):
            sql = sql.replace("writes", "checkpoint_writes")
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(sql)]


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    found = Database(db_url)
    yield found
    found.engine.dispose()


def next_of(database: Database, thread: str = "th-1") -> tuple[str, ...]:
    with database.saver() as saver:
        app = build(saver, {})
        return tuple(app.get_state({"configurable": {"thread_id": thread}}).next)


def run(database: Database, payload: dict[str, Any], thread: str = "th-1") -> dict[str, Any]:
    with database.saver() as saver:
        app = build(saver, payload)
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        snapshot = app.get_state(config)
        start = None if snapshot.next else {"case": "case-1"}
        result: dict[str, Any] = app.invoke(start, config, durability="sync")
        return result


def test_the_effect_is_staged_with_the_nodes_writes(database: Database) -> None:
    state = run(database, {"title": "Printer on fire"})
    (staged,) = state["outbox"]
    assert staged["operation_id"].startswith("lg:th-1:draft:")
    rows = database.rows("SELECT operation_id, task_id, provider, status FROM outbox_operations")
    assert rows == [(staged["operation_id"], "th-1", "tickets", "pending")]
    writes = database.rows("SELECT task_id FROM writes WHERE channel = 'outbox'")
    assert len(writes) == 1 and writes[0][0] in staged["operation_id"]


def test_a_refused_effect_leaves_neither_the_effect_nor_the_writes(database: Database) -> None:
    with pytest.raises(errors.SecretInPayload):
        run(database, {"password": "correct horse battery staple"})
    assert database.rows("SELECT count(*) FROM outbox_operations") == [(0,)]
    assert database.rows("SELECT count(*) FROM writes WHERE channel = 'outbox'") == [(0,)]


def test_a_node_run_again_stages_the_same_operation_and_a_new_payload_is_refused(
    database: Database,
) -> None:
    """The node's writes lost (as if the run died between the node and its save): the
    resumed run runs the node again, under the same task id, and its regenerated payload
    is refused rather than staged as a second effect."""
    first = run(database, {"title": "v1"})
    op_id = first["outbox"][0]["operation_id"]
    with database.engine.begin() as conn:  # back to before the node's save
        writes = "writes" if database.url.startswith("sqlite") else "checkpoint_writes"
        conn.exec_driver_sql(f"DELETE FROM {writes}")
        conn.exec_driver_sql("DELETE FROM checkpoints WHERE checkpoint_id = ("
                             "SELECT max(checkpoint_id) FROM checkpoints)")
    with pytest.raises(errors.PayloadMismatch):
        run(database, {"title": "v2, regenerated"})
    assert database.rows("SELECT operation_id FROM outbox_operations") == [(op_id,)]
    assert database.rows("SELECT count(*) FROM writes WHERE channel = 'outbox'") == [(0,)]
    # nor the checkpoint LangGraph saves after the step with the writes it holds: the
    # thread is still before the node
    assert next_of(database) == ("draft",)
    again = run(database, {"title": "v1"})  # the same payload: the same operation
    assert again["outbox"][0]["operation_id"] == op_id
    assert database.rows("SELECT count(*) FROM outbox_operations") == [(1,)]
