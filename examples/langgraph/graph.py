"""A LangGraph support agent whose tool node stages its effect through outboxd.

The graph is ``triage -> open_ticket -> END``. ``open_ticket`` is the tool node: instead of
calling the ticket system, it stages ``ticket`` operations with :func:`outbox.enqueue`; the
``outboxd run`` sidecar sends them with a stable idempotency key.

The operation id is derived from where the node runs, not from what it produced:
``lg:<thread_id>:<checkpoint_ns>`` — LangGraph's checkpoint namespace of a running task
is ``<parent ns>|<node>:<task id>``, and the task id is a deterministic hash of the
checkpoint it runs from, the step and the node. So:

* re-running an interrupted node (the process died inside it, before LangGraph saved the
  node's writes) derives the SAME operation id — whatever the model says the second time;
* a regenerated, different payload under that id is refused (``PayloadMismatch``) rather
  than sent: the payload staged first is the one that goes out, once;
* resuming a finished thread re-runs nothing; a NEW turn on the thread starts from a new
  checkpoint, gets a new task id, and is a new effect — as it should be.

This needs checkpoints written before each step runs (``durability="sync"``): with
asynchronous checkpoint writes, a crash can lose the checkpoint the task id is derived
from. The outbox row and LangGraph's checkpoint live in different databases and commit
separately; the derived id is what ties them together.

Run (``pip install 'outboxd[langgraph]'``; a sim and ``outboxd.toml`` as in
``examples/python_agent.py``):

    python examples/langgraph/graph.py --database sqlite:///agent.db \\
        --checkpoints graph.sqlite --thread support-42 --case case-8472 --crash
    python examples/langgraph/graph.py --database sqlite:///agent.db \\
        --checkpoints graph.sqlite --thread support-42 --case case-8472
    outboxd run --once --config outboxd.toml
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
from datetime import UTC, datetime
from typing import Any, TypedDict

import sqlalchemy as sa
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

import outbox
from outbox import db
from outbox.errors import PayloadMismatch

TENANT = "acme"
PROVIDER = "tickets"


class SupportState(TypedDict, total=False):
    case: str
    needs_ticket: bool
    ticket_operation: str
    ticket_status: str


def say(text: str) -> None:
    print(f"graph: {text}", flush=True)


def operation_id_for(config: RunnableConfig, effect: str) -> str:
    """A stable id for the effect of this task: thread, checkpoint namespace, task."""
    conf = config.get("configurable", {})
    thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
    task = str(conf.get("__pregel_task_id", ""))  # already the tail of ns; kept if not
    if task and not ns.endswith(task):
        ns = f"{ns}:{task}"
    return f"lg:{thread}:{ns}:{effect}"


def draft_ticket(case: str) -> dict[str, Any]:
    """Stands in for a model call: its output differs from one run to the next."""
    return {
        "case": case,
        "subject": "Refund follow-up",
        "body": f"Customer on {case} asks where their refund is.",
        "drafted_at": datetime.now(UTC).isoformat(),
    }


def build(engine: sa.Engine, checkpointer: SqliteSaver, *, crash_in_tool: bool = False) -> Any:
    def triage(state: SupportState) -> SupportState:
        return {"needs_ticket": True}

    def open_ticket(state: SupportState, config: RunnableConfig) -> SupportState:
        op_id = operation_id_for(config, "ticket")
        payload = draft_ticket(state["case"])
        try:
            with engine.begin() as conn:
                rec = outbox.enqueue(conn, tenant_id=TENANT, task_id=state["case"],
                                     operation_id=op_id, provider=PROVIDER, payload=payload)
            say(f"staged {op_id} ({rec.status.value})")
        except PayloadMismatch:
            say(f"regenerated payload refused (PayloadMismatch) for {op_id}: the payload "
                "staged first stands; nothing new will be sent")
            with engine.connect() as conn:
                rec = outbox.get_operation(conn, tenant_id=TENANT, operation_id=op_id)
        if crash_in_tool:
            say("crashing inside the tool node (SIGKILL), before LangGraph saves its writes")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"ticket_operation": op_id, "ticket_status": rec.status.value}

    graph = StateGraph(SupportState)
    graph.add_node("triage", triage)
    graph.add_node("open_ticket", open_ticket)
    graph.add_edge(START, "triage")
    graph.add_edge("triage", "open_ticket")
    graph.add_edge("open_ticket", END)
    return graph.compile(checkpointer=checkpointer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, help="the outbox's SQLAlchemy URL")
    parser.add_argument("--checkpoints", required=True, help="LangGraph's SQLite file")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--case", default="case-8472")
    parser.add_argument("--crash", action="store_true",
                        help="SIGKILL inside the tool node, after staging")
    args = parser.parse_args(argv)
    engine = db.create_engine(args.database)
    conn = sqlite3.connect(args.checkpoints, check_same_thread=False)
    try:
        app = build(engine, SqliteSaver(conn), crash_in_tool=args.crash)
        config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
        snapshot = app.get_state(config)
        if snapshot.next:
            say(f"resuming thread {args.thread} at {', '.join(snapshot.next)}")
            result = app.invoke(None, config, durability="sync")
        elif snapshot.values:
            say(f"thread {args.thread} already finished: nothing is re-run")
            result = snapshot.values
        else:
            say(f"starting thread {args.thread} for {args.case}")
            result = app.invoke({"case": args.case}, config, durability="sync")
        with engine.connect() as c:
            op = outbox.get_operation(c, tenant_id=TENANT,
                                      operation_id=result["ticket_operation"])
        say(f"ticket operation {op.operation_id} is {op.status.value}")
        return 0
    finally:
        conn.close()
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
