"""The metric set, scraped over HTTP from a real ``outboxd run`` (metrics port 0, found
in its JSON log line) while it drains operations into a real ``outboxd sim`` that answers
429 and drops responses after applying. The counters must agree with the receiver's own
``/_stats``; then a real Prometheus scrapes the same daemon and answers PromQL.

Why the counts must be *equal* here: in a clean run (no crash, no lease expiry) every
request the sim counts is exactly one recorded attempt, and every replay it answers is
read by the dispatcher that sent the request, with the lease still held. They can
legitimately differ when a process dies after the receiver answered and before the
outcome was recorded (the replay is then never counted, and the operation is settled by
reconciliation: ``source="reconcile_found_applied"``), or across restarts (counters start
at zero).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import Engine

from dispatcher.observability.metrics import REGISTRY
from outbox import db, migrate
from outbox.api import StagedOperation, advance
from tests.observability import (
    CONTRACT,
    DEPLOY,
    Samples,
    free_port,
    http_get,
    json_lines,
    metrics_port,
    need_tool,
    scrape,
    total,
)
from tests.support.daemon import (
    REPO_ROOT,
    DaemonProcess,
    http_provider,
    status_counts,
    wait_until,
    write_config,
)
from tests.support.sim import SimProcess

N = 40
PROVIDER = "sim"
CANARY_PAYLOAD = "canary-payload-value-5e1f0c"
CANARY_HEADER = "canary-header-value-9b27d4"

pytestmark = pytest.mark.slow


@dataclass
class Run:
    daemon: DaemonProcess
    sim: SimProcess
    engine: Engine
    port: int
    during: Samples  # a scrape taken while operations were still moving
    final: Samples
    types: dict[str, str]
    sim_stats: dict[str, Any]
    tmp: Path


def _write_config(tmp: Path, db_url: str, sim: SimProcess) -> Path:
    provider = http_provider(
        sim,
        max_attempts=40,
        max_elapsed_seconds=300,
        headers={"X-Api-Key": "env:OBS_CANARY_HEADER"},
    )
    return write_config(
        tmp,
        db_url,
        {PROVIDER: provider},
        dispatcher={"log_level": "DEBUG", "batch_size": 10},
        metrics={"enabled": True, "host": "127.0.0.1", "port": 0, "gauge_refresh_seconds": 0.2},
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("metrics-run")
    db_url = f"sqlite:///{tmp / 'outbox.db'}"
    engine = db.create_engine(db_url)
    migrate.upgrade(engine)
    _stage(engine)
    with SimProcess(
        tmp, "--p-429", "0.25", "--p-drop-after-apply", "0.25", "--retry-after", "0",
        "--seed", "17",
    ) as sim:
        cfg = _write_config(tmp, db_url, sim)
        with DaemonProcess(cfg, env={"OBS_CANARY_HEADER": CANARY_HEADER}) as daemon:
            port = metrics_port(daemon)
            _, during = scrape(port)
            wait_until(
                lambda: status_counts(engine).get("applied", 0) == N,
                timeout=60,
                message=f"{N} operations applied",
            )
            # The gauges come from the database on a scheduler job: wait for them to agree.
            wait_until(
                lambda: total(scrape(port)[1], "outbox_operations", status="applied") == N
                and total(scrape(port)[1], "outbox_operations", status="pending") == 0,
                timeout=30,
                message="gauges refreshed",
            )
            types, final = scrape(port)
            yield Run(daemon, sim, engine, port, during, final, types, sim.stats(), tmp)
    engine.dispose()


def _stage(engine: Engine) -> None:
    with engine.begin() as conn:
        advance(
            conn,
            "obs-task",
            tenant_id="t1",
            expected_revision=0,
            phase="staged",
            operations=[
                StagedOperation(
                    operation_id=f"obs-{i:03d}",
                    provider=PROVIDER,
                    payload={"n": i, "note": CANARY_PAYLOAD},
                )
                for i in range(N)
            ]
            # one the provider cannot take (payload schema 99): blocked, with a reason
            + [
                StagedOperation(
                    operation_id="obs-blocked",
                    provider=PROVIDER,
                    payload={"note": CANARY_PAYLOAD},
                    payload_schema=99,
                )
            ],
        )


def _family(name: str) -> str:
    return name.removesuffix("_total") if CONTRACT[name][0] == "counter" else name


def test_every_contract_metric_is_served_with_its_label_set(run: Run) -> None:
    for name, (kind, labels) in CONTRACT.items():
        family = _family(name)
        assert run.types.get(family) == kind, f"{name}: {run.types.get(family)} != {kind}"
        sample = name if kind != "histogram" else f"{name}_count"
        series = run.final.get(sample)
        assert series, f"{name}: no series served"
        for got, _ in series:
            assert set(got) == labels, f"{name}: labels {sorted(got)} != {sorted(labels)}"
    # histogram buckets: 1 ms ... 30 s
    for name in ("outbox_dispatch_duration_seconds", "outbox_claim_duration_seconds"):
        bounds = sorted(
            float(labels["le"])
            for labels, _ in run.final[f"{name}_bucket"]
            if labels["le"] != "+Inf"
        )
        assert bounds[0] == 0.001 and bounds[-1] == 30.0, (name, bounds)
    # names may be extended, but every served one is in the operator's metrics reference
    docs = (REPO_ROOT / "docs" / "operations.md").read_text()
    for family, kind in run.types.items():
        if family.startswith("outbox_"):
            name = f"{family}_total" if kind == "counter" else family
            assert f"`{name}" in docs, f"{name} is served but not in docs/operations.md"


def test_known_series_exist_at_zero_before_they_happen(run: Run) -> None:
    """Label values known in advance are served at 0, so rates and alerts see 0, not absence."""
    for outcome in ("applied", "rejected", "retryable", "ambiguous", "in_flight"):
        assert any(
            labels == {"provider": PROVIDER, "outcome": outcome}
            for labels, _ in run.final["outbox_dispatch_attempts_total"]
        ), outcome
    assert {labels["phase"] for labels, _ in run.final["outbox_lease_expirations_total"]} == {
        "claimed",
        "dispatching",
    }
    assert total(run.final, "outbox_dedup_window_refusals_total", provider=PROVIDER) == 0
    assert total(run.final, "outbox_fencing_rejections_total") == 0


def test_counters_agree_with_the_receiver(run: Run) -> None:
    stats, m = run.sim_stats, run.final
    faults = stats["faults"]
    assert faults.get("429", 0) > 0 and faults.get("drop_after_apply", 0) > 0, stats
    assert stats["duplicates"] == 0, stats
    assert len(stats["effects_per_key"]) == N

    retries = total(m, "outbox_retries_total", provider=PROVIDER)
    replays = total(
        m, "outbox_duplicates_suppressed_total", provider=PROVIDER, source="receiver_replay"
    )
    assert retries > 0
    assert replays > 0
    assert replays == stats["replays"]
    # every request the receiver saw is one recorded attempt, by outcome
    attempts = total(m, "outbox_dispatch_attempts_total", provider=PROVIDER)
    assert attempts == stats["requests"]
    assert total(m, "outbox_dispatch_attempts_total", outcome="retryable") == faults["429"]
    assert total(m, "outbox_dispatch_attempts_total", outcome="ambiguous") == faults[
        "drop_after_apply"
    ]
    # one applied outcome per operation: first time, or a replay after a dropped response
    assert total(m, "outbox_dispatch_attempts_total", outcome="applied") == N
    assert replays == faults["drop_after_apply"]
    # each failed attempt was followed by exactly one retry
    assert retries == faults["429"] + faults["drop_after_apply"]
    assert total(m, "outbox_dispatch_duration_seconds_count", provider=PROVIDER) == attempts
    assert total(m, "outbox_claim_duration_seconds_count") > 0


def test_gauges_come_from_the_database(run: Run) -> None:
    m = run.final
    assert status_counts(run.engine) == {"applied": N, "blocked": 1}
    assert total(m, "outbox_operations", status="applied") == N
    assert total(m, "outbox_operations", status="blocked") == 1
    assert total(m, "outbox_unknown_operations") == 0
    assert total(m, "outbox_oldest_pending_age_seconds") == 0
    (reason,) = [labels["reason"] for labels, _ in m["outbox_blocked_operations"]]
    assert reason and total(m, "outbox_blocked_operations", reason=reason) == 1
    assert total(m, "outbox_gauges_refreshed_timestamp_seconds") > time.time() - 60
    # while work was still pending, the first scrape saw it (the gauges ran at start-up)
    assert total(run.during, "outbox_operations", status="applied") < N


def test_health_endpoints_of_the_running_daemon(run: Run) -> None:
    code, body, ctype = http_get(f"http://127.0.0.1:{run.port}/healthz")
    assert (code, ctype) == (200, "application/json")
    assert json.loads(body)["alive"] is True
    code, body, _ = http_get(f"http://127.0.0.1:{run.port}/readyz")
    assert code == 200 and json.loads(body) == {"ready": True, "problem": None, "warnings": []}
    assert http_get(f"http://127.0.0.1:{run.port}/nope")[0] == 404


def test_logs_are_json_lines_without_payload_or_header_values(run: Run) -> None:
    text = run.daemon.log_text()
    records = json_lines(text)
    assert CANARY_PAYLOAD not in text and CANARY_HEADER not in text
    assert any(r.get("msg") == "metrics endpoint listening" and r["port"] == run.port
               for r in records)
    assert {"ts", "level", "logger", "msg"} <= set(records[0])
    assert any(r["level"] == "debug" for r in records), "log_level = DEBUG was configured"
    blocked = [r for r in records if r.get("operation_id") == "obs-blocked"]
    assert blocked and blocked[0]["tenant"] == "t1" and blocked[0]["status"] == "blocked"


# -- a real Prometheus -----------------------------------------------------------------


def _prom_query(base: str, query: str) -> dict[str, Any]:
    code, body, _ = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    answer: dict[str, Any] = json.loads(body)
    assert code == 200 and answer["status"] == "success", (query, answer)
    return answer


def _prom_value(base: str, query: str) -> float | None:
    result = _prom_query(base, query)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_a_real_prometheus_scrapes_outboxd(run: Run) -> None:
    prometheus = need_tool("prometheus")
    work = run.tmp / "prometheus"
    work.mkdir()
    (work / "alerts.yml").write_text((DEPLOY / "prometheus" / "alerts.yml").read_text())
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job = config["scrape_configs"][0]
    assert job["job_name"] == "outboxd"
    job.pop("file_sd_configs", None)
    job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{run.port}"]}]
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [prometheus, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        def ready() -> bool:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            try:
                return http_get(f"{base}/-/ready", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(ready, timeout=30, message="Prometheus ready")
        retries = total(run.final, "outbox_retries_total", provider=PROVIDER)
        query = f'sum(outbox_retries_total{{job="outboxd",provider="{PROVIDER}"}})'
        wait_until(lambda: _prom_value(base, query) == retries, timeout=30,
                   message="Prometheus to return the retry counter")
        assert _prom_value(base, 'up{job="outboxd"}') == 1.0
        replays = _prom_value(
            base, 'sum(outbox_duplicates_suppressed_total{source="receiver_replay"})')
        assert replays == run.sim_stats["replays"]

        # the alert rules load in a real server and evaluate cleanly
        def rules_evaluated() -> bool:
            _, body, _ = http_get(f"{base}/api/v1/rules")
            groups = json.loads(body)["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return len(rules) == 6 and all(
                r["health"] == "ok" and r.get("lastEvaluation", "").startswith("2")
                and not r["lastEvaluation"].startswith("0001") for r in rules)

        wait_until(rules_evaluated, timeout=30, message="alert rules evaluated")
        # nothing is wrong in this run: once outboxd has been scraped (OutboxDispatcherDown
        # may be pending before the first scrape), no alert is pending or firing
        wait_until(lambda: json.loads(http_get(f"{base}/api/v1/alerts")[1])["data"]["alerts"]
                   == [], timeout=30, message="no alerts")

        # every dashboard query is valid PromQL and names only metrics the daemon serves
        served = set(run.final) | {"up"}
        for expr in dashboard_exprs():
            concrete = (expr.replace("$__rate_interval", "1m").replace('"$job"', '"outboxd"')
                        .replace('"$provider"', '".*"'))
            _prom_query(base, concrete)
            for metric in re.findall(r"\b(outbox_[a-z_]+|up)\b", concrete):
                assert metric in served, (metric, expr)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "outboxd.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs
    return exprs


def test_registry_declares_the_contract() -> None:
    """In-process: the registry declares every contract name with its type."""
    declared = {m.name: m.type for m in REGISTRY.collect()}
    for name, (kind, _) in CONTRACT.items():
        assert declared.get(_family(name)) == kind, name
