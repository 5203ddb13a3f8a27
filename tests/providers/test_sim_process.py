"""The sim as a process: CLI, clean stops, a ledger that survives restarts, seeded faults."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from providers.base import Outcome, OutcomeKind, Provider
from providers.sim.cli import build_parser
from providers.sim.faults import FaultDice, SimSettings
from tests.providers.scripted import make_dispatch
from tests.support.sim import REPO_ROOT, SimProcess

MakeProvider = Callable[..., Provider]
FAULTY = ("--p-429", "0.2", "--p-503", "0.1", "--p-5xx-before", "0.1",
          "--p-5xx-after", "0.1", "--p-drop-after-apply", "0.1", "--retry-after", "0")


def test_parser_defaults_and_flags() -> None:
    args = build_parser().parse_args([])
    assert (args.host, args.port, args.profile, args.seed) == ("127.0.0.1", 0, "ietf", None)
    assert args.ignore_keys is False and args.enforce_fencing is False
    args = build_parser().parse_args(["--p-slow", "0.5", "--slow-seconds", "3",
                                      "--profile", "stripe", "--ignore-keys"])
    assert (args.p_slow, args.slow_seconds, args.profile, args.ignore_keys) == (
        0.5, 3.0, "stripe", True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--p-429", "1.5"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_prints_listening_and_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    port_file = tmp_path / "port"
    with subprocess.Popen(
        [sys.executable, "-m", "providers.sim", "--port-file", str(port_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, text=True,
    ) as process:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        port = int(port_file.read_text())
        assert line == f"listening on http://127.0.0.1:{port}"
        assert httpx.get(f"http://127.0.0.1:{port}/_stats").status_code == 200
        process.send_signal(sig)
        assert process.wait(timeout=10) == 0


def test_ledger_survives_a_restart(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path) as sim:
        provider = make_provider(kind="http", url=sim.effects_url, lookup_url=sim.lookup_url)
        dispatch = make_dispatch()
        first = provider.send(dispatch)
        old_pid = sim.pid
        assert sim.stop() == 0
        sim.start()
        assert sim.pid != old_pid
        assert provider.lookup(dispatch).kind.value == "found"
        again = provider.send(dispatch)
        assert again.kind is OutcomeKind.APPLIED and again.replayed is True
        assert again.receipt is not None and first.receipt is not None
        assert again.receipt["body"] == first.receipt["body"]
        sim.restart()
        stats = sim.stats()
        assert stats["effects_per_key"] == {dispatch.idempotency_key: 1}
        assert (stats["requests"], stats["replays"]) == (2, 1)


def _run(make_provider: MakeProvider, sim: SimProcess, n: int) -> list[tuple[str, int | None]]:
    provider = make_provider(kind="http", url=sim.effects_url, timeout_seconds=2)
    outcomes: list[Outcome] = [
        provider.send(make_dispatch(idempotency_key=f"seeded-{i}")) for i in range(n)
    ]
    return [(o.kind.value, o.status_code) for o in outcomes]


def test_same_seed_same_fault_sequence(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--seed", "7", *FAULTY) as a:
        first = _run(make_provider, a, 30)
        faults_a = a.stats()["faults"]
    with SimProcess(tmp_path, "--seed", "7", *FAULTY) as b:
        second = _run(make_provider, b, 30)
        assert b.stats()["faults"] == faults_a
    assert first == second
    assert len(set(first)) > 2  # several different faults actually happened
    with SimProcess(tmp_path, "--seed", "8", *FAULTY) as c:
        assert _run(make_provider, c, 30) != first


def test_dice_draws_do_not_shift_when_one_fault_is_enabled() -> None:
    quiet, noisy = SimSettings(), SimSettings(p_429=0.5)
    a, b = FaultDice(seed=1), FaultDice(seed=1)
    decisions_a = [a.decide(noisy) for _ in range(50)]
    [b.decide(quiet) for _ in range(10)]
    assert b.decide(noisy) == decisions_a[10]
