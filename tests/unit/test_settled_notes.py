"""What a settled notification names (``outbox.waiting.keys_of``): the record step's JSON
array of ``[tenant_id, operation_id]`` pairs, an earlier dispatcher's single pair, and
anything else as "read again" (None), never an error in the listening thread."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from outbox.waiting import keys_of

ids = st.text(min_size=1, max_size=40)


@given(st.lists(st.tuples(ids, ids), min_size=1, max_size=30))
def test_a_batch_of_pairs_names_each(pairs: list[tuple[str, str]]) -> None:
    assert keys_of(json.dumps([list(p) for p in pairs])) == pairs


@given(ids, ids)
def test_one_pair_from_an_earlier_dispatcher_names_one(tenant: str, op: str) -> None:
    assert keys_of(json.dumps([tenant, op])) == [(tenant, op)]


def test_anything_else_means_read_again() -> None:
    for payload in ["", "not json", "{}", "[]", "[1, 2]", '["t"]', '["t", "o", "x"]',
                    '[["t", "o"], "x"]', '[["t", 1]]', "null", '"t"']:
        assert keys_of(payload) is None, payload
