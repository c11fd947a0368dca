"""HTTP request and response bodies (separate from the ORM and the domain)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.domain.agent.codec import MAX_WIRE_BYTES
from app.domain.auth import TOKEN_MAX_LIFETIME, TOKEN_NAME_MAX_LENGTH, TOKEN_NAME_PATTERN
from app.services.inputs import MinLevelsIn, NegotiationIn, Strict, TrafficIn

__all__ = [
    "NO_NUL",
    "AlgorithmOut",
    "BenchmarkIn",
    "EnrollIn",
    "ErrorOut",
    "MeasurementIn",
    "MessageIn",
    "MessageOut",
    "NegotiationIn",
    "NegotiationOut",
    "PolicyIn",
    "PolicyOut",
    "RatingIn",
    "RatingPatch",
    "RatingTableIn",
    "RatingTableOut",
    "RevertIn",
    "RevisionOut",
    "TokenIn",
    "error_responses",
]

Level = Annotated[int, Field(ge=0, le=10)]
#: Free text holds no NUL: PostgreSQL's text and JSONB cannot store it (a 500 otherwise).
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(max_length=2000, pattern=NO_NUL)]
Short = Annotated[str, Field(max_length=200, pattern=NO_NUL)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class ErrorOut(BaseModel):
    error: str
    detail: Any


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses``: each of ``codes`` answered with an :class:`ErrorOut`, in that order."""
    return {code: {"model": ErrorOut} for code in codes}


class AlgorithmOut(BaseModel):
    keyword: str
    kind: str
    key_size: int
    block_size: int | None
    icv_length: int | None
    protocols: list[str]
    sa_name: str
    prf: str | None
    aliases: list[str]
    description: str


class MeasurementIn(Strict):
    """Where a row's numbers come from (bounds far beyond any real measurement)."""

    throughput_mbps: Annotated[float, Field(ge=0, le=1e9)] | None = None
    a_ns_per_byte: Annotated[float, Field(ge=0, le=1e9)] | None = None
    b_ns: Annotated[float, Field(ge=-1e12, le=1e12)] | None = None
    machine: Short | None = None
    backend: Short | None = None
    date: Short | None = None
    samples: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    method: Short | None = None
    spread: Annotated[float, Field(ge=0, le=1e9)] | None = None


class RatingIn(Strict):
    algorithm: Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
    confidentiality: Level | None = None
    integrity: Level | None = None
    key_exchange: Level | None = None
    performance: Annotated[float, Field(ge=0, le=10)] = 0
    source: Annotated[str, Field(max_length=500, pattern=NO_NUL)] = ""
    reason: Text = ""
    requirement: Annotated[str, Field(max_length=40, pattern=NO_NUL)] | None = None
    measurement: MeasurementIn | None = None


class RatingPatch(Strict):
    """Fields of one row to change; absent fields keep their value."""

    confidentiality: Level | None = None
    integrity: Level | None = None
    key_exchange: Level | None = None
    performance: Annotated[float, Field(ge=0, le=10)] | None = None
    source: Annotated[str, Field(max_length=500, pattern=NO_NUL)] | None = None
    reason: Text | None = None
    requirement: Annotated[str, Field(max_length=40, pattern=NO_NUL)] | None = None
    measurement: MeasurementIn | None = None


class RatingTableIn(Strict):
    name: Name
    description: Text = ""
    source: Text = ""
    ratings: Annotated[list[RatingIn], Field(min_length=1, max_length=500)]


class RatingTableOut(BaseModel):
    name: str
    revision: int
    description: str
    source: str
    ratings: list[dict[str, Any]]


class RevertIn(Strict):
    """Go back to a past revision: a new revision with its content."""

    revision: Annotated[int, Field(ge=1, le=2**31 - 1, description="the revision whose content to restore")]
    message: Short | None = Field(default=None, description="why, for the history (after 'reverted to N')")


class RevisionOut(BaseModel):
    revision: int
    author: str
    created_at: Any
    message: str
    changes: list[dict[str, Any]] | None = None


class PolicyIn(Strict):
    name: Name
    description: Text = ""
    min_levels: MinLevelsIn | None = None
    objectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] | None = None
    objective_id: Annotated[int, Field(ge=1, le=4)] | None = None
    allow: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=200)] | None = None
    deny: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=200)] | None = None
    traffic: TrafficIn | None = None
    mode: Annotated[str, Field(pattern=r"^(tunnel|transport)$")] = "tunnel"
    pfs: bool = True
    strict: bool = False
    rating_table: Name | None = None
    ike_lifetime: Annotated[int, Field(ge=60, le=604800)] = 14400
    child_lifetime: Annotated[int, Field(ge=60, le=604800)] = 3600


class PolicyOut(BaseModel):
    name: str
    revision: int
    policy: dict[str, Any]


class NegotiationOut(BaseModel):
    suite: dict[str, Any]
    proposals: dict[str, str | None]
    levels: dict[str, int]
    cost: float
    cost_unit: str
    mode: str
    lifetimes: dict[str, int]
    ike: dict[str, str | None]
    alternatives: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    notes: list[str]
    requirement: dict[str, dict[str, int]]
    tables: dict[str, str]


class EnrollIn(BaseModel):
    """A user's public keys (from ``qoss agent keygen``) and the Objective-IDs they may ask for (lax: the
    console's form sends them as text)."""

    model_config = ConfigDict(extra="forbid")
    user_id: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    sign_public_key: Annotated[str, Field(min_length=43, max_length=43, pattern=r"^[A-Za-z0-9_-]+$")]
    kem_public_key: Annotated[str, Field(min_length=43, max_length=43, pattern=r"^[A-Za-z0-9_-]+$")]
    objectives: Annotated[list[Annotated[int, Field(ge=1, le=4)]], Field(min_length=1, max_length=4)]


class TokenIn(BaseModel):
    """A new API token: its name, scopes and lifetime (the rules of :mod:`app.domain.auth`)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=TOKEN_NAME_MAX_LENGTH, pattern=TOKEN_NAME_PATTERN)]
    scopes: Annotated[list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=16)]
    expires_in: Annotated[int, Field(ge=1, le=int(TOKEN_MAX_LIFETIME.total_seconds()))] | None = None


class MessageIn(BaseModel):
    """One sealed agent message (the canonical wire bytes as text)."""

    model_config = ConfigDict(extra="forbid")
    message: Annotated[str, Field(min_length=1, max_length=MAX_WIRE_BYTES)]


class MessageOut(BaseModel):
    message: str


#: A rating table's name, as the benchmarks' request names one.
_TableName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class BenchmarkIn(BaseModel):
    """A micro benchmark run: which algorithms, how long each, and the table it may write."""

    model_config = ConfigDict(extra="forbid")

    only: Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=64)] | None = None
    budget_per_algorithm: Annotated[float, Field(gt=0, le=2.0)] = 0.5
    write_table: _TableName | None = None
    base_table: _TableName = "standards-2026"
