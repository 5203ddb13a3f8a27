"""deploy/ checked with the real tools: promtool (config, rules, rule unit tests),
systemd-analyze (verify, security), the Kubernetes manifest against what the daemon
actually serves (its ConfigMap configuration run for real), the Containerfile and the
Grafana dashboard."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import load_config
from outbox import db, migrate
from tests.observability import CONTRACT, DEPLOY, http_get, metrics_port, need_tool
from tests.support.daemon import REPO_ROOT, DaemonProcess

PROM = DEPLOY / "prometheus"


def _run(*cmd: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


# -- Prometheus ------------------------------------------------------------------------


def test_promtool_checks_the_config_and_the_rules() -> None:
    promtool = need_tool("promtool")
    out = _run(promtool, "check", "config", str(PROM / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    out = _run(promtool, "check", "rules", str(PROM / "alerts.yml"))
    assert out.returncode == 0 and "SUCCESS: 6 rules found" in out.stdout, out.stdout + out.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = need_tool("promtool")
    out = _run(promtool, "test", "rules", str(PROM / "alerts_test.yml"))
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_each_alert_has_a_firing_and_a_silent_case_and_docs() -> None:
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    docs = (REPO_ROOT / "docs" / "operations.md").read_text()
    names = {a["alert"] for a in _alerts()}
    assert names == {
        "OutboxUnknownOperations", "OutboxBlockedOperationsGrowing",
        "OutboxOldestPendingTooOld", "OutboxDispatchErrorRatio",
        "OutboxFencingRejectionBurst", "OutboxDispatcherDown",
    }
    for name in names:
        cases = [c for t in tests for c in t["alert_rule_test"] if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in cases), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in cases), f"{name}: no case where it is silent"
        assert f"### {name}" in docs, f"{name} is not explained in docs/operations.md"
    served = {n.removesuffix("_total") for n in CONTRACT} | {"up"}
    for alert in _alerts():
        for metric in re.findall(r"\b(outbox_[a-z_]+|up)\b", alert["expr"]):
            assert metric.removesuffix("_total") in served, (alert["alert"], metric)


# -- systemd ---------------------------------------------------------------------------


def test_systemd_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    analyze = need_tool("systemd-analyze")
    unit = (DEPLOY / "systemd" / "outboxd.service").read_text()
    for setting in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                    "PrivateTmp=yes", "CapabilityBoundingSet=\n", "RestrictAddressFamilies="):
        assert setting in unit, setting
    # verify checks that ExecStart exists: point it at this checkout's real outboxd
    outboxd = Path(sys.executable).with_name("outboxd")
    assert outboxd.exists()
    local = tmp_path / "outboxd.service"
    local.write_text(unit.replace("/opt/outboxd/bin/outboxd", str(outboxd)))
    out = _run(analyze, "verify", str(local))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Unknown" not in out.stderr and "ignoring" not in out.stderr.lower(), out.stderr
    out = _run(analyze, "security", "--offline=true", "--threshold=25", str(local))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr


# -- Kubernetes ------------------------------------------------------------------------


def _manifest() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "outboxd-sidecar.yaml").read_text()))
    return {d["kind"]: d for d in docs}


@pytest.mark.slow
def test_kubernetes_probes_and_ports_are_what_the_daemon_serves(tmp_path: Path) -> None:
    k = _manifest()
    assert set(k) == {"ConfigMap", "Secret", "Deployment", "PodMonitor"}
    pod = k["Deployment"]["spec"]["template"]
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == "outboxd")
    migrate_init = next(c for c in pod["spec"]["initContainers"] if c["name"] != "outboxd")
    assert sidecar["restartPolicy"] == "Always"
    assert migrate_init["args"][0] == "migrate"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        assert sidecar[probe]["httpGet"]["path"] == path
        assert sidecar[probe]["httpGet"]["port"] == "metrics"
    monitor = k["PodMonitor"]["spec"]
    assert monitor["podMetricsEndpoints"][0] == {"port": "metrics", "path": "/metrics",
                                                 "interval": "15s"}
    job_label = monitor["jobLabel"]
    assert pod["metadata"]["labels"][job_label] == "outboxd"  # the alerts' job name
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # configuration from the ConfigMap, secrets from the Secret (as environment)
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "outboxd-config")
    config_path = f"{mount['mountPath']}/outboxd.toml"
    assert sidecar["args"] == ["run", "--config", config_path]
    assert sidecar["envFrom"] == [{"secretRef": {"name": k["Secret"]["metadata"]["name"]}}]
    toml_text = k["ConfigMap"]["data"]["outboxd.toml"]
    toml = tomllib.loads(toml_text)
    assert toml["metrics"]["port"] == ports["metrics"] and toml["metrics"]["host"] == "0.0.0.0"
    secret_env = k["Secret"]["stringData"]
    for header in toml["providers"]["tickets"]["headers"].values():
        assert header.startswith("env:") and header[4:] in secret_env

    # Run that configuration for real: the ConfigMap file, the Secret's variables (the
    # database pointed at a local SQLite file), the port moved to a free one on loopback.
    cfg_file = tmp_path / "outboxd.toml"
    cfg_file.write_text(toml_text)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    env = {**secret_env, "OUTBOXD_DATABASE_URL": url,
           "OUTBOXD_METRICS_HOST": "127.0.0.1", "OUTBOXD_METRICS_PORT": "0"}
    cfg = load_config(cfg_file, env=env)
    assert set(cfg.providers) == {"tickets"}
    engine = db.create_engine(url)
    migrate.upgrade(engine)  # what the outboxd-migrate init container does
    engine.dispose()
    with DaemonProcess(cfg_file, env=env) as daemon:
        port = metrics_port(daemon)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            path = sidecar[probe]["httpGet"]["path"]
            code, _, _ = http_get(f"http://127.0.0.1:{port}{path}")
            assert code == 200, (probe, path, daemon.log_text()[-2000:])
        code, body, _ = http_get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and b"outbox_dispatch_attempts_total" in body
        assert secret_env["TICKETS_TOKEN"].encode() not in body
    assert secret_env["TICKETS_TOKEN"] not in daemon.log_text()


# -- container file and dashboard ------------------------------------------------------


def test_containerfile_installs_the_package() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}" in text, package
    assert "COPY pyproject.toml README.md ./" in text  # README: the project's readme
    assert re.search(r"pip install [^\n]*\.\s*$", text, re.M)
    assert 'ENTRYPOINT ["outboxd"]' in text
    assert re.search(r"^USER \d+", text, re.M)
    port = re.search(r"OUTBOXD_METRICS_PORT=(\d+)", text)
    assert port and f"EXPOSE {port.group(1)}" in text
    assert f"127.0.0.1:{port.group(1)}/healthz" in text
    assert "OUTBOXD_METRICS_HOST=0.0.0.0" in text


def test_grafana_dashboard_uses_only_served_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "outboxd.json").read_text())
    assert dash["uid"] == "outboxd" and dash["title"] == "outboxd"
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(outbox_[a-z_]+)\b", e)}
    served = set(CONTRACT)
    served |= {f"{n}_bucket" for n, (kind, _) in CONTRACT.items() if kind == "histogram"}
    assert used <= served, used - served
    # the headline metrics of the issue are on it
    for name in ("outbox_retries_total", "outbox_duplicates_suppressed_total",
                 "outbox_unknown_operations", "outbox_oldest_pending_age_seconds"):
        assert name in used, name


@pytest.mark.parametrize("path", sorted(p.name for p in PROM.glob("*.yml")))
def test_prometheus_files_are_yaml(path: str) -> None:
    assert isinstance(yaml.safe_load((PROM / path).read_text()), dict)
