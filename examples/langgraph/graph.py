"""A LangGraph support agent whose tool node's effect commits with its checkpoint.

The graph is ``triage -> open_ticket -> await_ticket -> reply``. ``open_ticket`` is the
tool node: instead of calling the ticket system it returns the effect under the state's
``outbox`` key (``outbox.frameworks.langgraph.effect``), and the checkpointer —
LangGraph's own SQLite or PostgreSQL saver, extended by ``outbox.frameworks.langgraph`` —
writes it into ``outbox_operations`` in the same transaction as the node's saved writes.
The ``outboxd run`` sidecar sends it. ``await_ticket`` waits for the receipt
(``outbox.frameworks.langgraph.receipt``) and ``reply`` answers with the ticket's id.

So whatever happens to this process, the thread resumes to exactly one ticket:

* killed inside ``open_ticket`` (before its save): nothing was staged, nothing saved; the
  resumed run runs the node again, under the same task id, and stages the effect once;
* killed right after the save: effect and checkpoint are both there; the resumed run
  does not run ``open_ticket`` again;
* killed while waiting for the receipt: the resumed run waits again;
* an effect that needs a person (``--approval``: ``blocked``, ``approval_missing``)
  interrupts the graph; after ``outboxd approve`` the resumed run continues with the
  receipt; so does one nobody can tell happened (``unknown`` for ``--patience`` seconds),
  after ``outboxd ops resolve``.

Run (``pip install 'outboxd[langgraph]'``; a sim and ``outboxd.toml`` as in
``examples/python_agent.py``, both on the same database):

    python examples/langgraph/graph.py --database sqlite:///agent.db --thread support-42 \\
        --case case-8472 --crash in-node
    python examples/langgraph/graph.py --database sqlite:///agent.db --thread support-42
    outboxd run --config outboxd.toml          # meanwhile, in another terminal
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from outbox import db, migrate
from outbox.errors import WaitTimeout
from outbox.frameworks.langgraph import Effects, effect, open_saver, receipt

TENANT = "acme"
PROVIDER = "tickets"


class SupportState(TypedDict, total=False):
    case: str
    outbox: Effects
    ticket: dict[str, Any]
    reply: str


def say(text: str) -> None:
    print(f"graph: {text}", flush=True)


def draft_ticket(case: str) -> dict[str, Any]:
    """Stands in for a model call: its output differs from one run to the next."""
    return {
        "case": case,
        "subject": "Refund follow-up",
        "body": f"Customer on {case} asks where their refund is.",
        "drafted_at": datetime.now(UTC).isoformat(),
    }


def crash(where: str) -> None:
    say(f"crashing {where} (SIGKILL)")
    os.kill(os.getpid(), signal.SIGKILL)


def build(saver: Any, engine: Any, *, crash_at: str | None, approval: bool,
          timeout: float, patience: float | None = None) -> Any:
    def triage(state: SupportState) -> SupportState:
        return {}

    def open_ticket(state: SupportState, config: RunnableConfig) -> SupportState:
        staged = effect(config, "ticket", tenant_id=TENANT, provider=PROVIDER,
                        payload=draft_ticket(state["case"]), requires_approval=approval)
        say(f"staging {staged['operation_id']}")
        if crash_at == "in-node":
            crash("inside open_ticket, before its save")
        return {"outbox": [staged]}

    def await_ticket(state: SupportState) -> SupportState:
        if crash_at == "after-commit":
            crash("right after open_ticket's save")
        staged = state["outbox"][-1]
        say(f"waiting for the receipt of {staged['operation_id']}")
        op = receipt(engine, staged, timeout=timeout, unknown_patience=patience)
        say(f"{op.operation_id} is {op.status.value}")
        return {"ticket": {"status": op.status.value, "receipt": op.receipt}}

    def reply(state: SupportState) -> SupportState:
        receipt_ = state["ticket"]["receipt"] or {}
        # the receiver's answer; or, for an effect found by reconciliation (the answer was
        # lost), what its look-up returned
        answer = receipt_.get("lookup", receipt_) if receipt_.get("reconciled") else receipt_
        body = answer.get("body") if isinstance(answer.get("body"), dict) else {}
        ticket_id = body.get("effect_id") or json.dumps(receipt_, sort_keys=True)
        return {"reply": f"ticket {ticket_id} opened"}

    graph = StateGraph(SupportState)
    for name, node in (("triage", triage), ("open_ticket", open_ticket),
                       ("await_ticket", await_ticket), ("reply", reply)):
        graph.add_node(name, node)
    graph.add_edge(START, "triage")
    graph.add_edge("triage", "open_ticket")
    graph.add_edge("open_ticket", "await_ticket")
    graph.add_edge("await_ticket", "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True,
                        help="one SQLAlchemy URL for the outbox and the checkpoints")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--case", default="case-8472")
    parser.add_argument("--crash", choices=["in-node", "after-commit"],
                        help="SIGKILL this process there")
    parser.add_argument("--approval", action="store_true",
                        help="the ticket needs an approval (outboxd approve) before it is sent")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the receipt")
    parser.add_argument("--patience", type=float, default=None,
                        help="seconds of 'unknown' before asking a person (an interrupt)")
    args = parser.parse_args(argv)
    engine = db.create_engine(args.database)
    migrate.upgrade(engine)
    try:
        return run(args, engine)
    except WaitTimeout as exc:
        say(f"no receipt yet: {exc.operation_id} is still {exc.status}; "  # type: ignore[attr-defined]
            "run again to keep waiting")
        return 4
    finally:
        engine.dispose()


def run(args: argparse.Namespace, engine: Any) -> int:
    with open_saver(args.database) as saver:
        app = build(saver, engine, crash_at=args.crash, approval=args.approval,
                    timeout=args.timeout, patience=args.patience)
        config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
        snapshot = app.get_state(config)
        if snapshot.interrupts:
            say(f"resuming thread {args.thread} after: {snapshot.interrupts[0].value}")
            result = app.invoke(Command(resume="resolved"), config, durability="sync")
        elif snapshot.next:
            say(f"resuming thread {args.thread} at {', '.join(snapshot.next)}")
            result = app.invoke(None, config, durability="sync")
        elif snapshot.values:
            say(f"thread {args.thread} already finished: nothing is re-run")
            result = snapshot.values
        else:
            say(f"starting thread {args.thread} for {args.case}")
            result = app.invoke({"case": args.case}, config, durability="sync")
    if "__interrupt__" in result:
        say(f"interrupted: {result['__interrupt__'][0].value}")
        return 3
    say(f"reply: {result['reply']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
