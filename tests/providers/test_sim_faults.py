"""Every sim fault mode and both profiles, through the real HTTP provider."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.base import LookupKind, OutcomeKind, Provider, TransportPhase
from tests.providers.scripted import make_dispatch
from tests.support.sim import SimProcess

MakeProvider = Callable[..., Provider]


def provider_for(make_provider: MakeProvider, sim: SimProcess, **keys: Any) -> Provider:
    section: dict[str, Any] = {
        "kind": "http", "url": sim.effects_url, "lookup_url": sim.lookup_url,
        "timeout_seconds": 2, "dedup_retention_seconds": 86400,
    }
    section.update(keys)
    return make_provider(**section)


def test_apply_then_replay(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path) as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        first, second = provider.send(dispatch), provider.send(dispatch)
        assert first.kind is OutcomeKind.APPLIED and first.status_code == 201
        assert first.replayed is False
        assert first.receipt is not None
        body = first.receipt["body"]
        assert body["idempotency_key"] == dispatch.idempotency_key
        assert body["effect_id"].startswith("eff_")
        assert second.kind is OutcomeKind.APPLIED and second.replayed is True
        assert second.receipt is not None and second.receipt["body"] == body
        found = provider.lookup(dispatch)
        assert found.kind is LookupKind.FOUND
        assert found.receipt is not None and found.receipt["body"] == body
        assert provider.lookup(make_dispatch()).kind is LookupKind.NOT_FOUND
        stats = sim.stats()
        assert stats["effects_per_key"] == {dispatch.idempotency_key: 1}
        assert (stats["replays"], stats["duplicates"], stats["total_effects"]) == (1, 0, 1)
        assert stats["requests"] == 2


def test_ietf_mismatch_is_422(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path) as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        provider.send(dispatch)
        outcome = provider.send(make_dispatch(idempotency_key=dispatch.idempotency_key,
                                              payload={"amount": 999}))
        assert outcome.kind is OutcomeKind.KEY_MISMATCH and outcome.status_code == 422
        assert sim.stats()["mismatches"] == 1


def test_stripe_mismatch_is_400_and_read_as_mismatch_when_configured(
    tmp_path: Path, make_provider: MakeProvider
) -> None:
    with SimProcess(tmp_path, "--profile", "stripe") as sim:
        stripe = provider_for(make_provider, sim, mismatch_status=400)
        plain = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        assert stripe.send(dispatch).kind is OutcomeKind.APPLIED
        other = make_dispatch(idempotency_key=dispatch.idempotency_key, payload={"n": 2})
        outcome = stripe.send(other)
        assert outcome.kind is OutcomeKind.KEY_MISMATCH and outcome.status_code == 400
        assert outcome.receipt is not None
        assert outcome.receipt["body"]["error"]["type"] == "idempotency_error"
        assert plain.send(other).kind is OutcomeKind.REJECTED


@pytest.mark.parametrize(("profile", "status"), [("ietf", 400), ("stripe", 201)])
def test_missing_key_per_profile(tmp_path: Path, profile: str, status: int) -> None:
    with SimProcess(tmp_path, "--profile", profile) as sim:
        response = httpx.post(sim.effects_url, json={"a": 1})
        assert response.status_code == status
        assert sim.stats()["total_effects"] == (1 if status == 201 else 0)


def test_slow_apply_times_out_then_409_then_replay(
    tmp_path: Path, make_provider: MakeProvider
) -> None:
    with SimProcess(tmp_path, "--p-slow", "1", "--slow-seconds", "1.2") as sim:
        provider = provider_for(make_provider, sim, timeout_seconds=0.4)
        dispatch = make_dispatch()
        first = provider.send(dispatch)
        assert first.kind is OutcomeKind.AMBIGUOUS
        assert first.transport_phase is TransportPhase.AFTER_WRITE
        assert first.error_class == "ReadTimeout"
        second = provider.send(dispatch)
        assert second.kind is OutcomeKind.IN_FLIGHT and second.status_code == 409
        assert provider.lookup(dispatch).kind is LookupKind.NOT_FOUND  # not completed yet
        sim.control(p_slow=0.0)
        deadline = time.monotonic() + 5
        while provider.lookup(dispatch).kind is not LookupKind.FOUND:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        third = provider.send(dispatch)
        assert third.kind is OutcomeKind.APPLIED and third.replayed is True
        stats = sim.stats()
        assert stats["duplicates"] == 0 and stats["total_effects"] == 1
        assert stats["faults"]["slow"] == 1 and stats["in_flight_conflicts"] == 1


def test_drop_after_apply_is_ambiguous_and_the_effect_exists(
    tmp_path: Path, make_provider: MakeProvider
) -> None:
    with SimProcess(tmp_path, "--p-drop-after-apply", "1") as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        outcome = provider.send(dispatch)
        assert outcome.kind is OutcomeKind.AMBIGUOUS
        assert outcome.transport_phase is TransportPhase.AFTER_WRITE
        assert outcome.error_class == "RemoteProtocolError"
        assert provider.lookup(dispatch).kind is LookupKind.FOUND
        sim.control(p_drop_after_apply=0)
        retry = provider.send(dispatch)
        assert retry.kind is OutcomeKind.APPLIED and retry.replayed is True
        stats = sim.stats()
        assert stats["faults"] == {"drop_after_apply": 1}
        assert stats["effects_per_key"] == {dispatch.idempotency_key: 1}


def test_5xx_before_applies_nothing(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--p-5xx-before", "1") as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        outcome = provider.send(dispatch)
        assert outcome.kind is OutcomeKind.AMBIGUOUS and outcome.status_code == 500
        assert outcome.transport_phase is TransportPhase.RESPONSE
        assert provider.lookup(dispatch).kind is LookupKind.NOT_FOUND
        assert sim.stats()["total_effects"] == 0
        assert sim.stats()["faults"] == {"5xx_before": 1}


def test_5xx_after_applies(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--p-5xx-after", "1") as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        outcome = provider.send(dispatch)
        assert outcome.kind is OutcomeKind.AMBIGUOUS and outcome.status_code == 500
        assert provider.lookup(dispatch).kind is LookupKind.FOUND
        sim.control(p_5xx_after=0)
        assert provider.send(dispatch).replayed is True
        assert sim.stats()["duplicates"] == 0


@pytest.mark.parametrize(("flag", "status", "fault"),
                         [("--p-429", 429, "429"), ("--p-503", 503, "503")])
def test_429_and_503_are_retryable_with_retry_after(
    tmp_path: Path, make_provider: MakeProvider, flag: str, status: int, fault: str
) -> None:
    with SimProcess(tmp_path, flag, "1", "--retry-after", "3") as sim:
        provider = provider_for(make_provider, sim)
        outcome = provider.send(make_dispatch())
        assert outcome.kind is OutcomeKind.RETRYABLE and outcome.status_code == status
        assert outcome.retry_after_seconds == 3.0
        stats = sim.stats()
        assert stats["total_effects"] == 0 and stats["faults"] == {fault: 1}


def test_ignore_keys_creates_duplicates(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--ignore-keys") as sim:
        provider = provider_for(make_provider, sim, dedup_retention_seconds=0)
        dispatch = make_dispatch()
        outcomes = [provider.send(dispatch) for _ in range(3)]
        assert all(o.kind is OutcomeKind.APPLIED and not o.replayed for o in outcomes)
        stats = sim.stats()
        assert stats["effects_per_key"] == {dispatch.idempotency_key: 3}
        assert stats["duplicates"] == 2


def test_lookup_lag(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--lookup-lag-seconds", "0.8") as sim:
        provider = provider_for(make_provider, sim, lookup_consistency="eventual",
                                lookup_settle_seconds=1)
        dispatch = make_dispatch()
        assert provider.send(dispatch).kind is OutcomeKind.APPLIED
        assert provider.lookup(dispatch).kind is LookupKind.NOT_FOUND
        time.sleep(0.9)
        assert provider.lookup(dispatch).kind is LookupKind.FOUND


def test_fencing_rejects_a_stale_token(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--enforce-fencing") as sim:
        provider = provider_for(make_provider, sim, fencing=True)
        dispatch = make_dispatch(fencing_token=5)
        assert provider.send(dispatch).kind is OutcomeKind.APPLIED
        stale = provider.send(make_dispatch(idempotency_key=dispatch.idempotency_key,
                                            fencing_token=3))
        assert stale.kind is OutcomeKind.REJECTED and stale.status_code == 412
        newer = provider.send(make_dispatch(idempotency_key=dispatch.idempotency_key,
                                            fencing_token=6))
        assert newer.kind is OutcomeKind.APPLIED and newer.replayed is True
        assert sim.stats()["fenced"] == 1


def test_prune_makes_a_reused_key_a_new_effect(
    tmp_path: Path, make_provider: MakeProvider
) -> None:
    with SimProcess(tmp_path) as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        provider.send(dispatch)
        assert sim.prune() == 1
        again = provider.send(dispatch)
        assert again.kind is OutcomeKind.APPLIED and again.replayed is False
        assert sim.stats()["duplicates"] == 1


def test_retention_window_expires_keys(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path, "--retention-seconds", "0.5") as sim:
        provider = provider_for(make_provider, sim)
        dispatch = make_dispatch()
        provider.send(dispatch)
        assert provider.send(dispatch).replayed is True
        time.sleep(0.6)
        assert provider.send(dispatch).replayed is False  # past the window: a new effect
        assert sim.stats()["effects_per_key"] == {dispatch.idempotency_key: 2}
        provider.send(make_dispatch())
        time.sleep(0.6)
        assert sim.prune(all_keys=False) == 2


def test_control_validates_and_reports(tmp_path: Path) -> None:
    with SimProcess(tmp_path) as sim:
        settings = sim.control(p_429=0.25, enforce_fencing=True)
        assert settings["p_429"] == 0.25 and settings["enforce_fencing"] is True
        for bad in ({"p_nope": 1}, {"p_429": 2}, {"enforce_fencing": 1}, {"profile": "x"}):
            response = httpx.post(f"{sim.url}/_control", json=bad)
            assert response.status_code == 400
        assert httpx.get(f"{sim.url}/_control").json()["p_429"] == 0.25
        assert httpx.get(f"{sim.url}/_nothing").status_code == 404


def test_any_path_is_an_effect_target(tmp_path: Path, make_provider: MakeProvider) -> None:
    with SimProcess(tmp_path) as sim:
        provider = make_provider(kind="http", url=f"{sim.url}/tickets/create",
                                 lookup_url=f"{sim.url}/tickets/by-key/{{idempotency_key}}")
        dispatch = make_dispatch(idempotency_key="key with/slash")
        assert provider.send(dispatch).kind is OutcomeKind.APPLIED
        assert provider.lookup(dispatch).kind is LookupKind.FOUND
