"""The simulated receiver's behaviour settings and its (optionally seeded) fault dice.

:class:`SimSettings` holds every knob the command-line flags set and ``POST /_control``
changes at run time (same names, with ``_`` for ``-``). :class:`FaultDice` decides which
faults hit a request: with a seed, the decision for the *n*-th effect request depends only
on ``(seed, n)`` and the probabilities, so the same seed and the same request sequence
give the same fault sequence, whatever the timing. Every request draws all six numbers in
a fixed order, so enabling one fault does not shift the dice of the others.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

PROFILES: Final = ("ietf", "stripe")
FAULTS: Final = ("p_429", "p_503", "p_5xx_before", "p_slow", "p_drop_after_apply", "p_5xx_after")


class SettingsError(ValueError):
    """A control request or flag named an unknown setting or gave a bad value."""


@dataclass
class SimSettings:
    profile: str = "ietf"
    retention_seconds: float = 86_400.0
    p_drop_after_apply: float = 0.0
    p_5xx_before: float = 0.0
    p_5xx_after: float = 0.0
    p_429: float = 0.0
    retry_after: float = 1.0
    p_503: float = 0.0
    p_slow: float = 0.0
    slow_seconds: float = 2.0
    ignore_keys: bool = False
    lookup_lag_seconds: float = 0.0
    enforce_fencing: bool = False

    def snapshot(self) -> SimSettings:
        return dataclasses.replace(self)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def update(self, changes: Mapping[str, Any]) -> None:
        """Validate every change first, then apply them all (or none)."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in fields:
                raise SettingsError(f"unknown setting {name!r}")
            current = getattr(self, name)
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise SettingsError(f"{name} must be true or false")
            elif isinstance(current, float):
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise SettingsError(f"{name} must be a number >= 0")
                if name.startswith("p_") and value > 1:
                    raise SettingsError(f"{name} is a probability in [0, 1]")
                checked[name] = float(value)
                continue
            elif name == "profile" and value not in PROFILES:
                raise SettingsError(f"profile must be one of {', '.join(PROFILES)}")
            checked[name] = value
        for name, value in checked.items():
            setattr(self, name, value)


@dataclass(frozen=True)
class Decision:
    index: int
    fault_429: bool = False
    fault_503: bool = False
    fault_5xx_before: bool = False
    slow: bool = False
    drop_after_apply: bool = False
    fault_5xx_after: bool = False

    def names(self) -> list[str]:
        """The faults chosen, for the fault log (``/_stats``)."""
        return [f.name for f in dataclasses.fields(self) if f.type != "int" and getattr(
            self, f.name)]


class FaultDice:
    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._lock = threading.Lock()
        self._count = 0
        self._system = random.SystemRandom()

    def decide(self, settings: SimSettings) -> Decision:
        with self._lock:
            index = self._count
            self._count += 1
        rng: random.Random = (
            self._system if self.seed is None else random.Random(f"{self.seed}:{index}")
        )
        draws = [rng.random() for _ in FAULTS]
        hits = {name: draw < getattr(settings, name) for name, draw in zip(FAULTS, draws,
                                                                            strict=True)}
        return Decision(
            index=index,
            fault_429=hits["p_429"],
            fault_503=hits["p_503"],
            fault_5xx_before=hits["p_5xx_before"],
            slow=hits["p_slow"],
            drop_after_apply=hits["p_drop_after_apply"],
            fault_5xx_after=hits["p_5xx_after"],
        )
