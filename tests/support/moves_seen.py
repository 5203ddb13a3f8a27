"""Every status move the suite leaves in ``outbox_events`` is one the transition table
allows: checked on each test database before it is dropped."""

from __future__ import annotations

import sqlalchemy as sa

from outbox import db
from outbox.states import OVERRIDES, TRANSITIONS, OperationStatus


def forbidden_moves(url: str) -> list[tuple[str, str, str]]:
    """(kind, from, to) of each move in ``outbox_events`` the table does not allow
    (``override`` rows against the operator overrides, the others against the automatic
    transitions)."""
    engine = db.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("outbox_events"):
                return []
            rows = conn.execute(sa.text(
                "SELECT DISTINCT kind, from_status, to_status FROM outbox_events"
                " WHERE from_status IS NOT NULL AND to_status IS NOT NULL"
                " AND from_status <> to_status")).all()
    finally:
        engine.dispose()
    bad = []
    for kind, old, new in rows:
        table = OVERRIDES if kind == "override" else TRANSITIONS
        try:
            allowed = OperationStatus(new) in table.get(OperationStatus(old), frozenset())
        except ValueError:
            allowed = False
        if not allowed:
            bad.append((str(kind), str(old), str(new)))
    return bad
