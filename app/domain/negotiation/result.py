"""What a negotiation answers: the suite, its costed alternatives and why algorithms were rejected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.domain.policies import Levels

__all__ = ["NegotiationResult", "Rejection", "Suite", "SuiteOption"]

@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one algorithm could not be used, and which peer (if any) caused it."""

    algorithm: str
    kind: str
    reason: str
    peer: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "kind": self.kind, "reason": self.reason, "peer": self.peer}


@dataclass(frozen=True, slots=True)
class Suite:
    """The chosen protection. ``encryption`` holds the AEAD keyword for AEAD suites;
    ``post_quantum`` the post-quantum mechanism (``ppk``, ``mlkem768``, ...), None when none was
    asked for."""

    protocol: str
    encryption: str | None
    integrity: str | None
    key_exchange: str | None
    aead: bool = False
    post_quantum: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "encryption": self.encryption,
            "integrity": self.integrity,
            "key_exchange": self.key_exchange,
            "aead": self.aead,
            "post_quantum": self.post_quantum,
        }


@dataclass(frozen=True, slots=True)
class SuiteOption:
    """One costed candidate for the data plane (ESP and/or AH)."""

    cipher: str | None
    integrity: str | None
    cost: float
    confidentiality: int
    integrity_level: int
    order: tuple[int, int]

    def key(self) -> tuple[float, int, int, tuple[int, int]]:
        return (self.cost, -self.confidentiality, -self.integrity_level, self.order)


@dataclass(frozen=True)
class NegotiationResult:
    """The answer, explaining itself."""

    suite: Suite
    proposals: dict[str, str | None]
    levels: Levels
    cost: float
    cost_unit: str
    mode: str
    lifetimes: dict[str, int]
    ike: dict[str, str | None]
    alternatives: list[dict[str, Any]]
    rejected: list[Rejection]
    notes: list[str]
    requirement: dict[str, dict[str, int]]
    tables: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite.as_dict(),
            "proposals": dict(self.proposals),
            "levels": self.levels.as_dict(),
            "cost": self.cost,
            "cost_unit": self.cost_unit,
            "mode": self.mode,
            "lifetimes": dict(self.lifetimes),
            "ike": dict(self.ike),
            "alternatives": list(self.alternatives),
            "rejected": [r.as_dict() for r in self.rejected],
            "notes": list(self.notes),
            "requirement": {k: dict(v) for k, v in self.requirement.items()},
            "tables": dict(self.tables),
        }
