"""Operator tooling tests: the resume decision procedure (``outbox.recovery.plan``), the
audited overrides, ``outboxd ops`` and the verifier. Real databases, real ``outboxd``
processes, the real sim receiver; no mocks. Shared helpers live here.

States are produced by the dispatcher's own code: in-process through its statements
(claim, ``dispatching``, lease recovery, reconciliation), or by real processes killed at a
failpoint where a crash matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import Engine

from dispatcher.maintenance.lease_recovery import LeaseRecovery
from dispatcher.maintenance.reconcile import Reconciler
from dispatcher.store import store_for
from outbox.api import StagedOperation, advance
from providers.base import (
    Capabilities,
    Dispatch,
    LookupResult,
    Outcome,
    Provider,
    VerifyKind,
    VerifyResult,
)
from providers.registry import build_provider
from tests.support.daemon import REPO_ROOT

TENANT = "t1"


def stage(
    engine: Engine, task: str, ops: Sequence[str], *, tenant: str = TENANT,
    provider: str = "sim", payload: Mapping[str, Any] | None = None, **options: Any,
) -> None:
    with engine.begin() as conn:
        advance(conn, task, tenant_id=tenant, expected_revision=0, phase="staged",
                operations=[StagedOperation(
                    operation_id=o, provider=provider, **options,
                    payload=None if "payload_ref" in options else dict(payload or {"op": o}))
                    for o in ops])


def claim(engine: Engine, *, lease: float) -> tuple[int, list[tuple[int, int]]]:
    """The dispatcher's claim statement: every eligible row -> ``claimed``."""
    with engine.begin() as conn:
        token, rows, _ = store_for(engine.dialect.name).claim(
            conn, worker="test", limit=100, lease_seconds=lease)
    return token, [(r.id, r.state_revision) for r in rows]


def make_dispatching(engine: Engine, *, lease: float = 60.0) -> None:
    """Claim and commit ``dispatching`` (what a worker does right before sending)."""
    token, pairs = claim(engine, lease=lease)
    with engine.begin() as conn:
        store_for(engine.dialect.name).mark_dispatching(
            conn, token=token, pairs=pairs, lease_seconds=lease, actor="test"
        )


def make_unknown(engine: Engine) -> None:
    """``dispatching`` whose lease expires: lease recovery makes it ``unknown``."""
    make_dispatching(engine, lease=0.01)
    time.sleep(0.05)
    LeaseRecovery(engine, actor="test").run_once()


def make_blocked(engine: Engine, provider: str = "sim") -> None:
    """``unknown`` reconciled against a provider with no look-up: ``blocked``
    (``needs_operator``)."""
    make_unknown(engine)
    null = build_provider(provider, {"kind": "null"})
    Reconciler(engine, {provider: null}, actor="test").run_once()


def outboxd(*args: str, config: Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 60) -> subprocess.Popen[str]:
    """Start a real ``outboxd`` process (``communicate()`` it)."""
    argv = [sys.executable, "-m", "dispatcher.cli", *args]
    if config is not None:
        argv += ["--config", str(config)]
    return subprocess.Popen(argv, cwd=REPO_ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_all(*commands: Sequence[str], config: Path) -> list[tuple[int, str, str]]:
    """Run independent ``outboxd`` commands concurrently; ``(code, stdout, stderr)`` each."""
    procs = [outboxd(*c, config=config) for c in commands]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        results.append((p.returncode, out, err))
    return results


# -- a provider with the optional verify capability -----------------------------------


class VerifyingHttp:
    """The built-in ``http`` provider plus ``verify(receipt)``: read the effect back from
    the receiver by its key (a GET; it never sends the effect again). Every call is
    appended to ``calls_file`` so a test can count them across processes."""

    def __init__(self, inner: Provider, lookup_url: str, calls_file: Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities: Capabilities = inner.capabilities
        self.lookup_url = lookup_url
        self.calls_file = calls_file

    def send(self, dispatch: Dispatch) -> Outcome:
        return self.inner.send(dispatch)

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        return self.inner.lookup(dispatch)

    def close(self) -> None:
        self.inner.close()

    def verify(self, receipt: Mapping[str, Any]) -> VerifyResult:
        with self.calls_file.open("a") as f:
            f.write("verify\n")
        body = receipt.get("body")
        key = body.get("idempotency_key") if isinstance(body, Mapping) else None
        if not isinstance(body, Mapping) or not isinstance(key, str):
            return VerifyResult(VerifyKind.FAILED, reason="receipt names no effect")
        try:
            r = httpx.get(self.lookup_url.format(idempotency_key=key), timeout=5)
        except httpx.HTTPError as exc:
            return VerifyResult(VerifyKind.INDETERMINATE, reason=type(exc).__name__)
        if r.status_code == 200 and r.json().get("effect_id") == body.get("effect_id"):
            return VerifyResult(VerifyKind.VERIFIED, evidence={"effect_id": body["effect_id"]})
        return VerifyResult(VerifyKind.FAILED, reason=f"lookup {r.status_code}")


def verifying_providers(config: Path, calls_file: Path) -> dict[str, Provider]:
    from dispatcher.config import load_config
    from providers.registry import build_providers

    cfg = load_config(str(config))
    built = build_providers(cfg.providers)
    return {
        name: VerifyingHttp(p, str(cfg.providers[name]["lookup_url"]), calls_file)
        for name, p in built.items()
    }


def host_main(config: str, calls_file: str) -> int:
    """``outboxd run --once`` with verifying providers (run in a child process)."""
    from dispatcher.config import load_config
    from dispatcher.daemon import Daemon

    cfg = load_config(config)
    daemon = Daemon(cfg, providers=verifying_providers(Path(config), Path(calls_file)))
    return daemon.run(once=True)


def run_verifying_host(config: Path, calls_file: Path,
                       env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from tests.operator import host_main; "
            "sys.exit(host_main(sys.argv[1], sys.argv[2]))")
    return subprocess.run([sys.executable, "-c", code, str(config), str(calls_file)],
                          cwd=REPO_ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


def parse_json(text: str) -> Any:
    return json.loads(text)
