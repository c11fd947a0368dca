"""Policies: what a party requires, and Common Criteria objectives mapped to IPsec.

Objectives and Objective-IDs come from Liu et al. Tables 2-1 and 2-2:

    Objective-ID  IPsec option  objectives
    1             Native        (none)
    2             AH            O.Integrity_Attr_Exch, O.Non-repudiation
    3             ESP           O.Comm_Trusted_Channel, O.Data_Exchange_Conf, O.Crypto_Comm_Channel
    4             AH + ESP      all five
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from app.domain.algorithms import resolve
from app.domain.errors import InvalidPolicy, UnknownAlgorithm
from app.domain.ratings import LEVEL_DIMENSIONS, refuse_unknown_keys, validate_name

__all__ = [
    "AH_OBJECTIVES",
    "ESP_OBJECTIVES",
    "OBJECTIVE_IDS",
    "OBJECTIVE_THREATS",
    "IpsecOption",
    "Levels",
    "Mode",
    "Policy",
    "TrafficProfile",
    "ipsec_option",
    "keyword_set",
    "objectives_for_id",
    "parse_objectives",
]


class IpsecOption(StrEnum):
    """The rows of Liu et al. Table 2-2."""

    NATIVE = "native"
    AH = "ah"
    ESP = "esp"
    AH_ESP = "ah+esp"


class Mode(StrEnum):
    TUNNEL = "tunnel"
    TRANSPORT = "transport"


#: Liu et al. Table 2-1: objective -> the threat it counters.
OBJECTIVE_THREATS: dict[str, str] = {
    "O.Crypto_Comm_Channel": "T.Spoofing",
    "O.Data_Exchange_Conf": "T.Hack_Comm_Eavesdrop",
    "O.Comm_Trusted_Channel": "T.Spoofing",
    "O.Integrity_Attr_Exch": "T.Spoofing",
    "O.Non-repudiation": "T.Spoofing",
}
ESP_OBJECTIVES = frozenset({"O.Comm_Trusted_Channel", "O.Data_Exchange_Conf", "O.Crypto_Comm_Channel"})
AH_OBJECTIVES = frozenset({"O.Integrity_Attr_Exch", "O.Non-repudiation"})

#: Liu et al. Table 2-2 rows, by Objective-ID.
OBJECTIVE_IDS: dict[int, tuple[IpsecOption, frozenset[str]]] = {
    1: (IpsecOption.NATIVE, frozenset()),
    2: (IpsecOption.AH, AH_OBJECTIVES),
    3: (IpsecOption.ESP, ESP_OBJECTIVES),
    4: (IpsecOption.AH_ESP, AH_OBJECTIVES | ESP_OBJECTIVES),
}


def objectives_for_id(objective_id: int) -> frozenset[str]:
    """The objectives of one Objective-ID (Liu et al. Table 2-2)."""
    if isinstance(objective_id, bool) or not isinstance(objective_id, int) or objective_id not in OBJECTIVE_IDS:
        raise InvalidPolicy(f"objective_id must be one of {sorted(OBJECTIVE_IDS)}")
    return OBJECTIVE_IDS[objective_id][1]


def ipsec_option(objectives: frozenset[str]) -> IpsecOption:
    """The IPsec option that satisfies a set of objectives (Liu et al. Table 2-2)."""
    esp = bool(objectives & ESP_OBJECTIVES)
    ah = bool(objectives & AH_OBJECTIVES)
    if esp and ah:
        return IpsecOption.AH_ESP
    if ah:
        return IpsecOption.AH
    if esp:
        return IpsecOption.ESP
    return IpsecOption.NATIVE


@dataclass(frozen=True, slots=True)
class Levels:
    """Minimum (or reached) security levels, 0-10 each.

    ``post_quantum`` is the protection of the keys against a future quantum computer; 0 is none,
    and a document without it means 0 (documents written before the level existed stay valid).
    """

    confidentiality: int = 0
    integrity: int = 0
    key_exchange: int = 0
    post_quantum: int = 0

    def get(self, dimension: str) -> int:
        value: int = getattr(self, dimension)
        return value

    def as_dict(self) -> dict[str, int]:
        return {d: self.get(d) for d in LEVEL_DIMENSIONS}

    def stored(self) -> dict[str, int]:
        """The levels as a stored request keeps them (a tunnel's provenance, an idempotency
        fingerprint): ``post_quantum`` only when asked for, so a document written before the
        level existed and one written after without it read the same."""
        out = self.as_dict()
        if not self.post_quantum:
            del out["post_quantum"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str = "min_levels") -> Levels:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidPolicy(f"{where} must be a mapping")
        refuse_unknown_keys(data, LEVEL_DIMENSIONS, InvalidPolicy, f"{where}: unknown levels",
                            after=f"; known: {list(LEVEL_DIMENSIONS)}")
        values: dict[str, int] = {}
        for dim, raw in data.items():
            if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 10:
                raise InvalidPolicy(f"{where}.{dim}: a level is an integer from 0 to 10")
            values[dim] = raw
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TrafficProfile:
    """What the traffic looks like: typical packet size (bytes) and needed throughput."""

    packet_size: int = 1400
    min_throughput_mbps: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"packet_size": self.packet_size}
        if self.min_throughput_mbps is not None:
            out["min_throughput_mbps"] = self.min_throughput_mbps
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, where: str = "traffic") -> TrafficProfile:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidPolicy(f"{where} must be a mapping")
        refuse_unknown_keys(data, ("packet_size", "min_throughput_mbps"), InvalidPolicy, f"{where}: unknown fields")
        size = data.get("packet_size", 1400)
        if isinstance(size, bool) or not isinstance(size, int) or not 20 <= size <= 65535:
            raise InvalidPolicy(f"{where}.packet_size: an integer from 20 to 65535")
        thr = data.get("min_throughput_mbps")
        if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 <= thr <= 1e6):
            raise InvalidPolicy(f"{where}.min_throughput_mbps: a number from 0 to 1000000")
        return cls(packet_size=size, min_throughput_mbps=float(thr) if thr is not None else None)


_POLICY_FIELDS = {
    "name", "description", "min_levels", "objectives", "objective_id", "allow", "deny", "traffic",
    "mode", "pfs", "strict", "rating_table", "ike_lifetime", "child_lifetime",
}


@dataclass(frozen=True)
class Policy:
    """What one party requires of a tunnel.

    ``allow`` (when given) limits the algorithms this party accepts; ``deny`` forbids
    some. ``strict`` refuses the back-end fallbacks (ESP-NULL for AH, ESP for AH+ESP).
    Lifetimes are seconds.
    """

    name: str = "inline"
    description: str = ""
    min_levels: Levels = field(default_factory=Levels)
    objectives: frozenset[str] = frozenset()
    objective_id: int | None = None
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    traffic: TrafficProfile | None = None
    mode: Mode = Mode.TUNNEL
    pfs: bool = True
    strict: bool = False
    rating_table: str | None = None
    ike_lifetime: int = 14400
    child_lifetime: int = 3600

    def for_peer(self, *, min_levels: Levels | None = None, objectives: frozenset[str] = frozenset(),
                 objective_id: int | None = None, mode: str | None = None, pfs: bool | None = None,
                 strict: bool | None = None, rating_table: str | None = None) -> Policy:
        """This policy as one peer of a negotiation states it: its minimums raised to what the peer
        asks inline (never lowered), its objectives with the peer's added, and each other setting
        the peer names in place of the stored one.

        Raises:
            ValueError: ``mode`` is not a :class:`Mode`.
        """
        asked = min_levels or Levels()
        return replace(
            self,
            min_levels=Levels(max(self.min_levels.confidentiality, asked.confidentiality),
                              max(self.min_levels.integrity, asked.integrity),
                              max(self.min_levels.key_exchange, asked.key_exchange),
                              max(self.min_levels.post_quantum, asked.post_quantum)),
            objectives=self.objectives | objectives,
            objective_id=objective_id if objective_id is not None else self.objective_id,
            mode=self.mode if mode is None else Mode(mode),
            pfs=self.pfs if pfs is None else pfs,
            strict=self.strict if strict is None else strict,
            rating_table=rating_table or self.rating_table,
        )

    @property
    def option(self) -> IpsecOption:
        """The IPsec option this policy's objectives ask for (Native when none)."""
        return ipsec_option(self.objectives)

    @property
    def wants_native(self) -> bool:
        """Objective-ID 1: explicitly no IPsec."""
        return self.objective_id == 1

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "min_levels": self.min_levels.as_dict(),
            "objectives": sorted(self.objectives),
            "objective_id": self.objective_id,
            "allow": sorted(self.allow) if self.allow is not None else None,
            "deny": sorted(self.deny),
            "traffic": self.traffic.as_dict() if self.traffic else None,
            "mode": self.mode.value,
            "pfs": self.pfs,
            "strict": self.strict,
            "rating_table": self.rating_table,
            "ike_lifetime": self.ike_lifetime,
            "child_lifetime": self.child_lifetime,
        }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> Policy:
        """Build and validate a policy from its document form.

        Raises:
            InvalidPolicy: anything wrong, named precisely.
        """
        if not isinstance(data, Mapping):
            raise InvalidPolicy("a policy must be a mapping")
        refuse_unknown_keys(data, _POLICY_FIELDS, InvalidPolicy, "unknown fields")
        policy_name = validate_name(name if name is not None else data.get("name", "inline"), InvalidPolicy)
        objectives = parse_objectives(data.get("objectives"), data.get("objective_id"))
        mode = data.get("mode", "tunnel")
        if mode not in (m.value for m in Mode):
            raise InvalidPolicy("mode must be 'tunnel' or 'transport'")
        for flag in ("pfs", "strict"):
            if flag in data and not isinstance(data[flag], bool):
                raise InvalidPolicy(f"{flag} must be true or false")
        lifetimes = {}
        for key, default in (("ike_lifetime", 14400), ("child_lifetime", 3600)):
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or not 60 <= value <= 86400 * 7:
                raise InvalidPolicy(f"{key}: seconds from 60 to 604800")
            lifetimes[key] = value
        table = data.get("rating_table")
        if table is not None:
            table = validate_name(table, InvalidPolicy)
        description = data.get("description", "") or ""
        if not isinstance(description, str) or len(description) > 2000:
            raise InvalidPolicy("description: a string of at most 2000 characters")
        allow_raw = data.get("allow")
        return cls(
            name=policy_name,
            description=description,
            min_levels=Levels.from_dict(data.get("min_levels")),
            objectives=objectives,
            objective_id=data.get("objective_id"),
            allow=keyword_set(allow_raw, "allow") if allow_raw is not None else None,
            deny=keyword_set(data.get("deny"), "deny"),
            traffic=TrafficProfile.from_dict(data["traffic"]) if data.get("traffic") is not None else None,
            mode=Mode(mode),
            pfs=data.get("pfs", True),
            strict=data.get("strict", False),
            rating_table=table,
            ike_lifetime=lifetimes["ike_lifetime"],
            child_lifetime=lifetimes["child_lifetime"],
        )


def parse_objectives(objectives: Any, objective_id: Any) -> frozenset[str]:
    """Objectives given by name and/or by Objective-ID, validated and merged."""
    found: set[str] = set()
    if objective_id is not None:
        found |= objectives_for_id(objective_id)
    if objectives is not None:
        if isinstance(objectives, str) or not isinstance(objectives, Sequence) or len(objectives) > 16:
            raise InvalidPolicy("objectives must be a list of Common Criteria objective names")
        for o in objectives:
            if not isinstance(o, str) or o not in OBJECTIVE_THREATS:
                raise InvalidPolicy(f"unknown objective {str(o)[:64]!r}; known: {sorted(OBJECTIVE_THREATS)}")
            found.add(o)
    return frozenset(found)


def keyword_set(values: Any, where: str) -> frozenset[str]:
    """A list of algorithm keywords, resolved to canonical ones."""
    if values is None:
        return frozenset()
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) > 200:
        raise InvalidPolicy(f"{where} must be a list of at most 200 algorithm keywords")
    out: set[str] = set()
    for v in values:
        if not isinstance(v, str):
            raise InvalidPolicy(f"{where}: keywords are strings")
        try:
            out.add(resolve(v))
        except UnknownAlgorithm as exc:
            raise InvalidPolicy(f"{where}: {exc.message}") from exc
    return frozenset(out)
