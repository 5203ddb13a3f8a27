"""``outboxd sim`` / ``python -m providers.sim``: run the simulated receiver.

Prints ``listening on http://HOST:PORT`` (flushed) once the socket is bound and, with
``--port-file``, writes the port there (atomically) at the same moment. Stops cleanly on
SIGTERM or SIGINT and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

from outbox.stop_signals import StopSignals
from providers.sim.faults import PROFILES, FaultDice, SettingsError, SimSettings
from providers.sim.ledger import Ledger
from providers.sim.server import SimServer

FAULT_FLAGS = (
    ("--p-drop-after-apply", "apply and persist, then close the connection with no response"),
    ("--p-5xx-before", "answer 500 without applying"),
    ("--p-5xx-after", "apply, then answer 500"),
    ("--p-429", "answer 429 with Retry-After (not applied)"),
    ("--p-503", "answer 503 with Retry-After (not applied)"),
    ("--p-slow", "sleep --slow-seconds before applying"),
)


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("a probability is in [0, 1]")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outboxd sim",
        description="A simulated receiver that honours Idempotency-Key, with fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="write the bound port here")
    parser.add_argument("--ledger", type=Path, help="SQLite file (default: temporary)")
    parser.add_argument("--profile", choices=PROFILES, default="ietf")
    parser.add_argument("--retention-seconds", type=_non_negative, default=86_400.0,
                        help="how long idempotency keys are kept")
    parser.add_argument("--seed", type=int, help="make fault decisions reproducible")
    for flag, text in FAULT_FLAGS:
        parser.add_argument(flag, type=_probability, default=0.0, help=f"probability: {text}")
    parser.add_argument("--retry-after", type=_non_negative, default=1.0,
                        help="Retry-After seconds for 429/503")
    parser.add_argument("--slow-seconds", type=_non_negative, default=2.0)
    parser.add_argument("--ignore-keys", action="store_true",
                        help="do not deduplicate at all")
    parser.add_argument("--lookup-lag-seconds", type=_non_negative, default=0.0,
                        help="lookups see an effect only this long after it was applied")
    parser.add_argument("--enforce-fencing", action="store_true",
                        help="412 for a fencing token lower than the highest seen for the key")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    settings = SimSettings()
    settings.update({
        "profile": args.profile,
        "retention_seconds": args.retention_seconds,
        "p_drop_after_apply": args.p_drop_after_apply,
        "p_5xx_before": args.p_5xx_before,
        "p_5xx_after": args.p_5xx_after,
        "p_429": args.p_429,
        "retry_after": args.retry_after,
        "p_503": args.p_503,
        "p_slow": args.p_slow,
        "slow_seconds": args.slow_seconds,
        "ignore_keys": args.ignore_keys,
        "lookup_lag_seconds": args.lookup_lag_seconds,
        "enforce_fencing": args.enforce_fencing,
    })
    return settings


def _write_port_file(path: Path, port: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".port-")
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"outboxd sim: {exc}", file=sys.stderr)
        return 2
    ledger = Ledger(str(args.ledger) if args.ledger else ":memory:")
    try:
        server = SimServer((args.host, args.port), ledger, settings, FaultDice(args.seed))
    except OSError as exc:
        ledger.close()
        print(f"outboxd sim: cannot listen on {args.host}:{args.port}: {exc.strerror} "
              "(choose another --port, or 0 for a free one)", file=sys.stderr)
        return 2  # a port a person chose: a usage error, like every other verb
    stop = threading.Event()
    signals = StopSignals(lambda _name: stop.set()).install()  # see outbox.stop_signals
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="sim-http", daemon=True
    )
    try:
        thread.start()
        host, port = server.server_address[:2]
        if args.port_file:
            _write_port_file(args.port_file, int(port))
        print(f"listening on http://{host!s}:{port}", flush=True)
        while not stop.wait(0.1):
            pass
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()
        ledger.close()
        signals.uninstall()
    return 0
