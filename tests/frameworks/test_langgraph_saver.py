"""``outbox.frameworks.langgraph.OutboxSqliteSaver``: a node's effects and its saved writes
are one transaction — both or neither — on a real SQLite file holding LangGraph's tables
and the outbox's, with a real compiled graph."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from outbox import db, errors, migrate
from outbox.frameworks.langgraph import Effects, OutboxSqliteSaver, effect

TENANT = "acme"


class State(TypedDict, total=False):
    case: str
    outbox: Effects
    note: str


def build(saver: OutboxSqliteSaver, payload: dict[str, Any]) -> Any:
    def draft(state: State, config: RunnableConfig) -> State:
        return {"outbox": [effect(config, "ticket", tenant_id=TENANT, provider="tickets",
                                  payload={**payload, "case": state["case"]})]}

    graph = StateGraph(State)
    graph.add_node("draft", draft)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", END)
    return graph.compile(checkpointer=saver)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent.db"
    engine = db.create_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    engine.dispose()
    yield path


def table(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute(sql))


def next_of(path: Path, thread: str = "th-1") -> tuple[str, ...]:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        app = build(OutboxSqliteSaver(conn), {})
        return tuple(app.get_state({"configurable": {"thread_id": thread}}).next)
    finally:
        conn.close()


def run(path: Path, payload: dict[str, Any], thread: str = "th-1") -> dict[str, Any]:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        app = build(OutboxSqliteSaver(conn), payload)
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        snapshot = app.get_state(config)
        start = None if snapshot.next else {"case": "case-1"}
        result: dict[str, Any] = app.invoke(start, config, durability="sync")
        return result
    finally:
        conn.close()


def test_the_effect_is_staged_with_the_nodes_writes(database: Path) -> None:
    state = run(database, {"title": "Printer on fire"})
    (staged,) = state["outbox"]
    assert staged["operation_id"].startswith("lg:th-1:draft:")
    rows = table(database, "SELECT operation_id, task_id, provider, status FROM outbox_operations")
    assert rows == [(staged["operation_id"], "th-1", "tickets", "pending")]
    writes = table(database, "SELECT task_id FROM writes WHERE channel = 'outbox'")
    assert len(writes) == 1 and writes[0][0] in staged["operation_id"]


def test_a_refused_effect_leaves_neither_the_effect_nor_the_writes(database: Path) -> None:
    with pytest.raises(errors.SecretInPayload):
        run(database, {"password": "correct horse battery staple"})
    assert table(database, "SELECT count(*) FROM outbox_operations") == [(0,)]
    assert table(database, "SELECT count(*) FROM writes WHERE channel = 'outbox'") == [(0,)]


def test_a_node_run_again_stages_the_same_operation_and_a_new_payload_is_refused(
    database: Path,
) -> None:
    """The node's writes lost (as if the run died between the node and its save): the
    resumed run runs the node again, under the same task id, and its regenerated payload
    is refused rather than staged as a second effect."""
    first = run(database, {"title": "v1"})
    op_id = first["outbox"][0]["operation_id"]
    with sqlite3.connect(database) as conn:  # back to before the node's save
        conn.execute("DELETE FROM writes")
        conn.execute("DELETE FROM checkpoints WHERE checkpoint_id = ("
                     "SELECT max(checkpoint_id) FROM checkpoints)")
    with pytest.raises(errors.PayloadMismatch):
        run(database, {"title": "v2, regenerated"})
    assert table(database, "SELECT operation_id FROM outbox_operations") == [(op_id,)]
    assert table(database, "SELECT count(*) FROM writes WHERE channel = 'outbox'") == [(0,)]
    # nor the checkpoint LangGraph saves after the step with the writes it holds: the
    # thread is still before the node
    assert next_of(database) == ("draft",)
    again = run(database, {"title": "v1"})  # the same payload: the same operation
    assert again["outbox"][0]["operation_id"] == op_id
    assert table(database, "SELECT count(*) FROM outbox_operations") == [(1,)]
