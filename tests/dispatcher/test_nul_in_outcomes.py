"""A provider's answer holding a NUL character — in a receipt's value or key, in an
error's text, in a verifier's evidence — is recorded, not refused: PostgreSQL's ``jsonb``
and ``text`` hold no U+0000, so there it is stored as the replacement character; SQLite
keeps it. Before, the record statement failed on PostgreSQL on every try and left its
whole batch ``dispatching``. The worker, the statements and the database are real; the
receiver is an in-process object implementing the provider protocol."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.maintenance.reconcile import Reconciler
from dispatcher.maintenance.verifier import Verifier
from providers.base import (
    Capabilities,
    Dispatch,
    LookupConsistency,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
    VerifyKind,
    VerifyResult,
)
from tests.dispatcher import stage
from tests.dispatcher.inprocess import Counting, sends_finished, statuses, worker_at
from tests.operator import make_unknown
from tests.operator import stage as stage_ops


class NulAnswers(Counting):
    """Applies every request; its receipt holds NUL characters."""

    def send(self, d: Dispatch) -> Outcome:
        super().send(d)
        return Outcome(OutcomeKind.APPLIED, status_code=201,
                       receipt={"id": "a\x00b", "k\x00": ["\x00"], "raw": "\\u0000"})


def test_a_receipt_with_nul_characters_is_recorded(db_url: str) -> None:
    with worker_at(db_url) as (engine, worker, _receiver):
        worker.providers["sim"] = NulAnswers()
        stage(engine, 3)
        assert worker.claim_and_dispatch() == 3
        sends_finished(worker, 3)
        worker.record_done(force=True)
        assert statuses(engine) == {"applied": 3}
        with engine.connect() as conn:
            receipts = [json.loads(r) if isinstance(r, str) else r  # SQLite: the text
                        for (r,) in conn.execute(sa.text("SELECT receipt FROM outbox_operations"))]
    nul = "\ufffd" if engine.dialect.name == "postgresql" else "\x00"
    # a backslash and "u0000" as text is not a NUL, and stays as it was
    assert receipts == [{"id": f"a{nul}b", f"k{nul}": [nul], "raw": "\\u0000"}] * 3


class NulLookups(Counting):
    """Finds every operation it is asked about; its look-up's receipt holds a NUL."""

    capabilities = Capabilities(dedup_retention_seconds=3600.0,
                                lookup_consistency=LookupConsistency.STRONG)

    def lookup(self, d: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.FOUND, receipt={"id": "a\x00b"})


def test_a_lookup_receipt_with_nul_characters_is_recorded(engine: Engine) -> None:
    """The same for reconciliation: an ``unknown`` operation found by a look-up whose
    receipt holds a NUL is ``applied``, not failed on every reconciliation."""
    stage_ops(engine, "task", ["op-1"])
    make_unknown(engine)
    Reconciler(engine, {"sim": NulLookups()}, actor="test").run_once()
    with engine.connect() as conn:
        status, receipt = conn.execute(sa.text(
            "SELECT status, receipt FROM outbox_operations")).one()
    receipt = json.loads(receipt) if isinstance(receipt, str) else receipt
    nul = "\ufffd" if engine.dialect.name == "postgresql" else "\x00"
    assert status == "applied" and receipt["lookup"] == {"id": f"a{nul}b"}


class NulVerifier(Counting):
    """Verifies every receipt; its reason and evidence hold NUL characters."""

    def verify(self, receipt: Mapping[str, Any]) -> VerifyResult:
        return VerifyResult(VerifyKind.VERIFIED, reason="seen\x00",
                            evidence={"page": "a\x00b", "k\x00": ["\x00"]})


def test_a_verification_with_nul_characters_is_recorded(engine: Engine) -> None:
    """The same for verification: evidence and a reason holding NUL characters verify
    the operation, stored with the replacement character on PostgreSQL, instead of
    failing its event's write on every verification run (the operation left ``applied``
    for good)."""
    stage_ops(engine, "task", ["op-1"])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox_operations SET status = 'applied', "
                             "receipt = '{\"id\": \"r-1\"}'"))
    counts = Verifier(engine, {"sim": NulVerifier()}, actor="test").run_once()
    assert counts.verified == 1
    with engine.connect() as conn:
        status = conn.execute(sa.text("SELECT status FROM outbox_operations")).scalar_one()
        reason, detail = conn.execute(sa.text(
            "SELECT reason, detail FROM outbox_events WHERE kind = 'verification'")).one()
    detail = json.loads(detail) if isinstance(detail, str) else detail
    nul = "\ufffd" if engine.dialect.name == "postgresql" else "\x00"
    assert status == "verified" and reason == f"seen{nul}"
    assert detail["evidence"] == {"page": f"a{nul}b", f"k{nul}": [nul]}
