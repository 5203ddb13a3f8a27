"""``journal.bounded`` keeps attempt evidence small and JSON-safe, whatever a provider
put in it: never an error that loses the attempt's record."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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


scalars = st.one_of(
    st.text(), st.integers(), st.floats(), st.booleans(), st.none(),
    st.integers(min_value=10**300, max_value=10**1300),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=40), scalars, max_size=12))
def test_flat_evidence_is_kept_whole_or_cut_as_its_encoding_says(
    evidence: dict[str, Any],
) -> None:
    """Flat evidence of any size and any characters: kept as it is when its JSON fits
    the limit, else the JSON's prefix."""
    kept = journal.bounded(evidence)
    if not evidence:
        assert kept is None
        return
    text = json.dumps(evidence, sort_keys=True)
    if len(text) > EVIDENCE_LIMIT:
        assert kept == {"truncated": True, "prefix": text[:EVIDENCE_LIMIT]}
    else:
        assert kept == evidence


def test_evidence_near_the_limit_is_measured_by_encoding_it() -> None:
    """The encoded length decides, not the characters: plain ASCII just under the
    limit is kept whole; a character that escapes to six is counted as six."""
    under = {"body": "x" * (EVIDENCE_LIMIT - 20)}
    assert journal.bounded(under) == under
    escaped = {"body": "é" * (EVIDENCE_LIMIT // 6 + 1)}
    kept = journal.bounded(escaped)
    assert kept is not None and kept["truncated"] is True


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.one_of(st.text(max_size=40), st.integers()), st.one_of(
    scalars, st.lists(st.integers(), max_size=3), st.characters()), max_size=12))
def test_what_is_kept_without_encoding_is_what_encoding_keeps(evidence: dict[Any, Any]) -> None:
    """The shortcut for small flat evidence decides only where the encoding would have
    kept the evidence whole: never a case it would have cut, converted or refused."""
    if evidence and journal._small_and_flat(evidence):
        text = json.dumps(evidence, sort_keys=True)
        assert len(text) <= EVIDENCE_LIMIT
        assert all(isinstance(k, str) for k in evidence)
        assert journal.bounded(evidence) == evidence


def test_the_widest_characters_are_counted_as_their_escapes() -> None:
    astral = {"k": "\U0001f600" * 341}  # 341 characters, 4,092 of JSON escapes
    assert not journal._small_and_flat(astral)
    kept = journal.bounded(astral)
    assert kept is not None and kept["truncated"] is True
    assert journal._small_and_flat({"provider": "null", "status_code": 200, "ok": True})
