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

Everything else a platform needs is named once, in its :class:`DevicePlatform` record in
:data:`PLATFORMS`: its capability table (the policy Target negotiates with as the device's peer),
its profile writer, the profile's media type and file name, what the device page offers, and
whether a phone can take the profile from a one-time link, and what post-quantum protection its
client can take (:attr:`DevicePlatform.post_quantum`; :func:`post_quantum_refusal` says why not).

A keyword a platform cannot name, or a combination it cannot say (an IKE PRF other than the one its
integrity algorithm implies, a lifetime out of range), raises :class:`Inexpressible`: a profile is
written with exactly the negotiated suite or not at all, never with a nearby one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from app.domain.algorithms import Protocol, lookup
from app.domain.errors import InvalidInput, PlatformCannot
from app.domain.proposals import ParsedProposal, parse

__all__ = [
    "ENUMERATIONS",
    "LABELS",
    "PLATFORMS",
    "DevicePlatform",
    "Inexpressible",
    "check_names",
    "express",
    "expressible_keywords",
    "post_quantum_refusal",
]

_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class DevicePlatform:
    """One device platform: every fact about it that Target, the profile writers and the device
    page need.

    Attributes:
        name: the platform's name in requests and on the command line, e.g. ``"android"``.
        label: what a user calls its client; errors name the platform this way.
        names: whose algorithm names its profile uses: ``"strongswan"`` (proposal strings as they
            are), ``"apple"`` or ``"windows"`` (the vendor's enumerations, :data:`ENUMERATIONS`).
        policy: its capability table, the policy Target negotiates with as the device's peer
            (``policies/<policy>.yaml``).
        writer: the key of its profile writer (``app.adapters.agent.profiles``).
        media_type: the profile's media type.
        suffix: the profile's file name ends in it (``<name><suffix>``).
        beside: what the user puts beside the profile, if anything (the CA's file ends in
            ``ca_suffix``); empty when the profile holds everything.
        ca_suffix: the CA certificate's file name ends in ``-ca.<ca_suffix>``; empty where the
            profile embeds the CA without a file name.
        offer: what the device page says the profile is and how to open it.
        post_quantum: the post-quantum mechanisms its client can take from a profile (``"ppk"``:
            an RFC 8784 post-quantum preshared key that qoss makes and writes into the profile);
            empty when it has none.
        post_quantum_note: where its client takes them and since which version, or why it has
            none (what a refusal says).
    """

    name: str
    label: str
    names: str
    policy: str
    writer: str
    media_type: str
    suffix: str
    beside: tuple[str, ...]
    ca_suffix: str
    offer: str
    post_quantum: tuple[str, ...] = ()
    post_quantum_note: str = ""

    @property
    def linkable(self) -> bool:
        """The profile holds everything (the PKCS#12 inside): a phone can take it from a link."""
        return not self.beside


def _platform(name: str, label: str, *, names: str, writer: str, media_type: str, suffix: str,
              beside: tuple[str, ...], ca_suffix: str, offer: str, post_quantum: tuple[str, ...],
              post_quantum_note: str) -> DevicePlatform:
    return DevicePlatform(name=name, label=label, names=names, policy=f"platform-{name}", writer=writer,
                          media_type=media_type, suffix=suffix, beside=beside, ca_suffix=ca_suffix, offer=offer,
                          post_quantum=post_quantum, post_quantum_note=post_quantum_note)


#: Every device platform by name, in the order the page and the command line list them.
PLATFORMS: Mapping[str, DevicePlatform] = MappingProxyType({p.name: p for p in (
    _platform("android", "strongSwan VPN Client for Android", names="strongswan", writer="sswan",
              media_type="application/vnd.strongswan.profile", suffix=".sswan", beside=(), ca_suffix="",
              offer=".sswan profile: open it in the strongSwan app", post_quantum=(),
              post_quantum_note="the strongSwan app has no post-quantum setting (its profiles carry no PPK, "
                                "and it offers no ML-KEM)"),
    _platform("apple", "Apple iOS/iPadOS/macOS built-in IKEv2", names="apple", writer="mobileconfig",
              media_type="application/x-apple-aspen-config", suffix=".mobileconfig", beside=(), ca_suffix="cer",
              offer=".mobileconfig profile: open it in Settings (iPhone, iPad) or System Settings (Mac)",
              post_quantum=("ppk",),
              post_quantum_note="a PPK in the IKEv2 payload (PPK, PPKIdentifier, PPKMandatory) from iOS 18, "
                                "iPadOS 18 and macOS 15 (an older system connects without it, which the gateway "
                                "refuses)"),
    _platform("windows", "Windows 10/11 built-in IKEv2", names="windows", writer="powershell",
              media_type=_TEXT, suffix=".ps1", beside=("PKCS#12", "CA (DER)"), ca_suffix="cer",
              offer="PowerShell script, with the CA and the PKCS#12 beside it", post_quantum=(),
              post_quantum_note="the built-in client has no post-quantum setting (no PPK in "
                                "Add-VpnConnection or Set-VpnConnectionIPsecConfiguration, no ML-KEM)"),
    _platform("networkmanager", "NetworkManager strongSwan plugin", names="strongswan", writer="nmconnection",
              media_type=_TEXT, suffix=".nmconnection", beside=("PKCS#12", "CA (PEM)"), ca_suffix="pem",
              offer=".nmconnection keyfile, with the CA and the PKCS#12 beside it", post_quantum=(),
              post_quantum_note="the NetworkManager plugin has no post-quantum setting (no PPK in its "
                                "keyfile, no ML-KEM)"),
    _platform("swanctl", "strongSwan (swanctl / charon-cmd)", names="strongswan", writer="swanctl",
              media_type=_TEXT, suffix=".conf", beside=("PKCS#12", "CA (PEM)"), ca_suffix="pem",
              offer="swanctl.conf, with the CA and the PKCS#12 beside it", post_quantum=("ppk",),
              post_quantum_note="a PPK in swanctl.conf (ppk_id, ppk_required and a ppk secret, strongSwan "
                                "5.7 and later); charon-cmd has no PPK option: use swanctl"),
)})

#: What a user calls each platform's client; errors name the platform this way.
LABELS: Mapping[str, str] = MappingProxyType({name: p.label for name, p in PLATFORMS.items()})

_T = TypeVar("_T")

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
    names = _check_platform(platform).names
    if names not in _TABLES:
        return None
    return frozenset(keyword for table in _TABLES[names] for keyword in table)


def post_quantum_refusal(platform: str, level: int) -> str | None:
    """Why ``platform``'s client cannot meet a post-quantum minimum of ``level``, or None if it can
    take a post-quantum mechanism (a minimum of 0 asks for none: every platform meets it).

    Which level a mechanism reaches is the rating tables' to say, like any algorithm's; this only
    says whether the platform's client can take any post-quantum mechanism at all.

    Args:
        platform: one of :data:`PLATFORMS`.
        level: the post-quantum minimum, 0 to 10.

    Returns:
        None, or the refusal naming the platform, e.g. ``strongSwan VPN Client for Android (android):
        no post-quantum protection at level 5: the strongSwan app has no post-quantum setting ...``.

    Raises:
        InvalidInput: an unknown platform, or a level that is not 0 to 10.
    """
    record = _check_platform(platform)
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 10:
        raise InvalidInput(f"the post-quantum minimum is 0 to 10, not {level!r}")
    if level == 0 or record.post_quantum:
        return None
    return f"{record.label} ({record.name}): no post-quantum protection at level {level}: {record.post_quantum_note}"


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
    names = _check_platform(platform).names
    ike = parse(ike_proposal, Protocol.IKE)
    esp = parse(esp_proposal, Protocol.ESP)
    for what, seconds in (("IKE", ike_lifetime), ("CHILD_SA", child_lifetime)):
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
            raise InvalidInput(f"the {what} lifetime is a positive number of seconds, not {seconds!r}")
    return _EXPRESS[names](ike, esp, ike_lifetime, child_lifetime)


def check_names(platform: str, expressed: Mapping[str, Mapping[str, object]]) -> None:
    """Check that an :func:`express` result uses only names the platform documents.

    Every Apple and Windows value must belong to the vendor's enumeration for its parameter, every
    parameter must be known, and the required ones present; the strongSwan platforms' proposals
    must parse.

    Raises:
        InvalidInput: an unknown platform.
        ValueError: a part, parameter or value the platform does not document.
    """
    _CHECK_NAMES[_check_platform(platform).names](platform, expressed)


# --------------------------------------------------------------------------- Apple


def _apple(ike: ParsedProposal, esp: ParsedProposal, ike_lifetime: int,
           child_lifetime: int) -> dict[str, dict[str, object]]:
    return {"ike": _apple_ike(ike, ike_lifetime), "child": _apple_child(esp, child_lifetime)}


def _check_apple_names(platform: str, expressed: Mapping[str, Mapping[str, object]]) -> None:
    _check_parts(expressed, ("ike", "child"))
    _check_enumerated(platform, expressed["ike"], required=("EncryptionAlgorithm", "IntegrityAlgorithm",
                                                              "DiffieHellmanGroup", "LifeTimeInMinutes"))
    _check_enumerated(platform, expressed["child"], required=("EncryptionAlgorithm", "LifeTimeInMinutes"))


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


def _windows(ike: ParsedProposal, esp: ParsedProposal, ike_lifetime: int,
             child_lifetime: int) -> dict[str, dict[str, object]]:
    return {"ipsec": {**_windows_ike(ike), **_windows_esp(esp)}}


def _check_windows_names(platform: str, expressed: Mapping[str, Mapping[str, object]]) -> None:
    _check_parts(expressed, ("ipsec",))
    _check_enumerated(platform, expressed["ipsec"], required=tuple(_WINDOWS_ENUMERATIONS))


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


def _strongswan(ike: ParsedProposal, esp: ParsedProposal, ike_lifetime: int,
                child_lifetime: int) -> dict[str, dict[str, object]]:
    return {"strongswan": {"ike": ike.to_string(), "esp": esp.to_string()}}


def _check_platform(platform: str) -> DevicePlatform:
    if not isinstance(platform, str) or platform not in PLATFORMS:
        raise InvalidInput(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")
    return PLATFORMS[platform]


def _check_parts(expressed: Mapping[str, Mapping[str, object]], parts: tuple[str, ...]) -> None:
    if not isinstance(expressed, Mapping) or set(expressed) != set(parts):
        found = sorted(expressed) if isinstance(expressed, Mapping) else type(expressed).__name__
        raise ValueError(f"expected the parts {', '.join(parts)}, found {found}")


def _check_enumerated(platform: str, values: Mapping[str, object], *, required: tuple[str, ...]) -> None:
    enumerations = ENUMERATIONS[PLATFORMS[platform].names]
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


def _check_strongswan_names(platform: str, expressed: Mapping[str, Mapping[str, object]]) -> None:
    _check_parts(expressed, ("strongswan",))
    proposals = expressed["strongswan"]
    if not isinstance(proposals, Mapping) or set(proposals) != {"ike", "esp"}:
        raise ValueError("expected the proposals ike and esp")
    for key, protocol in (("ike", Protocol.IKE), ("esp", Protocol.ESP)):
        value = proposals[key]
        if not isinstance(value, str):
            raise ValueError(f"the {key} proposal is a string, not {type(value).__name__}")
        parse(value, protocol)


_Express = Callable[[ParsedProposal, ParsedProposal, int, int], dict[str, dict[str, object]]]
_CheckNames = Callable[[str, Mapping[str, Mapping[str, object]]], None]

#: By a platform's ``names``: the suite in those names, and the check of a result.
_EXPRESS: Mapping[str, _Express] = MappingProxyType({"strongswan": _strongswan, "apple": _apple, "windows": _windows})
_CHECK_NAMES: Mapping[str, _CheckNames] = MappingProxyType({
    "strongswan": _check_strongswan_names, "apple": _check_apple_names, "windows": _check_windows_names})
