"""What every device profile writer shares: the input, the written profile, and the input's checks.

A value that could break a format (a newline, a quote the format cannot hold) raises
``InvalidInput`` naming the field; a suite the platform cannot name raises ``Inexpressible``
(``app.domain.agent.platforms``) before anything is written.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from app.domain.agent.platforms import LABELS, PLATFORMS, DevicePlatform, Inexpressible, check_names, express
from app.domain.errors import InvalidInput

__all__ = ["Checked", "DeviceProfileInput", "Profile", "ca_der", "ca_file_name", "ca_pem", "check", "profile",
           "proposals", "round_trip"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAX_TEXT = 255
_MAX_NAME = 64
_MAX_P12 = 64 * 1024
_MAX_CERT = 16 * 1024
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}\Z){_DNS_LABEL}(?:\.{_DNS_LABEL})*\.?\Z")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_PPK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_MIN_PPK, _MAX_PPK = 32, 256


@dataclass(frozen=True, slots=True)
class DeviceProfileInput:
    """What a device's profile says.

    Attributes:
        name: connection name shown to the user, e.g. ``"qoss target-1"`` (1-64 printable
            characters; its letters, digits, ``_`` and ``-`` also name the files).
        uuid: stable UUID of the profile (a re-import replaces the same profile).
        platform: one of ``app.domain.agent.platforms.PLATFORMS``.
        remote_address: the gateway's IKE address (IPv4, IPv6 or a DNS name).
        remote_id: the gateway's IKE identity, e.g. ``"target-1"``.
        local_id: the device's IKE identity. A DN (``"CN=0a1b2c3d4e5f.alice"``) for every
            platform but Apple, whose client sends its identity as an FQDN, e-mail address or IP
            address: for ``apple`` it must be one of the device certificate's subjectAltNames.
        ca_cert_der: the CA that signed the gateway's and the device's certificates (DER).
        p12: PKCS#12 with the device's key and certificate (and the CA), protected by a
            passphrase the writer never sees. Apple's clients open only the legacy PKCS#12
            encryption (3DES or RC2 with SHA-1), not PBES2/AES.
        p12_name: its file name for formats that reference it, e.g. ``"alice-phone.p12"``.
        ike_proposal: the negotiated strongSwan IKE proposal.
        esp_proposal: the negotiated strongSwan ESP proposal.
        ike_lifetime: IKE SA rekey interval, seconds.
        child_lifetime: CHILD_SA rekey interval, seconds.
        remote_ts: the networks reached through the tunnel (CIDR; a split tunnel).
        domains: DNS domains that start the connection on demand (Apple only; see
            :func:`app.adapters.agent.profiles.write_profile`).
        device_cert_der: the device certificate (DER). Required for ``apple``, whose profile
            names the certificate's key type; checked against ``ca_cert_der`` when given.
        ppk: a post-quantum preshared key (RFC 8784) the device must use, 32 to 256 random
            bytes, with ``ppk_id``, its identity (1-64 letters, digits, ``.``, ``_``, ``-``); both
            or neither. Only for a platform whose client takes one
            (``app.domain.agent.platforms.DevicePlatform.post_quantum``); the profile then makes
            the PPK mandatory. It never appears in a repr.
    """

    name: str
    uuid: str
    platform: str
    remote_address: str
    remote_id: str
    local_id: str
    ca_cert_der: bytes
    p12: bytes
    p12_name: str
    ike_proposal: str
    esp_proposal: str
    ike_lifetime: int
    child_lifetime: int
    remote_ts: tuple[str, ...]
    domains: tuple[str, ...] = ()
    device_cert_der: bytes | None = None
    ppk: bytes | None = None
    ppk_id: str | None = None

    def __repr__(self) -> str:
        return f"DeviceProfileInput(platform={self.platform!r}, name={self.name!r}, uuid={self.uuid!r})"


@dataclass(frozen=True, slots=True)
class Profile:
    """A written profile.

    Attributes:
        filename: the profile's file name.
        media_type: its media type.
        content: the file.
        files: other files the user puts beside it (the PKCS#12, the CA certificate), by file
            name, for the formats that reference files; empty when everything is embedded.
    """

    filename: str
    media_type: str
    content: bytes
    files: Mapping[str, bytes]

    def __repr__(self) -> str:
        return f"Profile(filename={self.filename!r}, media_type={self.media_type!r}, files={sorted(self.files)})"



@dataclass(frozen=True, slots=True)
class Checked:
    """The input once checked, with what the writers derive from it.

    Attributes:
        inp: the input.
        platform: its platform's record.
        suite: the negotiated suite in the platform's names (``app.domain.agent.platforms.express``).
        stem: the file-name form of the connection name.
        ca: the CA certificate.
        device: the device certificate, if given.
        networks: the networks reached through the tunnel.
    """

    inp: DeviceProfileInput
    platform: DevicePlatform
    suite: dict[str, dict[str, object]]
    stem: str
    ca: x509.Certificate
    device: x509.Certificate | None
    networks: tuple[_Network, ...]


def check(inp: DeviceProfileInput) -> Checked:
    """Every field checked (the suite first: an inexpressible suite is the answer that matters).

    Raises:
        InvalidInput: a field that cannot be used (the message names it).
        Inexpressible: the platform cannot say the suite.
    """
    suite = express(inp.platform, ike_proposal=inp.ike_proposal, esp_proposal=inp.esp_proposal,
                    ike_lifetime=inp.ike_lifetime, child_lifetime=inp.child_lifetime)
    check_names(inp.platform, suite)
    stem = _stem(inp.name)
    _uuid(inp.uuid)
    _address(inp.remote_address)
    _text(inp.remote_id, "remote_id")
    _text(inp.local_id, "local_id")
    _file_name(inp.p12_name)
    if not isinstance(inp.p12, bytes) or not 0 < len(inp.p12) <= _MAX_P12 or inp.p12[0] != 0x30:
        raise InvalidInput(f"p12: a PKCS#12 file (DER) of at most {_MAX_P12} bytes")
    ca = _certificate(inp.ca_cert_der, "ca_cert_der")
    if not _is_ca(ca):
        raise InvalidInput("ca_cert_der: not a CA certificate (basicConstraints CA:TRUE)")
    device = None if inp.device_cert_der is None else _device_certificate(inp.device_cert_der, ca)
    networks = _networks(inp.remote_ts)
    _domains(inp.domains)
    _ppk(inp)
    return Checked(inp=inp, platform=PLATFORMS[inp.platform], suite=suite, stem=stem, ca=ca, device=device,
                   networks=networks)


def _text(value: object, field: str, *, limit: int = _MAX_TEXT) -> str:
    """A printable one-line string without surrounding spaces (no control or separator characters)."""
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise InvalidInput(f"{field}: a string of 1 to {limit} characters")
    if not value.isprintable() or value != value.strip():
        raise InvalidInput(f"{field}: {value[:64]!r} holds a control character, a line break or surrounding spaces")
    return value


def _stem(name: str) -> str:
    _text(name, "name", limit=_MAX_NAME)
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    if not stem:
        raise InvalidInput("name: needs a letter or digit (its letters, digits, _ and - name the files)")
    return stem


def _uuid(value: object) -> None:
    try:
        canonical = str(uuid.UUID(value)) if isinstance(value, str) else None
    except ValueError:
        canonical = None
    if canonical is None or canonical != str(value).lower():
        raise InvalidInput(f"uuid: {str(value)[:64]!r} is not a UUID (8-4-4-4-12 hex digits)")


def _address(value: object) -> None:
    text = _text(value, "remote_address")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _DNS_NAME.match(text):
            raise InvalidInput(f"remote_address: {text[:64]!r} is neither an IP address nor a DNS name") from None


def _file_name(value: object) -> None:
    """A plain file name ending in .p12 or .pfx (so never the CA's ``<name>-ca.pem`` or ``.cer``)."""
    if not isinstance(value, str) or not _FILE_NAME.match(value):
        raise InvalidInput("p12_name: a plain file name (letters, digits, '.', '_', '-'; 1 to 100 characters)")
    if not value.lower().endswith((".p12", ".pfx")):
        raise InvalidInput(f"p12_name: {value!r} does not end in .p12 or .pfx")


def _certificate(der: object, field: str) -> x509.Certificate:
    if not isinstance(der, bytes) or not 0 < len(der) <= _MAX_CERT:
        raise InvalidInput(f"{field}: a DER certificate of at most {_MAX_CERT} bytes")
    try:
        return x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise InvalidInput(f"{field}: not a DER X.509 certificate ({exc})") from exc


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _device_certificate(der: bytes, ca: x509.Certificate) -> x509.Certificate:
    cert = _certificate(der, "device_cert_der")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise InvalidInput("device_cert_der: not issued by the CA in ca_cert_der") from exc
    return cert


def _networks(values: object) -> tuple[_Network, ...]:
    if not isinstance(values, tuple | list) or not values:
        raise InvalidInput("remote_ts: one or more networks (CIDR), as a tuple")
    networks: list[_Network] = []
    for value in values:
        text = _text(value, "remote_ts")
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise InvalidInput(f"remote_ts: {text[:64]!r} is not a network in CIDR notation ({exc})") from exc
    return tuple(networks)


def _domains(values: object) -> tuple[str, ...]:
    if not isinstance(values, tuple | list):
        raise InvalidInput("domains: a tuple of DNS domains")
    for value in values:
        if not isinstance(value, str) or not _DNS_NAME.match(value):
            raise InvalidInput(f"domains: {str(value)[:64]!r} is not a DNS domain")
    return tuple(values)


def _ppk(inp: DeviceProfileInput) -> None:
    """Both ``ppk`` and ``ppk_id`` or neither, each well formed, and only for a platform that takes one."""
    if inp.ppk is None and inp.ppk_id is None:
        return
    if inp.ppk is None or inp.ppk_id is None:
        raise InvalidInput("ppk and ppk_id: both or neither")
    record = PLATFORMS[inp.platform]
    if "ppk" not in record.post_quantum:
        raise Inexpressible(inp.platform, "IKE", "post-quantum", "ppk", record.post_quantum_note)
    if not isinstance(inp.ppk, bytes) or not _MIN_PPK <= len(inp.ppk) <= _MAX_PPK:
        raise InvalidInput(f"ppk: {_MIN_PPK} to {_MAX_PPK} random bytes (RFC 8784 asks for 256 bits of entropy)")
    if not isinstance(inp.ppk_id, str) or not _PPK_ID.match(inp.ppk_id):
        raise InvalidInput("ppk_id: 1 to 64 letters, digits, '.', '_' or '-'")


def ca_file_name(checked: Checked) -> str:
    """The CA certificate's file name beside (or inside) the profile."""
    return f"{checked.stem}-ca.{checked.platform.ca_suffix}"


def ca_der(checked: Checked) -> bytes:
    """The CA certificate, DER."""
    return checked.ca.public_bytes(serialization.Encoding.DER)


def ca_pem(checked: Checked) -> bytes:
    """The CA certificate, PEM."""
    return checked.ca.public_bytes(serialization.Encoding.PEM)


def proposals(checked: Checked) -> tuple[str, str]:
    """The IKE and ESP proposals of a strongSwan platform's suite."""
    found = checked.suite["strongswan"]
    return str(found["ike"]), str(found["esp"])


def round_trip(ok: bool, platform: str, what: str) -> None:
    """The bug guard: a profile whose parse-back differs from what was meant is never handed out.

    Raises:
        RuntimeError: ``ok`` is false.
    """
    if not ok:
        raise RuntimeError(f"the {LABELS[platform]} profile does not read back as written: {what}")


def profile(checked: Checked, content: bytes, files: Mapping[str, bytes] | None = None) -> Profile:
    """The written profile, named and typed as its platform's record says."""
    return Profile(f"{checked.stem}{checked.platform.suffix}", checked.platform.media_type, content,
                   MappingProxyType(dict(files or {})))
