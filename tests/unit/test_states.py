"""outbox.states: the one transition table is complete and consistent with DESIGN, the
database CHECK and docs/state-machine.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import errors, schema
from outbox.states import (
    NON_TERMINAL,
    OVERRIDES,
    TERMINAL,
    TRANSITIONS,
    OperationStatus,
    check_transition,
    checked_move,
    sql_check_constraint,
)

S = OperationStatus
DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"

CONTRACT_VALUES = {
    "pending",
    "claimed",
    "dispatching",
    "applied",
    "verified",
    "rejected",
    "unknown",
    "blocked",
    "cancelled",
}


def test_status_values_are_the_contract() -> None:
    assert {s.value for s in S} == CONTRACT_VALUES


def test_every_state_has_a_row_and_every_target_is_a_state() -> None:
    assert set(TRANSITIONS) == set(S)
    for targets in TRANSITIONS.values():
        assert targets <= set(S)
    for source, targets in OVERRIDES.items():
        assert source in set(S) and targets <= set(S)


def test_no_self_loops() -> None:
    for source, targets in (*TRANSITIONS.items(), *OVERRIDES.items()):
        assert source not in targets, source


def test_terminal_states_have_no_automatic_exits() -> None:
    assert {S.APPLIED, S.VERIFIED, S.REJECTED, S.CANCELLED} == TERMINAL
    assert set(S) - TERMINAL == NON_TERMINAL
    for state in TERMINAL - {S.APPLIED}:
        assert TRANSITIONS[state] == frozenset(), state
    # applied may only be verified: never sent again, never back to pending
    assert TRANSITIONS[S.APPLIED] == {S.VERIFIED}


def test_every_non_terminal_state_can_finish() -> None:
    """From each non-terminal state some path of automatic transitions ends terminal."""
    for start in NON_TERMINAL:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL, start


def test_every_state_is_reachable_from_pending() -> None:
    seen, frontier = {S.PENDING}, [S.PENDING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(S)


def test_dispatching_never_returns_to_claimed_and_leases_are_safe() -> None:
    """'dispatching' means the request may have left: it never looks unsent again."""
    assert S.CLAIMED not in TRANSITIONS[S.DISPATCHING]
    assert S.CANCELLED not in TRANSITIONS[S.DISPATCHING]
    assert S.CANCELLED not in TRANSITIONS[S.UNKNOWN]  # only a person cancels an unknown
    assert S.DISPATCHING not in TRANSITIONS[S.PENDING]  # always through claimed
    assert {S.PENDING, S.UNKNOWN} <= TRANSITIONS[S.DISPATCHING]
    assert S.PENDING in TRANSITIONS[S.CLAIMED]  # lease expired before dispatch


def test_design_diagram_edges_are_allowed() -> None:
    edges = [
        (S.PENDING, S.CLAIMED),
        (S.CLAIMED, S.DISPATCHING),
        (S.CLAIMED, S.BLOCKED),
        (S.DISPATCHING, S.APPLIED),
        (S.DISPATCHING, S.REJECTED),
        (S.DISPATCHING, S.PENDING),
        (S.DISPATCHING, S.UNKNOWN),
        (S.UNKNOWN, S.APPLIED),
        (S.UNKNOWN, S.PENDING),
        (S.UNKNOWN, S.BLOCKED),
        (S.APPLIED, S.VERIFIED),
        (S.PENDING, S.CANCELLED),
        (S.BLOCKED, S.CANCELLED),
    ]
    for old, new in edges:
        check_transition(old, new)


@pytest.mark.parametrize("old", list(S))
@pytest.mark.parametrize("new", list(S))
def test_check_transition_follows_the_tables(old: S, new: S) -> None:
    for override, table in ((False, TRANSITIONS), (True, OVERRIDES)):
        if new in table.get(old, frozenset()):
            check_transition(old.value, new.value, override=override)
        else:
            with pytest.raises(errors.IllegalTransition):
                check_transition(old, new, override=override)


def test_unknown_status_string_is_refused() -> None:
    with pytest.raises(ValueError):
        check_transition("pending", "sent")


def test_overrides_leave_terminal_states_only_as_documented() -> None:
    assert OVERRIDES[S.REJECTED] == {S.PENDING}
    assert OVERRIDES[S.APPLIED] == {S.VERIFIED}
    assert S.VERIFIED not in OVERRIDES and S.CANCELLED not in OVERRIDES
    assert S.CLAIMED not in OVERRIDES and S.DISPATCHING not in OVERRIDES  # leased: hands off


def test_check_constraint_lists_every_value() -> None:
    text = sql_check_constraint("status")
    listed = re.findall(r"'([a-z_]+)'", text)
    assert sorted(listed) == sorted(s.value for s in S)
    assert text.startswith("status IN (")
    [check] = [
        c for c in schema.operations.constraints if c.name == "ck_outbox_operations_status_valid"
    ]
    assert str(check.sqltext) == text  # type: ignore[attr-defined]


def test_database_check_constraint_lists_every_value(engine: Engine) -> None:
    checks = {
        c["name"]: c["sqltext"]
        for c in sa.inspect(engine).get_check_constraints("outbox_operations")
    }
    text = checks["ck_outbox_operations_status_valid"]
    assert sorted(re.findall(r"'([a-z_]+)'", text)) == sorted(s.value for s in S)


def test_migration_check_constraint_matches_the_enum() -> None:
    """The shipped migration carries the same CHECK text as the enum."""
    migration = Path(schema.__file__).parent / "migrations" / "versions" / "0001_initial.py"
    assert sql_check_constraint("status") in migration.read_text()


def _edges(text: str, arrow: str) -> set[tuple[str, str]]:
    pattern = rf"^\s*([a-z]+)\s*{re.escape(arrow)}(?:\|[^|]*\|)?\s*([a-z]+)\b"
    return set(re.findall(pattern, text, flags=re.MULTILINE))


def test_state_machine_doc_draws_exactly_the_tables() -> None:
    text = DOC.read_text()
    drawn = _edges(text, "-->")
    assert drawn == {(a.value, b.value) for a, bs in TRANSITIONS.items() for b in bs}
    dashed = _edges(text, "-.->")
    assert dashed == {(a.value, b.value) for a, bs in OVERRIDES.items() for b in bs}
    for state in S:
        assert f"`{state.value}`" in text, state


def test_a_statement_cannot_write_a_move_the_table_forbids() -> None:
    assert checked_move(S.PENDING, S.CLAIMED) == "claimed"
    assert checked_move(S.DISPATCHING, S.DISPATCHING) == "dispatching"  # staying is no move
    assert checked_move((S.PENDING, S.BLOCKED), S.CANCELLED) == "cancelled"
    with pytest.raises(errors.IllegalTransition):
        checked_move(S.APPLIED, S.PENDING)
    with pytest.raises(errors.IllegalTransition):  # every status the statement admits is checked
        checked_move((S.PENDING, S.APPLIED), S.CANCELLED)


def test_the_suite_wide_move_check_sees_a_forbidden_move(tmp_path: Path) -> None:
    # every test database is checked this way before it goes (tests/conftest.py); this
    # one is the suite's own, so the forbidden rows written here fail nothing else
    from outbox import db, migrate
    from tests.support.moves_seen import forbidden_moves

    url = f"sqlite:///{tmp_path / 'moves.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    rows = [("transition", "pending", "claimed"), ("transition", "applied", "pending"),
            ("override", "rejected", "pending"), ("override", "verified", "pending")]
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.events), [
            {"tenant_id": "t", "kind": k, "from_status": a, "to_status": b, "actor": "test"}
            for k, a, b in rows])
    engine.dispose()
    assert sorted(forbidden_moves(url)) == [("override", "verified", "pending"),
                                            ("transition", "applied", "pending")]
