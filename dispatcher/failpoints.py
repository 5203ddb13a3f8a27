"""Failpoints: kill or pause this process at a named point, for crash tests.

``OUTBOXD_FAILPOINTS="after_dispatching_commit=kill"`` (comma-separated ``name=action``;
``action@N`` fires on the N-th hit only). Actions: ``kill`` (SIGKILL self), ``stop``
(SIGSTOP self), ``exit`` (``os._exit(3)``), ``sleep:SECONDS``. Read once at import; when
the variable is unset :func:`hit` is a dictionary miss and nothing else.

Points: ``after_claim_commit``, ``after_dispatching_commit``, ``after_send`` (the
request was written and answered, nothing recorded yet), ``before_receipt_commit``,
``in_reconcile`` (after the look-up, before its result is written).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int | None]]:
    points: dict[str, tuple[str, int | None]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition("=")
        nth: int | None = None
        if "@" in action:
            action, _, n = action.partition("@")
            nth = int(n)
        points[name.strip()] = (action.strip() or "kill", nth)
    return points


_POINTS = _parse(os.environ.get("OUTBOXD_FAILPOINTS", ""))


def hit(name: str) -> None:
    """Fire the failpoint ``name`` if one is configured."""
    if not _POINTS or name not in _POINTS:
        return
    action, nth = _POINTS[name]
    with _lock:
        _hits[name] = count = _hits.get(name, 0) + 1
    if nth is not None and count != nth:
        return
    sys.stderr.write(f"outboxd: failpoint {name} -> {action}\n")
    sys.stderr.flush()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "exit":
        os._exit(3)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
