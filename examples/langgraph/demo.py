"""The LangGraph demo (``make demo-langgraph``): a graph stages a ticket, is killed, resumes,
and continues with the receipt — and the receiver holds exactly one ticket.

Everything is real and local: a SQLite file holding LangGraph's checkpoints and the outbox,
``outboxd sim`` as the ticket system on a free loopback port, ``outboxd run`` as the
sidecar, and ``examples/langgraph/graph.py`` run three times:

1. killed (SIGKILL) right after the tool node's save — the effect is staged, with the
   checkpoint, and nothing has been sent;
2. resumed with no sidecar running and a short wait — no receipt yet, the graph says so;
3. resumed with the sidecar running — it waits for the receipt and replies with it.

Run: ``python examples/langgraph/demo.py`` (or ``make demo-langgraph``). Exit status 0 when
the receiver saw one effect and the graph finished with its receipt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GRAPH = HERE / "graph.py"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def graph(url: str, *args: str) -> int:
    done = subprocess.run([sys.executable, str(GRAPH), "--database", url,
                           "--thread", "support-42", *args], check=False)
    return done.returncode


def start_sim(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = directory / "sim.port"
    sim = subprocess.Popen(
        [sys.executable, "-m", "providers.sim", "--host", "127.0.0.1", "--port", "0",
         "--port-file", str(port_file), "--ledger", str(directory / "sim.sqlite"),
         "--log-level", "WARNING"])
    for _ in range(500):
        if port_file.exists() and port_file.read_text().strip():
            return sim, int(port_file.read_text())
        if sim.poll() is not None:
            raise SystemExit("the sim did not start")
        time.sleep(0.02)
    raise SystemExit("the sim did not start in 10 s")


def sim_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats", timeout=5) as response:
        stats: dict[str, Any] = json.loads(response.read())
        return stats


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="outboxd-langgraph-") as tmp:
        directory = Path(tmp)
        url = f"sqlite:///{directory / 'agent.db'}"
        sim, port = start_sim(directory)
        config = directory / "outboxd.toml"
        config.write_text(f"""[database]
url = "{url}"
[dispatcher]
poll_interval_ms = 50
log_level = "WARNING"
[metrics]
enabled = false
[providers.tickets]
kind = "http"
url = "http://127.0.0.1:{port}/tickets"
lookup_url = "http://127.0.0.1:{port}/tickets/by-key/{{idempotency_key}}"
dedup_retention_seconds = 86400
""")
        sidecar = None
        try:
            step("1. the graph stages the ticket and is killed right after its save")
            graph(url, "--crash", "after-commit")
            step("2. resumed, no sidecar running yet: the ticket is staged, not sent")
            graph(url, "--timeout", "1")
            step("3. the sidecar starts; the graph resumes, waits, and replies with the receipt")
            sidecar = subprocess.Popen([sys.executable, "-m", "dispatcher.cli", "run",
                                        "--config", str(config)])
            code = graph(url)
            stats = sim_stats(port)
            effects = stats["effects_per_key"]
            step(f"the ticket system holds {sum(effects.values())} effect(s): "
                 f"{json.dumps(effects)}; duplicates suppressed or refused: "
                 f"{stats['duplicates']}")
            ok = code == 0 and list(effects.values()) == [1] and stats["duplicates"] == 0
            print("demo: OK" if ok else "demo: FAILED", flush=True)
            return 0 if ok else 1
        finally:
            if sidecar is not None:
                sidecar.terminate()
                sidecar.wait(timeout=30)
            sim.terminate()
            sim.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
