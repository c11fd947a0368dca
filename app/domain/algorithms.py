"""The algorithm catalogue: every keyword strongSwan 5.9 negotiates for ESP, AH and IKE, and the
post-quantum mechanisms of IKEv2 (a post-quantum preshared key, strongSwan 5.7 and later; ML-KEM
as an additional key exchange, strongSwan 6.0 and later).

Keywords are strongSwan's own (``proposal_keywords_static.txt``), so a suite made of
them is a valid proposal string as it stands. ``sa_name`` is the name strongSwan prints
for the algorithm in VICI ``list-sas`` (``encr-alg``, ``integ-alg``, ``prf-alg``,
``dh-group``); ``key_size`` is what ``encr-keysize`` reports where it applies.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import StrEnum

from app.domain.errors import UnknownAlgorithm

__all__ = [
    "CATALOGUE",
    "Algorithm",
    "Kind",
    "Protocol",
    "catalogue_order",
    "lookup",
    "resolve",
]


class Kind(StrEnum):
    """What an algorithm does in a proposal."""

    ENCRYPTION = "encryption"
    AEAD = "aead"
    INTEGRITY = "integrity"
    PRF = "prf"
    KEY_EXCHANGE = "key_exchange"
    POST_QUANTUM = "post_quantum"


class Protocol(StrEnum):
    """Where an algorithm may appear."""

    IKE = "ike"
    ESP = "esp"
    AH = "ah"


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One catalogue entry.

    Attributes:
        keyword: strongSwan's canonical keyword.
        kind: what it does.
        key_size: key length in bits (group size for key exchange, the parameter set for
            ML-KEM), 0 for ``null``.
        block_size: cipher block size in bits, None where not a block cipher.
        icv_length: integrity check value length in bits, None where there is none.
        protocols: where strongSwan accepts it.
        sa_name: the name VICI ``list-sas`` reports.
        prf: for an integrity algorithm usable in IKE, the PRF it implies.
        aliases: other keywords strongSwan accepts for the same transform.
        description: a human name.
    """

    keyword: str
    kind: Kind
    key_size: int
    block_size: int | None
    icv_length: int | None
    protocols: frozenset[Protocol]
    sa_name: str
    prf: str | None = None
    aliases: tuple[str, ...] = ()
    description: str = ""

    def usable_in(self, protocol: Protocol) -> bool:
        """Whether strongSwan accepts this keyword in a proposal for ``protocol``."""
        return protocol in self.protocols

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready description."""
        return {
            "keyword": self.keyword,
            "kind": self.kind.value,
            "key_size": self.key_size,
            "block_size": self.block_size,
            "icv_length": self.icv_length,
            "protocols": sorted(p.value for p in self.protocols),
            "sa_name": self.sa_name,
            "prf": self.prf,
            "aliases": list(self.aliases),
            "description": self.description,
        }


_IKE_ESP = frozenset({Protocol.IKE, Protocol.ESP})
_ESP = frozenset({Protocol.ESP})
_ESP_AH = frozenset({Protocol.ESP, Protocol.AH})
_ALL = frozenset({Protocol.IKE, Protocol.ESP, Protocol.AH})
_IKE = frozenset({Protocol.IKE})


def _build() -> tuple[Algorithm, ...]:
    algs: list[Algorithm] = []
    enc, aead = Kind.ENCRYPTION, Kind.AEAD

    def add(*a: Algorithm) -> None:
        algs.extend(a)

    # Encryption (ESP encr + separate integrity). Order is the tie-break order.
    for bits in (128, 192, 256):
        add(Algorithm(f"aes{bits}", enc, bits, 128, None, _IKE_ESP, "AES_CBC",
                      aliases=("aes",) if bits == 128 else (), description=f"AES-{bits}-CBC"))
    for bits in (128, 192, 256):
        add(Algorithm(f"aes{bits}ctr", enc, bits, 128, None, _IKE_ESP, "AES_CTR",
                      description=f"AES-{bits}-CTR"))
    for bits in (128, 192, 256):
        add(Algorithm(f"camellia{bits}", enc, bits, 128, None, _IKE_ESP, "CAMELLIA_CBC",
                      aliases=("camellia",) if bits == 128 else (), description=f"Camellia-{bits}-CBC"))
    for bits in (128, 192, 256):
        add(Algorithm(f"camellia{bits}ctr", enc, bits, 128, None, _IKE_ESP, "CAMELLIA_CTR",
                      description=f"Camellia-{bits}-CTR"))
    add(
        Algorithm("3des", enc, 192, 64, None, _IKE_ESP, "3DES_CBC", description="Triple DES (EDE3-CBC)"),
        Algorithm("cast128", enc, 128, 64, None, _IKE_ESP, "CAST_CBC", description="CAST-128-CBC"),
    )
    for bits in (128, 192, 256):
        add(Algorithm(f"blowfish{bits}", enc, bits, 64, None, _IKE_ESP, "BLOWFISH_CBC",
                      aliases=("blowfish",) if bits == 128 else (), description=f"Blowfish-{bits}-CBC"))
    add(
        Algorithm("des", enc, 64, 64, None, _IKE_ESP, "DES_CBC", description="DES-CBC"),
        Algorithm("null", enc, 0, None, None, _ESP, "NULL", description="no encryption (integrity-only ESP)"),
    )

    # AEAD (ESP and IKE; GMAC is integrity-only ESP).
    for bits in (128, 192, 256):
        for icv in (16, 12, 8):
            add(Algorithm(f"aes{bits}gcm{icv}", aead, bits, 128, icv * 8, _IKE_ESP, f"AES_GCM_{icv}",
                          aliases=(f"aes{bits}gcm{icv * 8}",) + ((f"aes{bits}gcm",) if icv == 16 else ()),
                          description=f"AES-{bits}-GCM, {icv * 8}-bit ICV"))
    add(Algorithm("chacha20poly1305", aead, 256, None, 128, _IKE_ESP, "CHACHA20_POLY1305",
                  description="ChaCha20-Poly1305 (RFC 7634)"))
    for bits in (128, 192, 256):
        for icv in (16, 12, 8):
            add(Algorithm(f"aes{bits}ccm{icv}", aead, bits, 128, icv * 8, _IKE_ESP, f"AES_CCM_{icv}",
                          aliases=(f"aes{bits}ccm{icv * 8}",) + ((f"aes{bits}ccm",) if icv == 16 else ()),
                          description=f"AES-{bits}-CCM, {icv * 8}-bit ICV"))
    for bits in (128, 192, 256):
        add(Algorithm(f"aes{bits}gmac", aead, bits, 128, 128, _ESP, "NULL_AES_GMAC",
                      description=f"AES-{bits}-GMAC (integrity only, no encryption)"))

    # Integrity (ESP/AH; the IKE ones imply a PRF).
    integ = Kind.INTEGRITY
    add(
        Algorithm("sha256", integ, 256, None, 128, _ALL, "HMAC_SHA2_256_128", prf="prfsha256",
                  aliases=("sha2_256",), description="HMAC-SHA2-256-128"),
        Algorithm("sha384", integ, 384, None, 192, _ALL, "HMAC_SHA2_384_192", prf="prfsha384",
                  aliases=("sha2_384",), description="HMAC-SHA2-384-192"),
        Algorithm("sha512", integ, 512, None, 256, _ALL, "HMAC_SHA2_512_256", prf="prfsha512",
                  aliases=("sha2_512",), description="HMAC-SHA2-512-256"),
        Algorithm("sha1", integ, 160, None, 96, _ALL, "HMAC_SHA1_96", prf="prfsha1",
                  aliases=("sha",), description="HMAC-SHA1-96"),
        Algorithm("aesxcbc", integ, 128, None, 96, _ALL, "AES_XCBC_96", prf="prfaesxcbc",
                  description="AES-XCBC-MAC-96"),
        Algorithm("aescmac", integ, 128, None, 96, _ALL, "AES_CMAC_96", prf="prfaescmac",
                  description="AES-CMAC-96"),
        Algorithm("sha256_96", integ, 256, None, 96, _ESP_AH, "HMAC_SHA2_256_96",
                  aliases=("sha2_256_96",), description="HMAC-SHA2-256-96 (pre-RFC 4868 Linux truncation)"),
        Algorithm("sha1_160", integ, 160, None, 160, _ESP_AH, "HMAC_SHA1_160", description="HMAC-SHA1-160"),
        Algorithm("md5", integ, 128, None, 96, _ALL, "HMAC_MD5_96", prf="prfmd5", description="HMAC-MD5-96"),
        Algorithm("md5_128", integ, 128, None, 128, _ESP_AH, "HMAC_MD5_128", description="HMAC-MD5-128"),
    )

    # PRF (IKE only).
    prf = Kind.PRF
    add(
        Algorithm("prfsha256", prf, 256, None, None, _IKE, "PRF_HMAC_SHA2_256", description="PRF-HMAC-SHA2-256"),
        Algorithm("prfsha384", prf, 384, None, None, _IKE, "PRF_HMAC_SHA2_384", description="PRF-HMAC-SHA2-384"),
        Algorithm("prfsha512", prf, 512, None, None, _IKE, "PRF_HMAC_SHA2_512", description="PRF-HMAC-SHA2-512"),
        Algorithm("prfsha1", prf, 160, None, None, _IKE, "PRF_HMAC_SHA1", description="PRF-HMAC-SHA1"),
        Algorithm("prfaesxcbc", prf, 128, None, None, _IKE, "PRF_AES128_XCBC", description="PRF-AES128-XCBC"),
        Algorithm("prfaescmac", prf, 128, None, None, _IKE, "PRF_AES128_CMAC", description="PRF-AES128-CMAC"),
        Algorithm("prfmd5", prf, 128, None, None, _IKE, "PRF_HMAC_MD5", description="PRF-HMAC-MD5"),
    )

    # Key exchange (IKE; in ESP/AH proposals only for PFS on rekeying).
    ke = Kind.KEY_EXCHANGE
    add(
        Algorithm("x25519", ke, 255, None, None, _ALL, "CURVE_25519", aliases=("curve25519",),
                  description="Curve25519 ECDH (RFC 8031)"),
        Algorithm("x448", ke, 448, None, None, _ALL, "CURVE_448", aliases=("curve448",),
                  description="Curve448 ECDH (RFC 8031)"),
        Algorithm("ecp256", ke, 256, None, None, _ALL, "ECP_256", description="NIST P-256 (group 19)"),
        Algorithm("ecp384", ke, 384, None, None, _ALL, "ECP_384", description="NIST P-384 (group 20)"),
        Algorithm("ecp521", ke, 521, None, None, _ALL, "ECP_521", description="NIST P-521 (group 21)"),
        Algorithm("ecp224", ke, 224, None, None, _ALL, "ECP_224", description="NIST P-224 (group 26)"),
        Algorithm("ecp192", ke, 192, None, None, _ALL, "ECP_192", description="NIST P-192 (group 25)"),
        Algorithm("ecp256bp", ke, 256, None, None, _ALL, "ECP_256_BP", description="brainpoolP256r1 (group 28)"),
        Algorithm("ecp384bp", ke, 384, None, None, _ALL, "ECP_384_BP", description="brainpoolP384r1 (group 29)"),
        Algorithm("ecp512bp", ke, 512, None, None, _ALL, "ECP_512_BP", description="brainpoolP512r1 (group 30)"),
        Algorithm("ecp224bp", ke, 224, None, None, _ALL, "ECP_224_BP", description="brainpoolP224r1 (group 27)"),
        Algorithm("modp2048", ke, 2048, None, None, _ALL, "MODP_2048", description="2048-bit MODP (group 14)"),
        Algorithm("modp3072", ke, 3072, None, None, _ALL, "MODP_3072", description="3072-bit MODP (group 15)"),
        Algorithm("modp4096", ke, 4096, None, None, _ALL, "MODP_4096", description="4096-bit MODP (group 16)"),
        Algorithm("modp6144", ke, 6144, None, None, _ALL, "MODP_6144", description="6144-bit MODP (group 17)"),
        Algorithm("modp8192", ke, 8192, None, None, _ALL, "MODP_8192", description="8192-bit MODP (group 18)"),
        Algorithm("modp1536", ke, 1536, None, None, _ALL, "MODP_1536", description="1536-bit MODP (group 5)"),
        Algorithm("modp1024", ke, 1024, None, None, _ALL, "MODP_1024", description="1024-bit MODP (group 2)"),
        Algorithm("modp768", ke, 768, None, None, _ALL, "MODP_768", description="768-bit MODP (group 1)"),
        Algorithm("modp2048s256", ke, 2048, None, None, _ALL, "MODP_2048_256",
                  description="2048-bit MODP, 256-bit subgroup (group 24)"),
        Algorithm("modp2048s224", ke, 2048, None, None, _ALL, "MODP_2048_224",
                  description="2048-bit MODP, 224-bit subgroup (group 23)"),
        Algorithm("modp1024s160", ke, 1024, None, None, _ALL, "MODP_1024_160",
                  description="1024-bit MODP, 160-bit subgroup (group 22)"),
    )

    # Post-quantum mechanisms (IKEv2 only). ``ppk`` is a post-quantum preshared key (RFC 8784):
    # no proposal keyword, a conn's ``ppk_id`` and a secret of type PPK, strongSwan 5.7 and
    # later; ``list-sas`` shows ``/PPK`` after the IKE SA's algorithms. ML-KEM (FIPS 203) is an
    # additional key exchange (RFC 9370): ``ke1_mlkem768`` after the IKE proposal's group,
    # strongSwan 6.0 and later, whose ``get-algorithms`` lists it under ``ke``.
    pq = Kind.POST_QUANTUM
    add(
        Algorithm("ppk", pq, 256, None, None, _IKE, "PPK",
                  description="post-quantum preshared key (RFC 8784), 256 random bits per tunnel"),
        Algorithm("mlkem512", pq, 512, None, None, _IKE, "ML_KEM_512",
                  description="ML-KEM-512 (FIPS 203) as an additional key exchange (RFC 9370)"),
        Algorithm("mlkem768", pq, 768, None, None, _IKE, "ML_KEM_768",
                  description="ML-KEM-768 (FIPS 203) as an additional key exchange (RFC 9370)"),
        Algorithm("mlkem1024", pq, 1024, None, None, _IKE, "ML_KEM_1024",
                  description="ML-KEM-1024 (FIPS 203) as an additional key exchange (RFC 9370)"),
    )
    return tuple(algs)


_ALGORITHMS = _build()

#: Canonical keyword -> algorithm, in tie-break order.
CATALOGUE: dict[str, Algorithm] = {a.keyword: a for a in _ALGORITHMS}
_BY_NAME: dict[str, Algorithm] = {**{al: a for a in _ALGORITHMS for al in a.aliases}, **CATALOGUE}
_ORDER: dict[str, int] = {a.keyword: i for i, a in enumerate(_ALGORITHMS)}


def lookup(keyword: str) -> Algorithm:
    """The algorithm for a keyword or alias (case-insensitive).

    Raises:
        UnknownAlgorithm: not a catalogue keyword; carries the close matches.
    """
    found = _BY_NAME.get(keyword.strip().lower()) if isinstance(keyword, str) else None
    if found is None:
        text = keyword if isinstance(keyword, str) else repr(keyword)
        raise UnknownAlgorithm(text[:64], difflib.get_close_matches(text.lower(), list(_BY_NAME), n=3, cutoff=0.6))
    return found


def resolve(keyword: str) -> str:
    """The canonical keyword for a keyword or alias."""
    return lookup(keyword).keyword


def catalogue_order(keyword: str) -> int:
    """Position of a canonical keyword in the catalogue (the tie-break order)."""
    return _ORDER[keyword]
