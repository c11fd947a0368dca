"""A gateway to register, validated (``POST /v1/gateways``, the console, ``qoss lab``).

Only :class:`GatewayIn` (and its base, :class:`Strict`) is left here while the gateways
service and its pages are being changed elsewhere; it moves to :mod:`app.web.schemas` with
every other request document after that. Services take domain values
(:mod:`app.domain.requests`), not these documents.

Strict: unknown fields are refused and nothing is coerced (a level is an int, not ``true``
or ``"8"``; a flag is a bool).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GatewayIn", "Strict"]

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Cidr = Annotated[str, Field(min_length=1, max_length=64)]


class Strict(BaseModel):
    """The base of every request document (API and command line): unknown fields refused; no
    coercion: a level is an int, not ``true`` or ``"8"``, a flag a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GatewayIn(Strict):
    """A strongSwan instance to drive."""

    name: Name
    vici_socket: Annotated[str, Field(min_length=2, max_length=107, pattern=r"^/[A-Za-z0-9_./-]+$")]
    ike_address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")] | None = None
    inside_networks: Annotated[list[Cidr], Field(min_length=1, max_length=16)]
