"""Observability and deployment tests: the metric set scraped over HTTP from a real
``outboxd run``, health endpoints, logs, ``outboxd status``, and the deploy/ assets checked
with the real tools (promtool, a real Prometheus, systemd-analyze). No mocks.

Tools from Debian packages (``prometheus`` brings ``promtool``; ``systemd`` brings
``systemd-analyze``) are skipped with a reason only when absent and ``CI`` is not
``true``; under ``CI=true`` (``.ci/run`` installs them) their absence is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import REPO_ROOT, DaemonProcess

DEPLOY = REPO_ROOT / "deploy"

#: DESIGN "Metrics" (contract): family name -> (type, label names).
CONTRACT: dict[str, tuple[str, frozenset[str]]] = {
    "outbox_dispatch_attempts_total": ("counter", frozenset({"provider", "outcome"})),
    "outbox_retries_total": ("counter", frozenset({"provider"})),
    "outbox_duplicates_suppressed_total": ("counter", frozenset({"provider", "source"})),
    "outbox_unknown_operations": ("gauge", frozenset()),
    "outbox_operations": ("gauge", frozenset({"status"})),
    "outbox_oldest_pending_age_seconds": ("gauge", frozenset()),
    "outbox_dispatch_duration_seconds": ("histogram", frozenset({"provider"})),
    "outbox_claim_duration_seconds": ("histogram", frozenset()),
    "outbox_fencing_rejections_total": ("counter", frozenset()),
    "outbox_dispatch_cycle_errors_total": ("counter", frozenset({"kind"})),
    "outbox_lease_expirations_total": ("counter", frozenset({"phase"})),
    "outbox_reconciliations_total": ("counter", frozenset({"provider", "result"})),
    "outbox_dedup_window_refusals_total": ("counter", frozenset({"provider"})),
    "outbox_blocked_operations": ("gauge", frozenset({"reason"})),
}


def need_tool(name: str) -> str:
    """The path of a Debian-packaged tool; skip (or, under CI=true, fail) when absent."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package: see .ci/run)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " — CI=true: a skipped tool test is a failure")
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes, str]:
    """GET ``url``: (status code, body, content type); HTTP errors are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


def http_json(url: str) -> tuple[int, Any]:
    code, body, _ = http_get(url)
    return code, json.loads(body)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line parsed as one JSON object (fails on any other line)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"log line {n} is not JSON: {line[:200]!r}") from exc
        assert isinstance(obj, dict), f"log line {n} is not a JSON object: {line[:200]!r}"
        out.append(obj)
    return out


def metrics_port(daemon: DaemonProcess, timeout: float = 30.0) -> int:
    """The port a daemon started with ``[metrics] port = 0`` logged (a JSON line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in daemon.log_text().splitlines():
            if '"port"' in line:
                record = json.loads(line)
                if "port" in record:
                    return int(record["port"])
        if not daemon.alive():
            raise AssertionError(f"outboxd exited:\n{daemon.log_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no metrics port logged:\n{daemon.log_text()[-3000:]}")


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> tuple[dict[str, str], Samples]:
    """``GET /metrics``: family name -> type, and sample name -> [(labels, value)]."""
    code, body, ctype = http_get(f"http://127.0.0.1:{port}/metrics")
    assert code == 200 and ctype.startswith("text/plain"), (code, ctype)
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return types, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v
        for got, v in samples.get(name, [])
        if all(got.get(k) == want for k, want in labels.items())
    )


def read(path: Path) -> str:
    return path.read_text()
