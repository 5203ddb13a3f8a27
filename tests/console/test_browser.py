"""End to end in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven
by Selenium; no browser download): a real ``outboxd run`` kills itself right after
committing ``dispatching``; a second replica, whose receiver is gone, finds the leases
expired and marks the operations ``unknown``. An operator logs in to ``outboxd console``,
finds one, opens its timeline, resolves it with evidence, and sees the override in the
timeline and ``applied`` in the database. The overview and the timeline are saved as
console-overview.png and console-timeline.png in the test's temporary directory, or in the
directory ``OUTBOXD_SCREENSHOTS`` names (``OUTBOXD_SCREENSHOTS=docs/img`` refreshes the
documentation's pictures).

Skipped (loudly) only when the browser is absent and CI is not ``true``; under CI=true
``.ci/run`` installs it and this test must run.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from outbox import db
from outbox.api import StagedOperation, advance
from tests.console import PASSWORDS, ConsoleProcess, events, row, write_users
from tests.dispatcher import config, failpoints
from tests.support.daemon import REPO_ROOT, DaemonProcess, status_counts, wait_until
from tests.support.sim import SimProcess

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TENANT = "acme"
CASES = ("ticket:create:case-8472", "refund:issue:order-1182", "email:send:case-8472")


def _browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing:
        message = (f"BROWSER TEST NOT RUN: {', '.join(missing)} missing (apt-get install "
                   "chromium chromium-driver; pip install -e '.[test]')")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: it must run; .ci/run installs the browser)")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="outboxd-chromium-")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--no-first-run", "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.outboxd_profile = profile
    return driver


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(driver.outboxd_profile, ignore_errors=True)


def stage(engine: Engine) -> None:
    with engine.begin() as conn:
        advance(conn, "support-case-8472", tenant_id=TENANT, expected_revision=0,
                phase="effects_staged", operations=[
                    StagedOperation(operation_id=op_id, provider="sim",
                                    payload={"case": "8472", "step": i})
                    for i, op_id in enumerate(CASES)] + [
                    StagedOperation(operation_id="refund:issue:order-1190", provider="sim",
                                    payload={"order": "1190", "amount": 40},
                                    requires_approval=True)])


def make_unknown(engine: Engine, url: str, tmp_path: Path) -> Path:
    """A real faulted run: crash after committing ``dispatching``, then lease expiry in a
    second replica that cannot reach the receiver (its look-ups are indeterminate)."""
    stage(engine)
    with SimProcess(tmp_path) as sim:
        cfg = config(tmp_path, url, sim, worker_id="replica-a")
        with DaemonProcess(cfg, env=failpoints("after_dispatching_commit=kill")) as crashing:
            assert crashing.wait(30) == -signal.SIGKILL, crashing.log_text()[-2000:]
    assert status_counts(engine).get("dispatching") == len(CASES)
    with DaemonProcess(config(tmp_path, url, sim, worker_id="replica-b")) as survivor:
        wait_until(lambda: status_counts(engine).get("unknown") == len(CASES), timeout=30,
                   message="lease expiry -> unknown")
        assert survivor.stop() == 0
    return cfg


def _images(tmp_path: Path) -> Path:
    chosen = os.environ.get("OUTBOXD_SCREENSHOTS")
    return (REPO_ROOT / chosen) if chosen else tmp_path / "img"


def _shot(driver: Any, images: Path, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height) + 160, 700), 2400))
    images.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(images / name))
    driver.set_window_size(1280, 900)


def test_an_operator_resolves_an_unknown_operation_with_evidence_in_a_browser(
    pg_url: str, tmp_path: Path, browser: Any
) -> None:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    images = _images(tmp_path)
    engine = db.create_engine(pg_url)
    try:
        cfg = make_unknown(engine, pg_url, tmp_path)
        users = write_users(tmp_path, {"alice": None})
        target = CASES[0]
        with ConsoleProcess(cfg, users) as console:
            wait = WebDriverWait(browser, 15)
            browser.get(console.url + "/")
            wait.until(ec.presence_of_element_located((By.ID, "user")))
            browser.find_element(By.ID, "user").send_keys("alice")
            browser.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
            browser.find_element(By.ID, "login").click()
            wait.until(ec.title_is("outboxd console"), browser.page_source[-1500:])
            assert "lease_expired" in browser.page_source
            _shot(browser, images, "console-overview.png")

            browser.find_element(By.LINK_TEXT, "Unknown").click()
            wait.until(ec.presence_of_element_located((By.LINK_TEXT, target))).click()
            WebDriverWait(browser, 15, ignored_exceptions=(WebDriverException,)).until(
                ec.text_to_be_present_in_element((By.ID, "status"), "unknown"))
            assert "replica-a" in browser.find_element(By.ID, "timeline").text
            assert "open" in browser.find_element(By.ID, "dedup-window").text

            Select(browser.find_element(By.ID, "outcome")).select_by_value("applied")
            browser.find_element(By.ID, "resolve-reason").send_keys(
                "ticket found in the helpdesk")
            browser.find_element(By.ID, "resolve-evidence").send_keys("HELPDESK-8472")
            before = browser.find_element(By.ID, "status")
            browser.find_element(By.ID, "resolve").click()
            wait.until(ec.staleness_of(before))  # the POST-redirect-GET replaced the page
            settled = WebDriverWait(browser, 15, ignored_exceptions=(WebDriverException,))
            settled.until(ec.text_to_be_present_in_element((By.ID, "status"), "applied"))
            timeline = browser.find_element(By.ID, "timeline").text
            assert "override" in timeline and "HELPDESK-8472" in timeline
            assert "alice" in timeline
            _shot(browser, images, "console-timeline.png")

        assert row(engine, TENANT, target)["status"] == "applied"
        override = [e for e in events(engine, TENANT, target) if e["kind"] == "override"]
        assert [(e["actor"], e["from_status"], e["to_status"], e["evidence_ref"])
                for e in override] == [("alice", "unknown", "applied", "HELPDESK-8472")]
        assert {row(engine, TENANT, op)["status"] for op in CASES[1:]} == {"unknown"}
    finally:
        engine.dispose()
    for name in ("console-overview.png", "console-timeline.png"):
        assert (images / name).stat().st_size < 400_000
