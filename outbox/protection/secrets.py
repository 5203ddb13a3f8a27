"""Refuse payloads that carry credentials: credentials never enter a record.

`find_secrets` walks a JSON-like payload (dicts, lists, tuples, scalars) and reports
every place that looks like a credential, by JSON path and detector name, never by value.

* Key names: a credential key whose value could carry one (see :mod:`.secret_keys`).
* String values (and long keys): detect-secrets' regex plugins, our own patterns, then a
  high-entropy check (see :mod:`.secret_patterns`). All the strings of a payload, or of a
  batch of payloads, are scanned together: each check runs once per batch.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, TypeVar

import ahocorasick

from outbox.errors import SecretInPayload
from outbox.protection.secret_keys import carries, key_kind
from outbox.protection.secret_patterns import MIN_LEN, VALUE_CHECKS, Run

_K = TypeVar("_K", bound=Hashable)

__all__ = ["SecretFinding", "check_no_secrets", "find_secrets"]


@dataclass(frozen=True)
class SecretFinding:
    """Where a credential-like item sits (a JSON path) and which detector saw it."""

    path: str  # e.g. "$.customer.api_key" or "$.items[2].note"
    detector: str  # e.g. "key_name", "aws_access_key", "jwt", "high_entropy"


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Paths are linked lists (parent, segment), formatted only for findings; a segment is a
# dict key, a list index, or (index,) for a dict key that must not be shown.
_Path = tuple["_Path", "str | int | tuple[int]"] | None


def _format(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, seg = path
        if isinstance(seg, str):
            parts.append(f".{seg}" if _IDENT.fullmatch(seg) else f"[{json.dumps(seg)}]")
        else:
            parts.append(f"[{seg}]" if isinstance(seg, int) else f"[<key {seg[0]}>]")
    return "$" + "".join(reversed(parts))


def find_secrets(payload: object) -> list[SecretFinding]:
    """Every credential-like item in `payload`, in document order; one finding per path."""
    return find_secrets_many([payload])[0]


def find_secrets_many(payloads: Sequence[object]) -> list[list[SecretFinding]]:
    """:func:`find_secrets` of each payload, scanning all their strings together: each
    check runs once per batch rather than once per payload (the dispatcher admits a
    claimed batch at a time)."""
    walked = [_walk(p) for p in payloads]
    strings = [
        ((n, i), text)
        for n, items in enumerate(walked)
        for i, (_, text) in enumerate(items)
        if text is not None
    ]
    hits: list[dict[int, str]] = [
        {i: "key_name" for i, (_, text) in enumerate(items) if text is None} for items in walked
    ]
    for (n, i), detector in _scan_strings(strings):
        hits[n][i] = detector
    return [
        [SecretFinding(_format(items[i][0]), found[i]) for i in sorted(found)]
        for items, found in zip(walked, hits, strict=True)
    ]


def _walk(payload: object) -> list[tuple[_Path, str | None]]:
    """(path, string to scan | None: a key_name hit) for every item worth a look."""
    items: list[tuple[_Path, str | None]] = []
    stack: list[tuple[_Path, bool, Iterator[tuple[int, Any]]]] = []
    if isinstance(payload, str):
        items.append((None, payload))
    elif isinstance(payload, dict):
        stack.append((None, True, enumerate(payload.items())))
    elif isinstance(payload, list | tuple):
        stack.append((None, False, enumerate(payload)))
    while stack:  # depth-first, in document order, without recursion
        path, is_dict, entries = stack[-1]
        for index, entry in entries:
            if is_dict:
                key, value = entry
                key_text = key if isinstance(key, str) else str(key)
                child: _Path = (path, key_text)
                kind = key_kind(key_text)
                if kind is not None and carries(value, kind == "str"):
                    items.append((child, None))
                    continue
                if len(key_text) >= 20:  # a credential used as a key: never echo the key
                    items.append(((path, (index,)), key_text))
            else:
                value, child = entry, (path, index)
            if isinstance(value, str):
                if len(value) >= MIN_LEN:
                    items.append((child, value))
            elif isinstance(value, dict):
                stack.append((child, True, enumerate(value.items())))
                break
            elif isinstance(value, list | tuple):
                stack.append((child, False, enumerate(value)))
                break
        else:
            stack.pop()
    return items


def _scan_strings(strings: list[tuple[_K, str]]) -> Iterator[tuple[_K, str]]:
    """(item index, detector) for each string that a check fires on (the first check wins)."""
    if not strings:
        return
    # Each check runs once over all strings joined by newlines (no pattern spans one), or
    # just over the strings holding its needles; if it fires, string by string for the path.
    texts = [text for _, text in strings]
    lowered_parts = [text.lower() for text in texts]
    starts = list(accumulate((len(part) + 1 for part in lowered_parts[:-1]), initial=0))
    joined, lowered = "\n".join(texts), "\n".join(lowered_parts)
    # Whitespace-free words long enough to hold a `min_word` check's match, by length.
    words = joined.split()
    long_words: dict[int, str] = {0: joined}
    hits: dict[int, list[Run]] = {}  # position in `strings` -> checks that fired there
    needled = _needle_owners(lowered, starts)
    for number, check in enumerate(VALUE_CHECKS):
        owners: Iterable[int] | None = None
        if check.needles:
            owners = needled.get(number, ())
        if owners is None:
            target = long_words.get(check.min_word)
            if target is None:
                target = long_words[check.min_word] = "\n".join(
                    word for word in words if len(word) >= check.min_word)
            if (check.gate is not None and not check.gate.search(target)) or not check.run(target):
                continue
            owners = range(len(texts))
        for position in owners:
            hits.setdefault(position, []).append(check.run)
    for position in sorted(hits):
        index, text = strings[position]
        for run in hits[position]:
            detector = run(text)
            if detector is not None:
                yield index, detector
                break


def _needle_automaton() -> ahocorasick.Automaton:
    """Every check's needles in one automaton: needle -> the numbers of its checks."""
    by_needle: dict[str, list[int]] = {}
    for number, check in enumerate(VALUE_CHECKS):
        for needle in check.needles:
            by_needle.setdefault(needle, []).append(number)
    automaton = ahocorasick.Automaton()
    for needle, numbers in by_needle.items():
        automaton.add_word(needle, (len(needle), tuple(numbers)))
    automaton.make_automaton()
    return automaton


_NEEDLES = _needle_automaton()
_BUDGET = 32  # needle hits past which a check runs over the whole text instead


def _needle_owners(lowered: str, starts: list[int]) -> dict[int, set[int] | None]:
    """For each check with a needle in ``lowered``: the indices of the strings holding one,
    or None when there are too many hits (one pass over the text for every check)."""
    owners: dict[int, set[int] | None] = {}
    counts: dict[int, int] = {}
    for end, (length, numbers) in _NEEDLES.iter(lowered):
        position = bisect_right(starts, end - length + 1) - 1
        for number in numbers:
            seen = counts[number] = counts.get(number, 0) + 1
            held = owners.setdefault(number, set())
            if held is None:
                continue
            if seen > _BUDGET:
                owners[number] = None
            else:
                held.add(position)
    return owners


def check_no_secrets(payload: object) -> None:
    """Raise SecretInPayload(path=..., detector=...) for the first finding: never the value."""
    for finding in find_secrets(payload):
        raise SecretInPayload(path=finding.path, detector=finding.detector)
