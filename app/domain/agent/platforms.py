"""The device platforms a Target writes profiles for, and a negotiated suite in each one's own names.

A phone or laptop joins with its built-in (or stock) IKEv2 client. The negotiation ends with a
strongSwan proposal pair (IKE and ESP); the profile handed to the device must say that very suite in
the names its client reads. Two platforms name algorithms from a closed list:

- Apple's IKEv2 client (``com.apple.vpn.managed``, ``IKEv2.IKESecurityAssociationParameters`` and
  ``ChildSecurityAssociationParameters``): encryption, integrity (the IKE PRF follows it, with AEAD
  too), Diffie-Hellman group number, lifetime in minutes (10 to 1440).
- Windows' built-in IKEv2 client (``Set-VpnConnectionIPsecConfiguration``): six enumerations, and
  no lifetimes at all.

The strongSwan-based clients (the Android app, the NetworkManager plugin, swanctl / charon-cmd)
take strongSwan's proposal strings as they are.

A keyword a platform cannot name, or a combination it cannot say (an IKE PRF other than the one its
integrity algorithm implies, a lifetime out of range), raises :class:`Inexpressible`: a profile is
written with exactly the negotiated suite or not at all, never with a nearby one.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from app.domain.algorithms import Protocol, lookup
from app.domain.errors import InvalidInput, PlatformCannot
from app.domain.proposals import ParsedProposal, parse

__all__ = [
    "ENUMERATIONS",
    "LABELS",
    "PLATFORMS",
    "Inexpressible",
    "check_names",
    "express",
    "expressible_keywords",
]

PLATFORMS = ("android", "apple", "windows", "networkmanager", "swanctl")

#: What a user calls each platform's client; errors name the platform this way.
LABELS: Mapping[str, str] = MappingProxyType({
    "android": "strongSwan VPN Client for Android",
    "apple": "Apple iOS/iPadOS/macOS built-in IKEv2",
    "windows": "Windows 10/11 built-in IKEv2",
    "networkmanager": "NetworkManager strongSwan plugin",
    "swanctl": "strongSwan (swanctl / charon-cmd)",
})

_T = TypeVar("_T")

_STRONGSWAN = frozenset({"android", "networkmanager", "swanctl"})

# --------------------------------------------------------------------------- documented enumerations

# Apple Developer, Device Management, "VPN.IKEv2.IKESecurityAssociationParameters" (the same keys
# for ChildSecurityAssociationParameters):
# https://developer.apple.com/documentation/devicemanagement/vpn/ikev2-data.dictionary
# (machine-readable: github.com/apple/device-management, mdm/profiles/com.apple.vpn.managed.yaml).
_APPLE_ENUMERATIONS: Mapping[str, frozenset[object]] = MappingProxyType({
    "EncryptionAlgorithm": frozenset({"DES", "3DES", "AES-128", "AES-256", "AES-128-GCM", "AES-256-GCM",
                                      "ChaCha20Poly1305"}),
    "IntegrityAlgorithm": frozenset({"SHA1-96", "SHA1-160", "SHA2-256", "SHA2-384", "SHA2-512"}),
    "DiffieHellmanGroup": frozenset({1, 2, 5, 14, 15, 16, 17, 18, 19, 20, 21, 31, 32}),
    "LifeTimeInMinutes": frozenset(range(10, 1441)),
})

# Microsoft Learn, "Set-VpnConnectionIPsecConfiguration" (VpnClient module), accepted values:
# https://learn.microsoft.com/en-us/powershell/module/vpnclient/set-vpnconnectionipsecconfiguration
_WINDOWS_ENUMERATIONS: Mapping[str, frozenset[object]] = MappingProxyType({
    "EncryptionMethod": frozenset({"DES", "DES3", "AES128", "AES192", "AES256", "GCMAES128", "GCMAES256"}),
    "IntegrityCheckMethod": frozenset({"MD5", "SHA1", "SHA256", "SHA384"}),
    "DHGroup": frozenset({"None", "Group1", "Group2", "Group14", "ECP256", "ECP384", "Group24"}),
    "CipherTransformConstants": frozenset({"DES", "DES3", "AES128", "AES192", "AES256", "GCMAES128", "GCMAES192",
                                           "GCMAES256", "None"}),
    "AuthenticationTransformConstants": frozenset({"MD596", "SHA196", "SHA256128", "GCMAES128", "GCMAES192",
                                                   "GCMAES256", "None"}),
    "PfsGroup": frozenset({"None", "PFS1", "PFS2", "PFS2048", "ECP256", "ECP384", "PFSMM", "PFS24"}),
})

#: Each enumerating platform's documented parameter values, by parameter name.
ENUMERATIONS: Mapping[str, Mapping[str, frozenset[object]]] = MappingProxyType({
    "apple": _APPLE_ENUMERATIONS,
    "windows": _WINDOWS_ENUMERATIONS,
})

# --------------------------------------------------------------------------- strongSwan keyword -> platform name

# Apple (source above). AES-GCM is the 16-byte ICV variant; no AES-192 and no 8/12-byte ICVs.
_APPLE_ENCRYPTION: Mapping[str, str] = MappingProxyType({
    "des": "DES", "3des": "3DES", "aes128": "AES-128", "aes256": "AES-256",
    "aes128gcm16": "AES-128-GCM", "aes256gcm16": "AES-256-GCM", "chacha20poly1305": "ChaCha20Poly1305",
})
# HMAC-SHA1-96 and the RFC 4868 truncations; HMAC-SHA1-160 exists in strongSwan for ESP only.
_APPLE_IKE_INTEGRITY: Mapping[str, str] = MappingProxyType({
    "sha1": "SHA1-96", "sha256": "SHA2-256", "sha384": "SHA2-384", "sha512": "SHA2-512",
})
_APPLE_ESP_INTEGRITY: Mapping[str, str] = MappingProxyType({**_APPLE_IKE_INTEGRITY, "sha1_160": "SHA1-160"})
# With AEAD, IntegrityAlgorithm only selects the IKE PRF.
_APPLE_PRF: Mapping[str, str] = MappingProxyType({
    "prfsha1": "SHA1-96", "prfsha256": "SHA2-256", "prfsha384": "SHA2-384", "prfsha512": "SHA2-512",
})
_APPLE_GROUPS: Mapping[str, int] = MappingProxyType({
    "modp768": 1, "modp1024": 2, "modp1536": 5, "modp2048": 14, "modp3072": 15, "modp4096": 16,
    "modp6144": 17, "modp8192": 18, "ecp256": 19, "ecp384": 20, "ecp521": 21, "x25519": 31, "x448": 32,
})
_APPLE_MINUTES = range(10, 1441)

# Windows (source above). IKE: -EncryptionMethod, -IntegrityCheckMethod (the PRF follows it), -DHGroup.
_WINDOWS_IKE_ENCRYPTION: Mapping[str, str] = MappingProxyType({
    "des": "DES", "3des": "DES3", "aes128": "AES128", "aes192": "AES192", "aes256": "AES256",
    "aes128gcm16": "GCMAES128", "aes256gcm16": "GCMAES256",
})
_WINDOWS_IKE_INTEGRITY: Mapping[str, str] = MappingProxyType({
    "md5": "MD5", "sha1": "SHA1", "sha256": "SHA256", "sha384": "SHA384",
})
_WINDOWS_PRF: Mapping[str, str] = MappingProxyType({
    "prfmd5": "MD5", "prfsha1": "SHA1", "prfsha256": "SHA256", "prfsha384": "SHA384",
})
_WINDOWS_DH: Mapping[str, str] = MappingProxyType({
    "modp768": "Group1", "modp1024": "Group2", "modp2048": "Group14", "ecp256": "ECP256", "ecp384": "ECP384",
    "modp2048s256": "Group24",
})
# ESP: -CipherTransformConstants, -AuthenticationTransformConstants (the same GCM constant with a GCM
# cipher), -PfsGroup ("None" when the ESP proposal has no key exchange).
_WINDOWS_ESP_CIPHER: Mapping[str, str] = MappingProxyType({
    "des": "DES", "3des": "DES3", "aes128": "AES128", "aes192": "AES192", "aes256": "AES256",
    "aes128gcm16": "GCMAES128", "aes192gcm16": "GCMAES192", "aes256gcm16": "GCMAES256",
})
_WINDOWS_ESP_AUTH: Mapping[str, str] = MappingProxyType({"md5": "MD596", "sha1": "SHA196", "sha256": "SHA256128"})
_WINDOWS_PFS: Mapping[str, str] = MappingProxyType({
    "modp768": "PFS1", "modp1024": "PFS2", "modp2048": "PFS2048", "ecp256": "ECP256", "ecp384": "ECP384",
    "modp2048s256": "PFS24",
})

_TABLES: Mapping[str, tuple[Mapping[str, object], ...]] = MappingProxyType({
    "apple": (_APPLE_ENCRYPTION, _APPLE_ESP_INTEGRITY, _APPLE_PRF, _APPLE_GROUPS),
    "windows": (_WINDOWS_IKE_ENCRYPTION, _WINDOWS_IKE_INTEGRITY, _WINDOWS_PRF, _WINDOWS_DH, _WINDOWS_ESP_CIPHER,
                _WINDOWS_ESP_AUTH, _WINDOWS_PFS),
})


class Inexpressible(PlatformCannot):
    """A platform's client cannot say (part of) a negotiated suite in its own names.

    Also a ``ValueError``. The message names the platform, the IKE or ESP part, the role and the
    keyword (or value), e.g. ``Windows 10/11 built-in IKEv2 cannot express ESP integrity sha512``.

    Attributes:
        platform: the platform (one of :data:`PLATFORMS`).
        part: ``"IKE"`` or ``"ESP"``.
        role: ``"encryption"``, ``"AEAD"``, ``"integrity"``, ``"PRF"``, ``"key exchange"`` or ``"lifetime"``.
        keyword: the strongSwan keyword (or value) that has no name on the platform.
    """

    def __init__(self, platform: str, part: str, role: str, keyword: str, why: str = "") -> None:
        super().__init__(f"{LABELS[platform]} cannot express {part} {role} {keyword}" + (f" ({why})" if why else ""))
        self.platform = platform
        self.part = part
        self.role = role
        self.keyword = keyword


# --------------------------------------------------------------------------- public functions


def expressible_keywords(platform: str) -> frozenset[str] | None:
    """Every strongSwan keyword the platform's client can name, in any role.

    Args:
        platform: one of :data:`PLATFORMS`.

    Returns:
        The canonical keywords (see ``app.domain.algorithms``) Apple or Windows can express; None
        for the strongSwan-based clients, which take any strongSwan proposal.

    Raises:
        InvalidInput: an unknown platform (the message names the known ones).
    """
    _check_platform(platform)
    if platform in _STRONGSWAN:
        return None
    return frozenset(keyword for table in _TABLES[platform] for keyword in table)


def express(platform: str, *, ike_proposal: str, esp_proposal: str, ike_lifetime: int,
            child_lifetime: int) -> dict[str, dict[str, object]]:
    """A negotiated suite in the platform's own names.

    Args:
        platform: one of :data:`PLATFORMS`.
        ike_proposal: strongSwan IKE proposal, ``encr-integ[-prf]-ke`` or ``aead-prf-ke``.
        esp_proposal: strongSwan ESP proposal, ``encr-integ[-ke]`` or ``aead[-ke]``.
        ike_lifetime: IKE SA rekey interval, seconds.
        child_lifetime: CHILD_SA rekey interval, seconds.

    Returns:
        - apple: ``{"ike": {...}, "child": {...}}``, each with ``EncryptionAlgorithm``,
          ``IntegrityAlgorithm`` (left out for an AEAD child), ``DiffieHellmanGroup`` (left out of
          the child when the ESP proposal has no key exchange: no PFS) and ``LifeTimeInMinutes``
          (seconds rounded to the nearest minute).
        - windows: ``{"ipsec": {...}}`` with the six ``Set-VpnConnectionIPsecConfiguration``
          parameters. Windows has no lifetime setting; the lifetimes are only checked.
        - android, networkmanager, swanctl: ``{"strongswan": {"ike": ..., "esp": ...}}``, the
          proposals in canonical keywords.

    Raises:
        InvalidInput: an unknown platform, a proposal strongSwan would reject, a lifetime that is
            not a positive number of seconds.
        Inexpressible: the platform cannot say the suite (a keyword without a name there, an IKE
            PRF other than the one its integrity algorithm implies, an Apple lifetime out of range).
    """
    _check_platform(platform)
    ike = parse(ike_proposal, Protocol.IKE)
    esp = parse(esp_proposal, Protocol.ESP)
    for what, seconds in (("IKE", ike_lifetime), ("CHILD_SA", child_lifetime)):
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
            raise InvalidInput(f"the {what} lifetime is a positive number of seconds, not {seconds!r}")
    if platform == "apple":
        return {"ike": _apple_ike(ike, ike_lifetime), "child": _apple_child(esp, child_lifetime)}
    if platform == "windows":
        return {"ipsec": {**_windows_ike(ike), **_windows_esp(esp)}}
    return {"strongswan": {"ike": ike.to_string(), "esp": esp.to_string()}}


def check_names(platform: str, expressed: Mapping[str, Mapping[str, object]]) -> None:
    """Check that an :func:`express` result uses only names the platform documents.

    Every Apple and Windows value must belong to the vendor's enumeration for its parameter, every
    parameter must be known, and the required ones present; the strongSwan platforms' proposals
    must parse.

    Raises:
        InvalidInput: an unknown platform.
        ValueError: a part, parameter or value the platform does not document.
    """
    _check_platform(platform)
    if platform in _STRONGSWAN:
        _check_strongswan_names(expressed)
    elif platform == "apple":
        _check_parts(expressed, ("ike", "child"))
        _check_enumerated(platform, expressed["ike"], required=("EncryptionAlgorithm", "IntegrityAlgorithm",
                                                                  "DiffieHellmanGroup", "LifeTimeInMinutes"))
        _check_enumerated(platform, expressed["child"], required=("EncryptionAlgorithm", "LifeTimeInMinutes"))
    else:
        _check_parts(expressed, ("ipsec",))
        _check_enumerated(platform, expressed["ipsec"], required=tuple(_WINDOWS_ENUMERATIONS))


# --------------------------------------------------------------------------- Apple


def _apple_ike(ike: ParsedProposal, lifetime: int) -> dict[str, object]:
    return {
        "EncryptionAlgorithm": _name("apple", "IKE", ike, _APPLE_ENCRYPTION),
        "IntegrityAlgorithm": _ike_integrity("apple", ike, _APPLE_IKE_INTEGRITY, _APPLE_PRF),
        "DiffieHellmanGroup": _named("apple", "IKE", "key exchange", ike.key_exchange, _APPLE_GROUPS),
        "LifeTimeInMinutes": _apple_minutes("IKE", lifetime),
    }


def _apple_child(esp: ParsedProposal, lifetime: int) -> dict[str, object]:
    child: dict[str, object] = {"EncryptionAlgorithm": _name("apple", "ESP", esp, _APPLE_ENCRYPTION)}
    if esp.integrity is not None:
        child["IntegrityAlgorithm"] = _named("apple", "ESP", "integrity", esp.integrity, _APPLE_ESP_INTEGRITY)
    if esp.key_exchange is not None:  # only used with EnablePFS; without it the child rekeys without PFS
        child["DiffieHellmanGroup"] = _named("apple", "ESP", "key exchange", esp.key_exchange, _APPLE_GROUPS)
    child["LifeTimeInMinutes"] = _apple_minutes("ESP", lifetime)
    return child


def _apple_minutes(part: str, seconds: int) -> int:
    minutes = (seconds + 30) // 60
    if minutes not in _APPLE_MINUTES:
        raise Inexpressible("apple", part, "lifetime", f"{seconds} s",
                            f"LifeTimeInMinutes is {_APPLE_MINUTES.start} to {_APPLE_MINUTES.stop - 1} minutes")
    return minutes


# --------------------------------------------------------------------------- Windows


def _windows_ike(ike: ParsedProposal) -> dict[str, object]:
    return {
        "EncryptionMethod": _name("windows", "IKE", ike, _WINDOWS_IKE_ENCRYPTION),
        "IntegrityCheckMethod": _ike_integrity("windows", ike, _WINDOWS_IKE_INTEGRITY, _WINDOWS_PRF),
        "DHGroup": _named("windows", "IKE", "key exchange", ike.key_exchange, _WINDOWS_DH),
    }


def _windows_esp(esp: ParsedProposal) -> dict[str, object]:
    cipher = _name("windows", "ESP", esp, _WINDOWS_ESP_CIPHER)
    # a GCM cipher takes the same GCM constant as its authentication transform
    auth = cipher if esp.aead is not None else _named("windows", "ESP", "integrity", esp.integrity, _WINDOWS_ESP_AUTH)
    pfs = "None" if esp.key_exchange is None else _named("windows", "ESP", "key exchange", esp.key_exchange,
                                                           _WINDOWS_PFS)
    return {"CipherTransformConstants": cipher, "AuthenticationTransformConstants": auth, "PfsGroup": pfs}


# --------------------------------------------------------------------------- shared


def _name(platform: str, part: str, proposal: ParsedProposal, table: Mapping[str, str]) -> str:
    """The platform's name for the proposal's encryption or AEAD algorithm."""
    if proposal.aead is not None:
        return _named(platform, part, "AEAD", proposal.aead, table)
    return _named(platform, part, "encryption", proposal.encryption, table)


def _ike_integrity(platform: str, ike: ParsedProposal, integrity: Mapping[str, str],
                   prfs: Mapping[str, str]) -> str:
    """The one integrity name that also fixes the IKE PRF: the integrity algorithm's own, or for
    AEAD the one whose PRF is the proposal's."""
    if ike.aead is not None:
        return _named(platform, "IKE", "PRF", ike.prf, prfs)
    name = _named(platform, "IKE", "integrity", ike.integrity, integrity)
    implied = lookup(ike.integrity or "").prf
    if ike.prf is not None and ike.prf != implied:
        raise Inexpressible(platform, "IKE", "PRF", ike.prf,
                            f"its PRF is the one integrity {ike.integrity} implies, {implied}")
    return name


def _named(platform: str, part: str, role: str, keyword: str | None, table: Mapping[str, _T]) -> _T:
    if keyword is None or keyword not in table:
        raise Inexpressible(platform, part, role, keyword or "(none)")
    return table[keyword]


def _check_platform(platform: str) -> None:
    if platform not in PLATFORMS:
        raise InvalidInput(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")


def _check_parts(expressed: Mapping[str, Mapping[str, object]], parts: tuple[str, ...]) -> None:
    if not isinstance(expressed, Mapping) or set(expressed) != set(parts):
        found = sorted(expressed) if isinstance(expressed, Mapping) else type(expressed).__name__
        raise ValueError(f"expected the parts {', '.join(parts)}, found {found}")


def _check_enumerated(platform: str, values: Mapping[str, object], *, required: tuple[str, ...]) -> None:
    enumerations = ENUMERATIONS[platform]
    if not isinstance(values, Mapping):
        raise ValueError(f"{LABELS[platform]}: expected a mapping of parameters, found {type(values).__name__}")
    for parameter, value in values.items():
        if parameter not in enumerations:
            raise ValueError(f"{LABELS[platform]} has no parameter {parameter!r}")
        if isinstance(value, bool) or value not in enumerations[parameter]:
            raise ValueError(f"{LABELS[platform]}: {value!r} is not a documented {parameter}")
    missing = [parameter for parameter in required if parameter not in values]
    if missing:
        raise ValueError(f"{LABELS[platform]}: missing {', '.join(missing)}")


def _check_strongswan_names(expressed: Mapping[str, Mapping[str, object]]) -> None:
    _check_parts(expressed, ("strongswan",))
    proposals = expressed["strongswan"]
    if not isinstance(proposals, Mapping) or set(proposals) != {"ike", "esp"}:
        raise ValueError("expected the proposals ike and esp")
    for key, protocol in (("ike", Protocol.IKE), ("esp", Protocol.ESP)):
        value = proposals[key]
        if not isinstance(value, str):
            raise ValueError(f"the {key} proposal is a string, not {type(value).__name__}")
        parse(value, protocol)
