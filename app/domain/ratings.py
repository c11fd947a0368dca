"""Rating tables: per-algorithm security levels (0-10) and performance, ESAF style.

Ratings are local: they are never sent to a peer. A table may rate only some kinds
(``esaf-2006`` rates no key exchange); for a kind a table lacks, negotiation uses the
service's default table and says so. Encryption and AEAD count as one family (both
give confidentiality), so a table that rates ciphers but no AEAD rejects AEADs as
unrated instead of borrowing their ratings from another table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.domain.algorithms import Kind, lookup
from app.domain.errors import InvalidRatingTable, UnknownAlgorithm

__all__ = [
    "LEVEL_DIMENSIONS",
    "Measurement",
    "Rating",
    "RatingTable",
    "kind_family",
    "refuse_unknown_keys",
    "relevant_dimensions",
    "validate_name",
]

#: The four security dimensions a policy states minimums for. ``post_quantum`` rates the
#: mechanisms that keep a tunnel's keys safe from a future quantum computer (a post-quantum
#: preshared key, a hybrid ML-KEM exchange); 0 is none.
LEVEL_DIMENSIONS: tuple[str, ...] = ("confidentiality", "integrity", "key_exchange", "post_quantum")

_FAMILY = {
    Kind.ENCRYPTION: "cipher",
    Kind.AEAD: "cipher",
    Kind.INTEGRITY: "integrity",
    Kind.PRF: "prf",
    Kind.KEY_EXCHANGE: "key_exchange",
    Kind.POST_QUANTUM: "post_quantum",
}

_RELEVANT: dict[Kind, tuple[str, ...]] = {
    Kind.ENCRYPTION: ("confidentiality",),
    Kind.AEAD: ("confidentiality", "integrity"),
    Kind.INTEGRITY: ("integrity",),
    Kind.PRF: ("key_exchange",),
    Kind.KEY_EXCHANGE: ("key_exchange",),
    Kind.POST_QUANTUM: ("post_quantum",),
}


def kind_family(kind: Kind) -> str:
    """The coverage family of a kind: ``cipher``, ``integrity``, ``prf``, ``key_exchange`` or
    ``post_quantum``."""
    return _FAMILY[kind]


def relevant_dimensions(kind: Kind) -> tuple[str, ...]:
    """The security dimensions an algorithm of this kind is rated on."""
    return _RELEVANT[kind]


_MEASUREMENT_FIELDS = (
    "throughput_mbps", "a_ns_per_byte", "b_ns", "machine", "backend", "date", "samples", "method", "spread",
)


@dataclass(frozen=True, slots=True)
class Measurement:
    """Measured cost of one transform (Niedermayer et al. §5.5: ``ns = a * bytes + b``)."""

    throughput_mbps: float | None = None
    a_ns_per_byte: float | None = None
    b_ns: float | None = None
    machine: str | None = None
    backend: str | None = None
    date: str | None = None
    samples: int | None = None
    method: str | None = None
    spread: float | None = None

    def ns_per_byte(self, packet_size: int) -> float | None:
        """Time per byte at ``packet_size`` from the linear model, None without one."""
        if self.a_ns_per_byte is None or self.b_ns is None:
            return None
        return self.a_ns_per_byte + self.b_ns / packet_size

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _MEASUREMENT_FIELDS if getattr(self, k) is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Measurement:
        if not isinstance(data, Mapping):
            raise InvalidRatingTable(f"{where}: measurement must be a mapping")
        refuse_unknown_keys(data, _MEASUREMENT_FIELDS, InvalidRatingTable, f"{where}: unknown measurement fields")
        values: dict[str, Any] = {}
        for key in ("throughput_mbps", "a_ns_per_byte", "b_ns", "spread"):
            if data.get(key) is not None:
                values[key] = _number(data[key], f"{where}.{key}", low=0.0 if key != "b_ns" else None)
        for key in ("machine", "backend", "date", "method"):
            if data.get(key) is not None:
                values[key] = _text(data[key], f"{where}.{key}", 200)
        if data.get("samples") is not None:
            samples = data["samples"]
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
                raise InvalidRatingTable(f"{where}.samples: must be a non-negative integer")
            values["samples"] = samples
        if ("a_ns_per_byte" in values) != ("b_ns" in values):
            raise InvalidRatingTable(f"{where}: a_ns_per_byte and b_ns come together")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Rating:
    """How secure and how fast one algorithm is, by one table's judgement.

    Security levels are ints 0-10 (None where the dimension does not apply to the
    kind); ``performance`` is 0-10, higher is faster, and must be > 0 to be costed.
    """

    algorithm: str
    confidentiality: int | None = None
    integrity: int | None = None
    key_exchange: int | None = None
    post_quantum: int | None = None
    performance: float = 0.0
    source: str = ""
    reason: str = ""
    requirement: str | None = None
    measurement: Measurement | None = None

    @property
    def kind(self) -> Kind:
        return lookup(self.algorithm).kind

    def level(self, dimension: str) -> int | None:
        """The security level for one dimension, None where not rated."""
        value: int | None = getattr(self, dimension)
        return value

    def cost(self, packet_size: int | None) -> float:
        """``1 / performance``: the unit-less cost used where nothing was measured."""
        return 1.0 / self.performance if self.performance > 0 else math.inf

    def measured_cost(self, packet_size: int) -> float | None:
        """Measured nanoseconds per byte at ``packet_size``, None if not measured."""
        return self.measurement.ns_per_byte(packet_size) if self.measurement else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"algorithm": self.algorithm}
        for dim in LEVEL_DIMENSIONS:
            if getattr(self, dim) is not None:
                out[dim] = getattr(self, dim)
        out["performance"] = self.performance
        if self.source:
            out["source"] = self.source
        if self.reason:
            out["reason"] = self.reason
        if self.requirement:
            out["requirement"] = self.requirement
        if self.measurement is not None:
            out["measurement"] = self.measurement.as_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "rating") -> Rating:
        if not isinstance(data, Mapping):
            raise InvalidRatingTable(f"{where}: a rating must be a mapping")
        allowed = {"algorithm", *LEVEL_DIMENSIONS, "performance", "source", "reason", "requirement", "measurement"}
        refuse_unknown_keys(data, allowed, InvalidRatingTable, f"{where}: unknown fields")
        if "algorithm" not in data:
            raise InvalidRatingTable(f"{where}: 'algorithm' is required")
        try:
            alg = lookup(_text(data["algorithm"], f"{where}.algorithm", 64))
        except UnknownAlgorithm as exc:
            raise InvalidRatingTable(f"{where}: {exc.message}") from exc
        where = f"{where} ({alg.keyword})"
        levels: dict[str, int | None] = {}
        relevant = relevant_dimensions(alg.kind)
        for dim in LEVEL_DIMENSIONS:
            raw = data.get(dim)
            if raw is None:
                levels[dim] = None
                continue
            if dim not in relevant:
                raise InvalidRatingTable(f"{where}: a {alg.kind.value} algorithm has no {dim} level")
            levels[dim] = _level(raw, f"{where}.{dim}")
        missing = [d for d in relevant if levels[d] is None]
        if missing:
            raise InvalidRatingTable(f"{where}: missing {', '.join(missing)} level")
        performance = _number(data.get("performance", 0), f"{where}.performance", low=0.0, high=10.0)
        measurement = (
            Measurement.from_dict(data["measurement"], f"{where}.measurement")
            if data.get("measurement") is not None
            else None
        )
        return cls(
            algorithm=alg.keyword,
            confidentiality=levels["confidentiality"],
            integrity=levels["integrity"],
            key_exchange=levels["key_exchange"],
            post_quantum=levels["post_quantum"],
            performance=performance,
            source=_text(data.get("source", ""), f"{where}.source", 500),
            reason=_text(data.get("reason", ""), f"{where}.reason", 2000),
            requirement=_text(data["requirement"], f"{where}.requirement", 40) if data.get("requirement") else None,
            measurement=measurement,
        )


@dataclass(frozen=True)
class RatingTable:
    """A named set of ratings, at one revision."""

    name: str
    ratings: Mapping[str, Rating]
    description: str = ""
    source: str = ""
    revision: int = 1
    families: frozenset[str] = field(init=False, compare=False)
    #: keyword -> (confidentiality, integrity, key_exchange, post_quantum, 1/performance): built
    #: once per table revision so that a negotiation reads plain tuples on its hot path.
    index: Mapping[str, tuple[int | None, int | None, int | None, int | None, float]] = field(
        init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "families", frozenset(kind_family(lookup(k).kind) for k in self.ratings)
        )
        object.__setattr__(self, "index", {
            k: (r.confidentiality, r.integrity, r.key_exchange, r.post_quantum, r.cost(None))
            for k, r in self.ratings.items()
        })

    def covers(self, kind: Kind) -> bool:
        """Whether this table rates algorithms of this kind's family at all."""
        return kind_family(kind) in self.families

    def get(self, keyword: str) -> Rating | None:
        return self.ratings.get(keyword)

    def with_rating(self, rating: Rating) -> RatingTable:
        """A copy with one rating added or replaced."""
        return replace(self, ratings={**self.ratings, rating.algorithm: rating})

    def without(self, keyword: str) -> RatingTable:
        """A copy with one rating removed."""
        return replace(self, ratings={k: v for k, v in self.ratings.items() if k != keyword})

    def at_revision(self, revision: int) -> RatingTable:
        """The same table as revision ``revision`` (what a store answers after writing it)."""
        return replace(self, revision=revision)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "ratings": [r.as_dict() for r in self.ratings.values()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, revision: int = 1, name: str | None = None) -> RatingTable:
        """Build and validate a table from its document form (YAML/JSON).

        Raises:
            InvalidRatingTable: anything wrong, named precisely.
        """
        if not isinstance(data, Mapping):
            raise InvalidRatingTable("a rating table must be a mapping")
        refuse_unknown_keys(data, ("name", "description", "source", "ratings"), InvalidRatingTable, "unknown fields")
        table_name = validate_name(name if name is not None else data.get("name"), InvalidRatingTable)
        rows = data.get("ratings")
        if not isinstance(rows, list) or not rows:
            raise InvalidRatingTable(f"{table_name}: 'ratings' must be a non-empty list")
        ratings: dict[str, Rating] = {}
        for i, row in enumerate(rows):
            rating = Rating.from_dict(row, f"ratings[{i}]")
            if rating.algorithm in ratings:
                raise InvalidRatingTable(f"ratings[{i}]: {rating.algorithm} is rated twice")
            ratings[rating.algorithm] = rating
        return cls(
            name=table_name,
            ratings=ratings,
            description=_text(data.get("description", ""), "description", 2000),
            source=_text(data.get("source", ""), "source", 2000),
            revision=revision,
        )

    @classmethod
    def of(cls, name: str, ratings: Iterable[Rating], **kw: Any) -> RatingTable:
        return cls(name=name, ratings={r.algorithm: r for r in ratings}, **kw)


def validate_name(value: Any, error: type[InvalidRatingTable] | type[Any]) -> str:
    """A table or policy name: 1-64 of ``[a-z0-9._-]``, starting alphanumeric."""
    if not isinstance(value, str) or not value or len(value) > 64:
        raise error("name must be a string of 1 to 64 characters")
    if not (value[0].isascii() and value[0].isalnum()) or any(
        not (c.isascii() and (c.isalnum() or c in "._-")) or c.isupper() for c in value
    ):
        raise error(f"name {value[:64]!r} must be lower-case letters, digits, '.', '_' or '-'")
    return value


def refuse_unknown_keys(data: Mapping[str, Any], known: Iterable[str], error: type[Exception], what: str,
                       after: str = "") -> None:
    """Refuse a document with keys outside ``known``: ``error(f"{what} {sorted unknown keys}{after}")``."""
    unknown = set(data) - set(known)
    if unknown:
        raise error(f"{what} {sorted(unknown, key=str)}{after}")


def _level(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise InvalidRatingTable(f"{where}: a level is an integer from 0 to 10")
    return value


def _number(value: Any, where: str, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRatingTable(f"{where}: must be a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRatingTable(f"{where}: must be within [{low}, {high}]")
    return float(value)


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidRatingTable(f"{where}: must be a string")
    if len(value) > limit:
        raise InvalidRatingTable(f"{where}: at most {limit} characters")
    return value
