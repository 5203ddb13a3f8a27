"""Adversarial payloads as a property: rows written by plain SQL whose content a database
may store but a driver or Python's JSON decoder cannot take (depth, width, numeric range,
string encodings, unusual Unicode, odd keys), inserted while a real ``outboxd run``
process dispatches.

Each hypothesis example is a list of row specifications (:class:`Spec`: a kind and a
number, cheap to draw and to shrink) turned into SQL literals, inserted one transaction
each, and then waited on until every inserted row has settled. Asserted for each example:

* the daemon is still running (at the end it exits 0 on SIGTERM);
* each row is refused at INSERT by the database, or parked (``blocked``) with a reason
  and never sent, or applied exactly once; a row Python cannot decode
  (:func:`outbox.decoding.decode_json`, or bytes that are not UTF-8) is never applied and
  is parked ``payload_undecodable``;
* the plain good row in each example is applied once.

``pytest tests/chaos/test_adversarial.py -s`` prints the figures per dialect;
``python -m tests.chaos.adversarial --dialect postgresql --examples 300`` runs a larger
property run and prints the same figures (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from outbox import db, migrate
from outbox.decoding import Undecodable, decode_json
from outbox.digest import default_idempotency_key
from tests.support.daemon import DaemonProcess, http_provider, wait_until, write_config
from tests.support.sim import SimProcess

TENANT = "adv"
PROVIDER = "sim"
SETTLED = ("applied", "verified", "rejected", "blocked", "cancelled")
STRINGS = {  # JSON string bodies (escapes as written in the JSON text)
    "lone-high": "\\ud800",
    "lone-low": "\\udfff tail",
    "pair-escaped": "\\ud83d\\ude00",
    "nul-escape": "a\\u0000b",
    "non-bmp": "\U0001f600\U00010348",
    "zero-width": "a\u200db\ufeff",
    "rtl-override": "\u202eabc",
    "noncharacter": "\ufffe\uffff",
    "combining": "e\u0301\u0301\u0301",
    "controls": "\\b\\f\\n\\r\\t\\u001f",
    "replacement": "\ufffd",
}
KINDS = ("depth", "width", "digits", "exponent", "string", "key", "not-utf8", "good")


@dataclass(frozen=True)
class Spec:
    kind: str
    n: int
    variant: str = ""


def specs() -> st.SearchStrategy[list[Spec]]:
    one = st.one_of(
        st.builds(Spec, st.just("depth"), st.integers(1, 90) | st.sampled_from([64, 65, 3000])),
        st.builds(Spec, st.just("width"), st.integers(0, 3000), st.sampled_from(["obj", "arr"])),
        st.builds(Spec, st.just("digits"), st.integers(1, 6000) | st.sampled_from([4300, 4301])),
        st.builds(Spec, st.just("exponent"), st.integers(-500, 500), st.sampled_from(["", "-"])),
        st.builds(Spec, st.just("string"), st.integers(0, 3), st.sampled_from(sorted(STRINGS))),
        st.builds(Spec, st.just("key"), st.integers(1, 80), st.sampled_from([".", "[", '"', ""])),
        st.builds(Spec, st.just("not-utf8"), st.integers(0, 3)),
    )
    return st.lists(one, min_size=1, max_size=8)


def json_text(spec: Spec) -> str | bytes:
    """The payload as the JSON text (or, for ``not-utf8``, bytes) a foreign writer sends."""
    k, n, v = spec.kind, spec.n, spec.variant
    if k == "depth":
        inner = "".join("[" if i % 2 else '{"d":' for i in range(n - 1))
        close = "".join("]" if i % 2 else "}" for i in reversed(range(n - 1)))
        return '{"a":' + inner + "1" + close + "}"
    if k == "width":
        if v == "obj":
            return "{" + ",".join(f'"k{i}":{i}' for i in range(n)) + "}"
        return '{"a":[' + ",".join(str(i) for i in range(n)) + "]}"
    if k == "digits":
        return '{"n":' + "9" * n + "}"
    if k == "exponent":
        return '{"n":' + v + "1e" + str(n) + "}"
    if k == "string":
        return json.dumps({"s": ""})[:-2] + STRINGS[v] * (n + 1) + '"}'
    if k == "key":  # odd keys, nested n deep
        key = json.dumps(f"a{v}b")
        return "".join("{" + key + ":" for _ in range(n)) + "1" + "}" * n
    if k == "not-utf8":
        return b'{"s":"caf' + bytes([0xFF, 0xC3, 0x28, 0x80][n % 4]) + b'"}'
    return json.dumps({"good": n})


def literal(engine: Engine, raw: str | bytes) -> str:
    pg = engine.dialect.name == "postgresql"
    if isinstance(raw, bytes):
        hexed = raw.hex()
        return (f"CAST(convert_from(decode('{hexed}', 'hex'), 'UTF8') AS jsonb)" if pg
                else f"CAST(X'{hexed}' AS TEXT)")
    quoted = "'" + raw.replace("'", "''") + "'"
    return f"CAST({quoted} AS jsonb)" if pg else quoted


def undecodable(raw: str | bytes) -> bool:
    """Whether the dispatcher cannot decode this payload (it must never be applied)."""
    return isinstance(decode_json(raw, "payload"), Undecodable)


@dataclass
class Figures:
    tried: int = 0
    refused: int = 0
    refused_by: Counter[str] = field(default_factory=Counter)
    parked: Counter[str] = field(default_factory=Counter)
    applied: int = 0
    good_applied: int = 0
    examples: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self, dialect: str) -> str:
        parked = ", ".join(f"{r} {c}" for r, c in self.parked.most_common())
        refused = ", ".join(f"{r} {c}" for r, c in self.refused_by.most_common())
        return (f"{dialect}: {self.examples} examples, {self.tried} rows tried; refused at "
                f"INSERT {self.refused} ({refused}); "
                f"parked {sum(self.parked.values())} ({parked}); "
                f"applied once {self.applied} (of which plain good rows {self.good_applied})")


class Run:
    """A real ``outboxd sim`` and ``outboxd run`` against ``url``, and the figures."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.engine = db.create_engine(url)
        self.figures = Figures()
        self.sim = SimProcess(workdir)
        self.sim.__enter__()
        config = write_config(workdir, url, {PROVIDER: http_provider(self.sim)},
                              dispatcher={"lease_seconds": 5})
        self.daemon = DaemonProcess(config)
        self.closed_with: int | None = None
        self._ids = itertools.count()

    def close(self) -> int:
        """Stop the daemon (SIGTERM) and the sim; the daemon's exit code."""
        try:
            self.closed_with = self.daemon.stop()
            return self.closed_with
        finally:
            self.daemon.__exit__(None, None, None)  # closes its log
            self.sim.__exit__(None, None, None)
            self.engine.dispose()

    def example(self, batch: list[Spec]) -> None:
        f = self.figures
        f.examples += 1
        rows: dict[str, tuple[Spec, str | bytes]] = {}
        for spec in [*batch, Spec("good", 0)]:
            op_id = f"adv-{next(self._ids):06d}-{spec.kind}"
            raw = json_text(spec)
            f.tried += 1
            try:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(
                        "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, "
                        f"provider, payload) VALUES ('{TENANT}', 'adv', '{op_id}', "
                        f"'{PROVIDER}', {literal(self.engine, raw)})")
            except sa.exc.DBAPIError as exc:
                f.refused += 1
                f.refused_by[_refusal(exc)] += 1
                continue
            rows[op_id] = (spec, raw)
        wait_until(lambda: self._settled(list(rows)), timeout=60,
                   message=f"rows settled: {sorted(rows)}")
        if not self.daemon.alive():
            f.problems.append("the daemon exited")
            raise AssertionError("the daemon exited")
        effects = self.sim.stats()["effects_per_key"]
        for op_id, (status, reason, attempts) in self._status(list(rows)).items():
            spec, raw = rows[op_id]
            sent = effects.get(default_idempotency_key(TENANT, op_id), 0)
            problem = None
            if status == "blocked":
                f.parked[str(reason)] += 1
                if sent or attempts:
                    problem = f"{op_id}: parked ({reason}) but sent"
                elif undecodable(raw) and reason != "payload_undecodable":
                    problem = f"{op_id}: undecodable, parked as {reason}"
            elif status == "applied":
                f.applied += 1
                f.good_applied += spec.kind == "good"
                if sent != 1:
                    problem = f"{op_id}: applied with {sent} effects"
                elif undecodable(raw):
                    problem = f"{op_id}: undecodable, yet applied"
            else:
                problem = f"{op_id}: ended {status} ({reason})"
            if spec.kind == "good" and status != "applied":
                problem = f"{op_id}: a good row ended {status} ({reason})"
            if problem:
                f.problems.append(problem)
                raise AssertionError(problem)

    def _status(self, ids: list[str]) -> dict[str, tuple[str, str | None, int]]:
        if not ids:
            return {}
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT operation_id, status, status_reason, attempts "
                        "FROM outbox_operations WHERE tenant_id = :t "
                        "AND operation_id IN :ids").bindparams(sa.bindparam("ids",
                                                                             expanding=True)),
                {"t": TENANT, "ids": ids},
            ).all()
        return {r[0]: (r[1], r[2], r[3]) for r in found}

    def _settled(self, ids: list[str]) -> bool:
        status = self._status(ids)
        return len(status) == len(ids) and all(s in SETTLED for s, _, _ in status.values())


def _refusal(exc: sa.exc.DBAPIError) -> str:
    """A short name for why the database refused a row (our rule, or the type's input)."""
    text = str(exc.orig or exc)
    if "outbox: " in text:
        rule = text[text.index("outbox: ") + 8 :].splitlines()[0]
        return rule.replace("payload ", "", 1)
    return type(exc.orig or exc).__name__


def property_run(run: Run, examples: int, seed: int | None = None) -> None:
    """Run the property for ``examples`` hypothesis examples against ``run``."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(specs())
    def prop(batch: list[Spec]) -> None:
        run.example(batch)

    if seed is not None:
        from hypothesis import seed as with_seed

        prop = with_seed(seed)(prop)
    prop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1,
                        help="hypothesis seed (the CI test runs derandomized examples)")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = f"sqlite:///{work / 'adv.db'}"
        if args.dialect == "postgresql":
            url = _fresh_pg(args.pg_url)
        engine = db.create_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        t0 = time.monotonic()
        run = Run(url, work)
        try:
            property_run(run, args.examples, args.seed)
        finally:
            code = run.close()
        print(run.figures.summary(args.dialect) + f"; daemon exit code {code}; "
              f"{time.monotonic() - t0:.0f} s")


def _fresh_pg(admin_url: str) -> str:
    import psycopg

    name = f"outboxd_adv_{int(time.time())}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


if __name__ == "__main__":
    main()
