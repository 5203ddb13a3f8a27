"""Failpoints: kill or pause this process at a named point, for crash tests.

``OUTBOXD_FAILPOINTS="after_dispatching_commit=kill"`` (comma-separated ``name=action``;
``action@N`` fires on the N-th hit only; ``action%P`` fires on each hit with probability
``P``, drawn from a generator seeded by ``OUTBOXD_FAILPOINT_SEED`` so a run reproduces).
Actions: ``kill`` (SIGKILL self), ``stop`` (SIGSTOP, stopping the calling thread before
:func:`hit` returns, and the whole process with it), ``exit`` (``os._exit(3)``),
``sleep:SECONDS``. With ``OUTBOXD_FAILPOINT_LOG=FILE`` every firing appends a line
``name action pid`` to FILE (one ``write`` on an ``O_APPEND`` descriptor, done before the
action, so it survives the SIGKILL it announces): a chaos checker counts each point's
firings from it. Read once at import; when the variable is unset :func:`hit` is a
dictionary miss and nothing else.

``OUTBOXD_FAILPOINT_CONTROL=FILE`` lets a test harness re-arm a running process: on each
hit the file is ``stat``-ed and, when it changed, its content (the same ``name=action``
syntax) is armed on top of ``OUTBOXD_FAILPOINTS`` (a point named in both takes the file's
action) and the hit counts of the points it names restart (so ``stop@1`` written there
fires on the next pass). Write it atomically (rename); a missing file arms nothing more.

Points: ``after_claim_commit`` (after the held claim's statement, inside the transaction
that goes on to mark: nothing is committed there),
``after_dispatching_commit``, ``before_write`` (in the sending thread, after the last
lease and window checks, before the request is written), ``after_send`` (the
request was written and answered, nothing recorded yet), ``before_receipt_commit`` (the
outcomes are decided but not durable: on SQLite the writes are made and not committed;
on PostgreSQL, where the record is one self-committing statement, it has not run — the
durable state is the same),
``in_reconcile`` (after the look-up, before its result is written).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int | None, float | None]]:
    points: dict[str, tuple[str, int | None, float | None]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition("=")
        nth: int | None = None
        probability: float | None = None
        if "@" in action:
            action, _, n = action.partition("@")
            nth = int(n)
        if "%" in action:
            action, _, p = action.partition("%")
            probability = float(p)
        points[name.strip()] = (action.strip() or "kill", nth, probability)
    return points


_ENV_POINTS = _parse(os.environ.get("OUTBOXD_FAILPOINTS", ""))
_POINTS = dict(_ENV_POINTS)
_RNG = random.Random(os.environ.get("OUTBOXD_FAILPOINT_SEED") or None)
_LOG = os.environ.get("OUTBOXD_FAILPOINT_LOG")
_CONTROL = os.environ.get("OUTBOXD_FAILPOINT_CONTROL")
_control_seen: tuple[int, int] | None = None


def _reload_control() -> None:
    """Re-read the control file if it changed (caller holds ``_lock``)."""
    global _POINTS, _control_seen
    assert _CONTROL is not None
    try:
        st = os.stat(_CONTROL)
        seen = (st.st_mtime_ns, st.st_size)
    except OSError:
        seen = (0, 0)
    if seen == _control_seen:
        return
    _control_seen = seen
    try:
        with open(_CONTROL, encoding="utf-8") as fh:
            spec = fh.read()
    except OSError:
        spec = ""
    extra = _parse(spec)
    _POINTS = {**_ENV_POINTS, **extra}
    for name in extra:
        _hits.pop(name, None)


def _record(name: str, action: str) -> None:
    if not _LOG:
        return
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {action} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def hit(name: str) -> None:
    """Fire the failpoint ``name`` if one is configured."""
    if _CONTROL is not None:
        with _lock:
            _reload_control()
    if not _POINTS or name not in _POINTS:
        return
    with _lock:
        action, nth, probability = _POINTS.get(name, ("", None, None))
        if not action:
            return
        _hits[name] = count = _hits.get(name, 0) + 1
        draw = _RNG.random() if probability is not None else 0.0
    if nth is not None and count != nth:
        return
    if probability is not None and draw >= probability:
        return
    _record(name, action)
    sys.stderr.write(f"outboxd: failpoint {name} -> {action}\n")
    sys.stderr.flush()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        # at the calling thread: a process-directed SIGSTOP may be taken by another thread
        # first, and on a busy host this one would run on (and send) until the group stop
        # reached it; a thread-directed one stops this thread before the call returns
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif action == "exit":
        os._exit(3)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
