"""strongSwan proposal strings: build them from keywords, parse and check them.

Grammar (strongSwan 5.9,):

- ESP: ``encr-integ[-ke]`` or ``aead[-ke]``; AH: ``integ[-ke]``; the key exchange in a
  CHILD_SA proposal only applies to rekeying (PFS).
- IKE: ``encr-integ-ke`` (PRF implied by the integrity algorithm) or ``aead-prf-ke``, either
  followed by ``ke1_mlkemNNN`` for a hybrid exchange (RFC 9370, strongSwan 6.0 and later).
- AEAD and non-AEAD never mix in one proposal; ``default`` is never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.algorithms import Algorithm, Kind, Protocol, lookup
from app.domain.errors import InvalidInput, UnknownAlgorithm

__all__ = ["InvalidProposal", "ParsedProposal", "build", "parse"]


class InvalidProposal(InvalidInput):
    """A proposal string or keyword combination strongSwan would reject."""


@dataclass(frozen=True, slots=True)
class ParsedProposal:
    """The canonical keywords of one proposal, by role."""

    protocol: Protocol
    encryption: str | None = None
    aead: str | None = None
    integrity: str | None = None
    prf: str | None = None
    key_exchange: str | None = None
    additional_key_exchange: str | None = None

    def to_string(self) -> str:
        """The proposal string in strongSwan's order."""
        extra = f"{_KE1}{self.additional_key_exchange}" if self.additional_key_exchange else None
        parts = [self.aead or self.encryption, self.integrity, self.prf, self.key_exchange, extra]
        return "-".join(p for p in parts if p)


#: The prefix of the first additional key exchange in a proposal (RFC 9370; strongSwan 6.0).
_KE1 = "ke1_"


def build(
    protocol: Protocol,
    *,
    encryption: str | None = None,
    aead: str | None = None,
    integrity: str | None = None,
    prf: str | None = None,
    key_exchange: str | None = None,
    additional_key_exchange: str | None = None,
    allow_encryption_only: bool = False,
) -> str:
    """A checked proposal string for ``protocol`` from canonical keywords.

    Args:
        protocol: IKE, ESP or AH.
        allow_encryption_only: permit ESP with encryption and no integrity (the ESP
            half of an AH+ESP bundle).

    Raises:
        InvalidProposal: the combination breaks strongSwan's grammar.
    """
    parsed = ParsedProposal(protocol, encryption, aead, integrity, prf, key_exchange, additional_key_exchange)
    _check(parsed, allow_encryption_only=allow_encryption_only)
    return parsed.to_string()


def parse(text: str, protocol: Protocol, *, allow_encryption_only: bool = False) -> ParsedProposal:
    """Parse one proposal string into canonical keywords and check its grammar.

    Raises:
        InvalidProposal: empty, too long, unknown keyword, repeated role, or bad combination.
    """
    if not isinstance(text, str) or not text or len(text) > 256:
        raise InvalidProposal("a proposal is a non-empty string of at most 256 characters")
    if text.strip().lower() == "default":
        raise InvalidProposal("'default' is never used: strongSwan's default list contains 3DES and SHA-1")
    roles: dict[str, str] = {}
    for token in text.split("-"):
        additional = token.lower().startswith(_KE1)
        try:
            alg = lookup(token[len(_KE1):] if additional else token)
        except UnknownAlgorithm as exc:
            raise InvalidProposal(f"proposal {text[:64]!r}: {exc.message}") from exc
        if alg.kind is Kind.POST_QUANTUM and not additional:
            raise InvalidProposal(f"proposal {text[:64]!r}: {alg.keyword} is a post-quantum mechanism, not a "
                                  f"proposal keyword (ML-KEM goes after the group as {_KE1}mlkemNNN)")
        role = "additional_key_exchange" if additional else "aead" if alg.kind is Kind.AEAD else alg.kind.value
        if role in roles:
            raise InvalidProposal(f"proposal {text[:64]!r}: more than one {role} algorithm")
        roles[role] = alg.keyword
    parsed = ParsedProposal(
        protocol,
        encryption=roles.get("encryption"),
        aead=roles.get("aead"),
        integrity=roles.get("integrity"),
        prf=roles.get("prf"),
        key_exchange=roles.get("key_exchange"),
        additional_key_exchange=roles.get("additional_key_exchange"),
    )
    _check(parsed, allow_encryption_only=allow_encryption_only)
    return parsed


def _check(p: ParsedProposal, *, allow_encryption_only: bool) -> None:
    extra = p.additional_key_exchange
    if extra is not None and (p.protocol is not Protocol.IKE or not extra.startswith("mlkem")):
        raise InvalidProposal(f"{_KE1}{extra}: an additional key exchange is ML-KEM in an IKE proposal")
    found: dict[str, Algorithm] = {}  # each keyword looked up once (a negotiation builds many proposals)
    for keyword in (p.encryption, p.aead, p.integrity, p.prf, p.key_exchange):
        if keyword is not None:
            alg = found[keyword] = lookup(keyword)
            if not alg.usable_in(p.protocol):
                raise InvalidProposal(f"{keyword} cannot be used in an {p.protocol.value.upper()} proposal")
    if p.encryption and found[p.encryption].kind is not Kind.ENCRYPTION:
        raise InvalidProposal(f"{p.encryption} is not an encryption algorithm")
    if p.aead and found[p.aead].kind is not Kind.AEAD:
        raise InvalidProposal(f"{p.aead} is not an AEAD algorithm")
    if p.integrity and found[p.integrity].kind is not Kind.INTEGRITY:
        raise InvalidProposal(f"{p.integrity} is not an integrity algorithm")
    if p.key_exchange and found[p.key_exchange].kind is not Kind.KEY_EXCHANGE:
        raise InvalidProposal(f"{p.key_exchange} is not a key-exchange group")
    if p.aead and (p.encryption or p.integrity):
        raise InvalidProposal("AEAD and non-AEAD algorithms never mix in one proposal")
    if p.protocol is Protocol.AH:
        if p.encryption or p.aead or not p.integrity or p.prf:
            raise InvalidProposal("an AH proposal is one integrity algorithm and optionally a key exchange")
        return
    if p.protocol is Protocol.ESP:
        if p.prf:
            raise InvalidProposal("an ESP proposal has no PRF")
        if p.aead:
            return
        if not p.encryption:
            raise InvalidProposal("an ESP proposal needs an encryption or AEAD algorithm")
        if not p.integrity and not allow_encryption_only:
            raise InvalidProposal("an ESP proposal with an encryption algorithm needs an integrity algorithm")
        return
    # IKE
    if not p.key_exchange:
        raise InvalidProposal("an IKE proposal needs a key exchange")
    if p.aead:
        if not p.prf:
            raise InvalidProposal("an AEAD IKE proposal needs an explicit PRF")
        return
    if not p.encryption or not p.integrity:
        raise InvalidProposal("an IKE proposal needs encryption and integrity (or AEAD and a PRF)")
    if p.encryption == "null":
        raise InvalidProposal("IKE never uses null encryption")
