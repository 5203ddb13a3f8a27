"""The door (migration 0003): the database refuses at INSERT what the dispatcher could not
decode, on both dialects, for every writer; the agent API refuses it before anything is
written with :class:`~outbox.errors.PayloadUndecodable`."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import api, errors
from outbox.db import mapped_errors
from outbox.decoding import MAX_JSON_DEPTH


def _nested(levels: int) -> str:
    """A JSON object whose containers nest ``levels`` deep (the object counts as 1)."""
    inner = levels - 1
    return '{"a": ' + "[" * inner + "]" * inner + "}"


def _insert(engine: Engine, operation_id: str, **columns: str) -> None:
    """Plain SQL, values as SQL literals (JSON columns cast to jsonb on PostgreSQL)."""
    pg = engine.dialect.name == "postgresql"
    values = {"payload": """'{"ok": 1}'""", **columns}
    rendered = {
        k: f"CAST({v} AS jsonb)" if pg and k in ("payload", "receipt") else v
        for k, v in values.items()
    }
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
            f"{', '.join(rendered)}) VALUES ('t1', 'k', '{operation_id}', 'sim', "
            f"{', '.join(rendered.values())})"
        )


def _refused(engine: Engine, operation_id: str, **columns: str) -> str:
    with pytest.raises(errors.PayloadUndecodable) as info, mapped_errors():
        _insert(engine, operation_id, **columns)
    with engine.connect() as conn:  # nothing was written
        n = conn.exec_driver_sql(
            f"SELECT count(*) FROM outbox_operations WHERE operation_id = '{operation_id}'"
        ).scalar_one()
    assert n == 0
    return str(info.value)


def test_the_deepest_allowed_payload_is_accepted_and_one_level_more_refused(
    engine: Engine,
) -> None:
    _insert(engine, "at-limit", payload=f"'{_nested(MAX_JSON_DEPTH)}'")
    message = _refused(engine, "over-limit", payload=f"'{_nested(MAX_JSON_DEPTH + 1)}'")
    assert message == f"payload is nested deeper than {MAX_JSON_DEPTH} levels"
    assert "nested deeper" in _refused(engine, "receipt-deep",
                                       receipt=f"'{_nested(MAX_JSON_DEPTH + 1)}'")


def test_a_payload_thousands_of_levels_deep_is_refused(engine: Engine) -> None:
    # SQLite's own JSON parser stops at 1,000 levels ("not valid JSON"); PostgreSQL's
    # jsonb takes it and the rule refuses it
    with pytest.raises(errors.InvalidPayload), mapped_errors():
        _insert(engine, "deep", payload=f"'{_nested(5000)}'")


@pytest.mark.parametrize("number", ["7" * 5000, "1e400", "-2e308"])
def test_numbers_outside_a_double_are_refused(engine: Engine, number: str) -> None:
    message = _refused(engine, "big", payload=f"""'{{"n": {number}}}'""")
    assert message == "payload holds a number outside the range of a double"


def test_numbers_inside_a_double_are_accepted(engine: Engine) -> None:
    _insert(engine, "fine", payload="""'{"n": 1e300, "m": -12345678901234567890}'""")


def test_timestamps_python_cannot_hold_are_refused(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        bad = ["'infinity'", "'-infinity'", "'12000-01-01'", "'0044-03-15 BC'"]
    else:
        bad = ["'tomorrow'", "'now'", "'12000-01-01'", "2460000", "'2026-13-45'"]
    for i, value in enumerate(bad):
        assert "deadline_at is not a timestamp" in _refused(engine, f"t{i}", deadline_at=value)
    assert "next_attempt_at" in _refused(engine, "n", next_attempt_at=bad[0])
    _insert(engine, "ok-1", deadline_at="'2026-12-04 10:00:00.123456'")
    _insert(engine, "ok-2", deadline_at="'2026-12-04T10:00:00Z'")


def test_the_agent_api_refuses_before_anything_is_written(engine: Engine) -> None:
    deep: Any = json.loads(_nested(MAX_JSON_DEPTH + 1))
    cases = {
        "deep": (deep, "nested deeper than 64 levels"),
        "surrogate": ({"s": "\ud800"}, "lone surrogate"),
    }
    for op_id, (payload, why) in cases.items():
        with pytest.raises(errors.PayloadUndecodable, match=why), engine.begin() as conn:
            api.enqueue(conn, tenant_id="t1", task_id="k", operation_id=op_id,
                        provider="sim", payload=payload)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_operations")).scalar_one() == 0
    assert issubclass(errors.PayloadUndecodable, errors.InvalidPayload)
