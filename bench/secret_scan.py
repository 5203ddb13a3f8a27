"""The credential scan's cost per operation: ``find_secrets_many`` (what enqueue and the
dispatcher's admission run) over realistic payloads — the benign corpus of
tests/unit/secret_corpus.py, 240 agent payloads of 0.1 to 5 KiB — in batches of 1, 10, 100.

Run as ``python -m bench.secret_scan`` (or from ``make bench``). To compare two trees, run
the file with the other tree first on the path: ``PYTHONPATH=OTHER python
bench/secret_scan.py`` (the scan and the corpus then come from OTHER).
"""

from __future__ import annotations

import sys
import time

from outbox.protection.secrets import find_secrets_many
from tests.unit.secret_corpus import BENIGN_PAYLOADS


def per_operation(batch: int, seconds: float = 2.0, rounds: int = 7) -> float:
    """Microseconds per payload, scanning the corpus ``batch`` payloads at a time: the
    best of ``rounds`` rounds (the least disturbed by the rest of the machine)."""
    payloads = list(BENIGN_PAYLOADS)
    chunks = [payloads[i:i + batch] for i in range(0, len(payloads), batch)]
    for chunk in chunks:  # warm: compiled patterns, caches
        find_secrets_many(chunk)
    best = float("inf")
    for _ in range(rounds):
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / rounds:
            for chunk in chunks:
                find_secrets_many(chunk)
            done += len(payloads)
        best = min(best, (time.perf_counter() - started) / done * 1e6)
    return best


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    for size in (1, 10, 100):
        print(f"batch {size:>3}: {per_operation(size, seconds):7.1f} µs per operation")
