"""Logging: JSON lines when not on a TTY (one event per line, identifiers as fields),
readable text on a TTY. Never payload values or credentials: callers pass identifiers
only, and this formatter copies only whitelisted ``extra`` fields."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

FIELDS = (
    "operation_id",
    "tenant",
    "task_id",
    "fencing_token",
    "attempt",
    "outcome",
    "status",
    "reason",
    "provider",
    "count",
    "returned_to_pending",
    "made_unknown",
    "cancelled",
    "worker",
    "port",
    "url",
    "revision",
    "error",
    "sqlstate",
    "phase",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            if name in record.__dict__:
                data[name] = record.__dict__[name]
        if record.exc_info and record.exc_info[0] is not None:
            data["exc"] = record.exc_info[0].__name__
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        extras = " ".join(f"{n}={record.__dict__[n]}" for n in FIELDS if n in record.__dict__)
        line = f"{base} {extras}".rstrip()
        if record.exc_info and record.exc_info[0] is not None:
            line += f" ({record.exc_info[0].__name__})"
        return line


def setup(level: str = "INFO", fmt: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger("outboxd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # Libraries' own warnings and errors go through the same formatter (one JSON object per
    # line, never a bare traceback); their INFO/DEBUG chatter (request URLs, SQL) does not.
    third_party = logging.StreamHandler(sys.stderr)
    third_party.setFormatter(handler.formatter)
    third_party.setLevel(logging.WARNING)
    third_party.set_name("outboxd-third-party")
    top = logging.getLogger()
    for old in [h for h in top.handlers if h.get_name() == "outboxd-third-party"]:
        top.removeHandler(old)
    top.addHandler(third_party)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # "job skipped: maximum number of running instances" is expected back-pressure.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
