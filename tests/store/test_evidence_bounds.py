"""``journal.bounded`` keeps attempt evidence small and JSON-safe, whatever a provider
put in it: never an error that loses the attempt's record."""

from __future__ import annotations

from typing import Any

from dispatcher.store import journal
from dispatcher.store.journal import EVIDENCE_LIMIT


def test_evidence_past_the_limit_is_cut_to_a_prefix() -> None:
    kept = journal.bounded({"body": "x" * EVIDENCE_LIMIT})
    assert kept is not None and kept["truncated"] is True
    assert len(kept["prefix"]) == EVIDENCE_LIMIT
    assert journal.bounded({"body": "x" * 100}) == {"body": "x" * 100}


def test_evidence_whose_keys_do_not_sort_is_still_recorded() -> None:
    """Keys of mixed types cannot be sorted (the encoder raised ``TypeError`` and the
    record failed); a cycle cannot be encoded at all."""
    assert journal.bounded({"a": 1, 2: "b"}) == {"a": 1, "2": "b"}
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    assert journal.bounded(cyclic) == {"unencodable": "dict"}
