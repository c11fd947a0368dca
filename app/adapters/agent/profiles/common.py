"""Device profiles: the file a phone's or laptop's own IKEv2 client imports, with the negotiated suite.

One writer per platform (``app.domain.agent.platforms``), each in the format the client reads:

- android: ``<name>.sswan``, ``application/vnd.strongswan.profile``; the CA and the PKCS#12 inside.
- apple: ``<name>.mobileconfig``, ``application/x-apple-aspen-config``; the CA and the PKCS#12 inside.
- windows: ``<name>.ps1``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and the CA (DER).
- networkmanager: ``<name>.nmconnection``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and
  the CA (PEM).
- swanctl: ``<name>.conf``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and the CA (PEM).

``<name>`` is the connection name reduced to letters, digits, ``_`` and ``-``. The PKCS#12
passphrase never reaches a writer: every client asks the user for it.

Every writer reads its own output back (JSON, plist, INI, the PowerShell lines, swanctl.conf) and
refuses to hand it out unless the suite, the identities and the networks come back unchanged: a
guard against bugs here, not against the input. Input is checked first: a value that could break
the format (a newline, a quote the format cannot hold) raises ``InvalidInput`` naming the field;
a suite the platform cannot name raises :class:`Inexpressible` and nothing is written.

Errors::

    InvalidInput (ValueError)      a field that cannot go into the profile (app.domain.errors)
    Inexpressible (ValueError)     the platform cannot say the suite (app.domain.agent.platforms)
    RuntimeError                   a profile that does not read back as written (a bug here)
"""

from __future__ import annotations

import base64
import configparser
import io
import ipaddress
import json
import plistlib
import re
import shlex
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import MappingProxyType

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from app.domain.agent.platforms import LABELS, Inexpressible, check_names, express
from app.domain.errors import InvalidInput

__all__ = ["NM_DIRECTORY", "DeviceProfileInput", "Inexpressible", "Profile", "parse_swanctl", "write_profile"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAX_TEXT = 255
_MAX_NAME = 64
_MAX_P12 = 64 * 1024
_MAX_CERT = 16 * 1024
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}\Z){_DNS_LABEL}(?:\.{_DNS_LABEL})*\.?\Z")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
#: PowerShell ends a single-quoted string at any of these, not only at the ASCII apostrophe.
_PS_QUOTES = "\u2018\u2019\u201a\u201b"
_TEXT = "text/plain; charset=utf-8"


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
            :func:`write_profile`).
        device_cert_der: the device certificate (DER). Required for ``apple``, whose profile
            names the certificate's key type; checked against ``ca_cert_der`` when given.
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
class _Checked:
    """The input once checked, with what the writers derive from it."""

    inp: DeviceProfileInput
    suite: dict[str, dict[str, object]]
    stem: str  # the file-name form of the connection name
    ca: x509.Certificate
    device: x509.Certificate | None
    networks: tuple[_Network, ...]


def write_profile(inp: DeviceProfileInput) -> Profile:
    """The platform's profile for one device, with the negotiated suite in the platform's names.

    On-demand ``domains`` are written for Apple only: an ``EvaluateConnection`` rule that
    connects when one of them does not resolve outside the tunnel (Apple's rules cannot match a
    destination address, so ``remote_ts`` alone starts nothing; without domains the user connects
    by hand). Windows starts a connection for a DNS suffix only when the trigger names the
    suffix's DNS servers, which the input does not carry, and the strongSwan clients have no
    trigger: their profiles leave the domains out.

    Raises:
        InvalidInput: a field that cannot be used (the message names it).
        Inexpressible: the platform cannot say the suite; no profile is written.
    """
    if not isinstance(inp, DeviceProfileInput):
        raise InvalidInput(f"expected a DeviceProfileInput, not {type(inp).__name__}")
    checked = _check(inp)
    return _WRITERS[inp.platform](checked)


# --------------------------------------------------------------------------- input


def _check(inp: DeviceProfileInput) -> _Checked:
    """Every field checked (the suite first: an inexpressible suite is the answer that matters)."""
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
    return _Checked(inp=inp, suite=suite, stem=stem, ca=ca, device=device, networks=networks)


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


def _ca_file(checked: _Checked, suffix: str) -> str:
    return f"{checked.stem}-ca.{suffix}"


def _ca_der(checked: _Checked) -> bytes:
    return checked.ca.public_bytes(serialization.Encoding.DER)


def _ca_pem(checked: _Checked) -> bytes:
    return checked.ca.public_bytes(serialization.Encoding.PEM)


def _proposals(checked: _Checked) -> tuple[str, str]:
    """The IKE and ESP proposals of a strongSwan platform's suite."""
    proposals = checked.suite["strongswan"]
    return str(proposals["ike"]), str(proposals["esp"])


def _round_trip(ok: bool, platform: str, what: str) -> None:
    """The bug guard: a profile whose parse-back differs from what was meant is never handed out."""
    if not ok:
        raise RuntimeError(f"the {LABELS[platform]} profile does not read back as written: {what}")


# --------------------------------------------------------------------------- android


def _android(checked: _Checked) -> Profile:
    """The strongSwan app's ``.sswan`` JSON (docs.strongswan.org, "VPN Profile Import for the
    Android VPN Client"): certificate authentication, the CA and the PKCS#12 embedded (the app asks
    for the passphrase on import), the proposals, and the split tunnel's networks. The app has no
    lifetime setting: the gateway's rekeying governs."""
    inp = checked.inp
    ike, esp = _proposals(checked)
    document = {
        "uuid": inp.uuid.lower(),
        "name": inp.name,
        "type": "ikev2-cert",
        "remote": {"addr": inp.remote_address, "id": inp.remote_id,
                   "cert": base64.b64encode(_ca_der(checked)).decode("ascii")},
        "local": {"id": inp.local_id, "p12": base64.b64encode(inp.p12).decode("ascii")},
        "ike-proposal": ike,
        "esp-proposal": esp,
        "split-tunneling": {"subnets": [str(n) for n in checked.networks], "block-ipv4": False, "block-ipv6": False},
    }
    content = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    read = json.loads(content)
    _round_trip(read == document and base64.b64decode(read["local"]["p12"]) == inp.p12, "android", "JSON")
    return Profile(f"{checked.stem}.sswan", "application/vnd.strongswan.profile", content, MappingProxyType({}))


# --------------------------------------------------------------------------- apple

#: The key type of the device certificate, as Apple's CertificateType names it.
_APPLE_CURVES = {"secp256r1": "ECDSA256", "secp384r1": "ECDSA384", "secp521r1": "ECDSA521"}
_PBES2 = "1.2.840.113549.1.5.13"


def _apple(checked: _Checked) -> Profile:
    """An unsigned ``.mobileconfig`` (Apple Developer, Device Management: "VPN", "VPN.IKEv2",
    "PKCS12", "Root"): the PKCS#12 payload without its password (the device asks on install), the
    CA as a trusted root, and an IKEv2 VPN payload with certificate authentication, the suite as
    IKE and child SA parameters, PFS when the ESP proposal has a key exchange, and on-demand rules
    for the domains (see :func:`write_profile`).

    The CA is a "Root" payload because Apple's IKEv2 client evaluates the gateway's chain against
    the system's trust and Apple's reference has no payload that trusts a certificate for a VPN
    alone ("PKCS1" installs one without trust as an anchor). What narrows it is the CA certificate
    itself (its name constraints and purposes, which Apple enforces) and, on iOS and iPadOS, that a
    root from a profile the user installed is not trusted for TLS until they turn on full trust
    for it in Certificate Trust Settings; ``ServerCertificateIssuerCommonName`` pins the VPN to it."""
    inp = checked.inp
    certificate_type = _apple_certificate_type(checked)
    _apple_p12(inp.p12)
    identifier = f"qoss.device.{inp.uuid.lower()}"
    uuids = {part: str(uuid.uuid5(uuid.UUID(inp.uuid), part)).upper() for part in ("pkcs12", "root", "vpn")}
    pkcs12_payload = _apple_payload("com.apple.security.pkcs12", identifier, uuids["pkcs12"], "pkcs12",
                                    f"{inp.name}: device certificate",
                                    PayloadCertificateFileName=inp.p12_name, PayloadContent=inp.p12)
    root_payload = _apple_payload("com.apple.security.root", identifier, uuids["root"], "root",
                                  f"{inp.name}: CA {_common_name(checked.ca)}",
                                  PayloadCertificateFileName=_ca_file(checked, "cer"), PayloadContent=_ca_der(checked))
    vpn_payload = _apple_payload("com.apple.vpn.managed", identifier, uuids["vpn"], "vpn", inp.name,
                                 UserDefinedName=inp.name, VPNType="IKEv2",
                                 IKEv2=_apple_ikev2(checked, certificate_type, uuids["pkcs12"]))
    top = {
        "PayloadType": "Configuration",
        "PayloadVersion": 1,
        "PayloadIdentifier": identifier,
        "PayloadUUID": inp.uuid.upper(),
        "PayloadDisplayName": inp.name,
        "PayloadContent": [pkcs12_payload, root_payload, vpn_payload],
    }
    content = plistlib.dumps(top, fmt=plistlib.FMT_XML, sort_keys=True)
    _apple_read_back(content, top)
    return Profile(f"{checked.stem}.mobileconfig", "application/x-apple-aspen-config", content, MappingProxyType({}))


def _apple_payload(kind: str, identifier: str, payload_uuid: str, part: str, display: str,
                   **keys: object) -> dict[str, object]:
    return {"PayloadType": kind, "PayloadVersion": 1, "PayloadIdentifier": f"{identifier}.{part}",
            "PayloadUUID": payload_uuid, "PayloadDisplayName": display, **keys}


def _apple_ikev2(checked: _Checked, certificate_type: str, certificate_uuid: str) -> dict[str, object]:
    inp = checked.inp
    ikev2: dict[str, object] = {
        "RemoteAddress": inp.remote_address,
        "RemoteIdentifier": inp.remote_id,
        "LocalIdentifier": inp.local_id,
        "AuthenticationMethod": "Certificate",
        "CertificateType": certificate_type,
        "PayloadCertificateUUID": certificate_uuid,
        "ServerCertificateIssuerCommonName": _common_name(checked.ca),
        "ExtendedAuthEnabled": 0,
        "EnablePFS": int("DiffieHellmanGroup" in checked.suite["child"]),
        "IKESecurityAssociationParameters": checked.suite["ike"],
        "ChildSecurityAssociationParameters": checked.suite["child"],
        "IncludeAllNetworks": 0,
        "OnDemandEnabled": int(bool(inp.domains)),
    }
    if inp.domains:
        # A rule without match keys applies on every network; for each connection its ActionParameters
        # decide: these domains connect when they do not resolve outside the tunnel.
        ikev2["OnDemandRules"] = [{"Action": "EvaluateConnection", "ActionParameters": [
            {"Domains": list(inp.domains), "DomainAction": "ConnectIfNeeded"}]}]
    return ikev2


def _apple_certificate_type(checked: _Checked) -> str:
    """Apple's CertificateType for the device certificate, once LocalIdentifier is known to be
    one of its subjectAltNames (Apple's client sends a DN as an FQDN identity, which then matches
    nothing: docs.strongswan.org, "Apple IKEv2 Configuration Profile", known issues)."""
    inp, device = checked.inp, checked.device
    if "=" in inp.local_id:
        raise InvalidInput(f"local_id: {LABELS['apple']} sends its identity as an FQDN, e-mail or IP address, "
                           f"never as a distinguished name like {inp.local_id[:64]!r}; use a subjectAltName "
                           "of the device certificate")
    if device is None:
        raise InvalidInput("device_cert_der: an Apple profile names the device certificate's key type "
                           "(CertificateType), so it needs the device certificate")
    if inp.local_id not in _subject_alt_names(device):
        raise InvalidInput(f"local_id: {inp.local_id[:64]!r} is not a subjectAltName of the device certificate")
    key = device.public_key()
    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in _APPLE_CURVES:
        return _APPLE_CURVES[key.curve.name]
    raise InvalidInput(f"device_cert_der: {LABELS['apple']} authenticates with RSA or ECDSA P-256/384/521 keys only")


def _subject_alt_names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {*san.get_values_for_type(x509.DNSName), *san.get_values_for_type(x509.RFC822Name),
            *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}


def _apple_p12(p12: bytes) -> None:
    """Refuse a PKCS#12 Apple's clients cannot open: they take the legacy PKCS#12 encryption
    (3DES/RC2 with SHA-1) only, not PBES2 (docs.strongswan.org, "Apple IKEv2 Configuration
    Profile", known issues). The algorithms are read from the file's unencrypted structure."""
    oids = _der_oids(p12)
    if oids is None:
        raise InvalidInput("p12: not a DER-encoded PKCS#12 file, so its encryption cannot be checked")
    if _PBES2 in oids:
        raise InvalidInput(f"p12: {LABELS['apple']} opens PKCS#12 files with the legacy encryption only "
                           "(pbeWithSHA1And3-KeyTripleDES-CBC, SHA-1 MAC); this one uses PBES2")


def _apple_read_back(content: bytes, top: dict[str, object]) -> None:
    read = plistlib.loads(content)
    _round_trip(read == top, "apple", "plist")
    ikev2 = read["PayloadContent"][2]["IKEv2"]
    check_names("apple", {"ike": ikev2["IKESecurityAssociationParameters"],
                          "child": ikev2["ChildSecurityAssociationParameters"]})


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    text = value if isinstance(value, str) else value.decode("utf-8", "replace")
    if not text or not text.isprintable():
        raise InvalidInput("ca_cert_der: the CA certificate needs a printable common name "
                           "(Apple's ServerCertificateIssuerCommonName)")
    return text


# --------------------------------------------------------------------------- windows

_PS_SET = re.compile(r"^Set-VpnConnectionIPsecConfiguration -ConnectionName \$Name((?: -\w+ \w+)+) -Force$", re.M)
_PS_NAME = re.compile(r"^\$Name = '((?:[^']|'')*)'$", re.M)
_PS_ROUTE = re.compile(r"^Add-VpnConnectionRoute -ConnectionName \$Name -DestinationPrefix '([^']*)'$", re.M)


def _windows(checked: _Checked) -> Profile:
    """A PowerShell script for the built-in client (Microsoft Learn, VpnClient and PKI modules),
    run as administrator beside its two files: the CA into ``LocalMachine\\Root`` (Windows' IKEv2
    client with machine certificates checks the gateway's chain in the computer's Trusted Root
    Certification Authorities and in no narrower store; the CA's name constraints and purposes,
    which Windows enforces down the chain, keep it to this VPN's names and to authentication), the PKCS#12 into
    ``LocalMachine\\My`` (it asks for the passphrase), the connection (machine certificate, split
    tunnel, one route per network), and the suite with ``Set-VpnConnectionIPsecConfiguration``.
    Windows has no lifetime setting and takes no remote identity: it checks the gateway's
    certificate against the server address. The script is UTF-8 with a byte order mark (Windows
    PowerShell 5.1 reads a file without one in the ANSI code page) and CRLF line ends."""
    inp = checked.inp
    ipsec = checked.suite["ipsec"]
    p12_file, ca_file = inp.p12_name, _ca_file(checked, "cer")
    lines = [
        "#Requires -RunAsAdministrator",
        f"# {inp.name}: {LABELS['windows']} profile. Run it as administrator from the folder that",
        f"# holds {p12_file} and {ca_file}; it asks for the PKCS#12 passphrase.",
        "# Windows has no setting for the IKE SA and CHILD_SA lifetimes: the gateway rekeys them",
        f"# (IKE SA every {inp.ike_lifetime} s, CHILD_SA every {inp.child_lifetime} s).",
        "$ErrorActionPreference = 'Stop'",
        f"$Name = {_ps(inp.name, 'name')}",
        "# Windows checks the gateway's certificate against the computer's trusted roots only, so the",
        "# CA goes there; its name constraints and purposes limit it to this VPN's names and to TLS and",
        "# IKE authentication (no code signing, no other site).",
        f"Import-Certificate -FilePath (Join-Path $PSScriptRoot {_ps(ca_file, 'ca file')}) "
        "-CertStoreLocation 'Cert:\\LocalMachine\\Root' | Out-Null",
        f"Import-PfxCertificate -FilePath (Join-Path $PSScriptRoot {_ps(p12_file, 'p12_name')}) "
        "-CertStoreLocation 'Cert:\\LocalMachine\\My' "
        "-Password (Read-Host -AsSecureString -Prompt 'PKCS#12 passphrase') | Out-Null",
        "if (Get-VpnConnection -Name $Name -ErrorAction SilentlyContinue) { Remove-VpnConnection -Name $Name -Force }",
        f"Add-VpnConnection -Name $Name -ServerAddress {_ps(inp.remote_address, 'remote_address')} -TunnelType Ikev2 "
        "-AuthenticationMethod MachineCertificate -EncryptionLevel Required -SplitTunneling -Force",
        "Set-VpnConnectionIPsecConfiguration -ConnectionName $Name"
        + "".join(f" -{parameter} {value}" for parameter, value in ipsec.items()) + " -Force",
        *(f"Add-VpnConnectionRoute -ConnectionName $Name -DestinationPrefix '{n}'" for n in checked.networks),
    ]
    if inp.domains:
        lines += ["# Not started on demand: Windows starts a connection for a DNS suffix only when the trigger",
                  "# names the suffix's DNS servers (Add-VpnConnectionTriggerDnsConfiguration -DnsIPAddress)."]
    content = b"\xef\xbb\xbf" + ("\r\n".join(lines) + "\r\n").encode("utf-8")
    _windows_read_back(content, checked)
    files = {p12_file: inp.p12, ca_file: _ca_der(checked)}
    return Profile(f"{checked.stem}.ps1", _TEXT, content, MappingProxyType(files))


def _ps(value: str, field: str) -> str:
    """A single-quoted PowerShell string: nothing in it is expanded; an apostrophe is doubled."""
    if any(quote in value for quote in _PS_QUOTES):
        raise InvalidInput(f"{field}: {value[:64]!r} holds a typographic quote, which PowerShell reads as a quote")
    return "'" + value.replace("'", "''") + "'"


def _windows_read_back(content: bytes, checked: _Checked) -> None:
    text = content.decode("utf-8-sig").replace("\r\n", "\n")
    _round_trip(content.startswith(b"\xef\xbb\xbf") and "\r" not in text, "windows", "encoding and line ends")
    name = _PS_NAME.search(text)
    sets = _PS_SET.findall(text)
    _round_trip(name is not None and name.group(1).replace("''", "'") == checked.inp.name and len(sets) == 1,
                "windows", "connection name")
    pairs = re.findall(r" -(\w+) (\w+)", sets[0])
    params = dict(pairs)
    _round_trip(len(params) == len(pairs) and params == checked.suite["ipsec"], "windows", "IPsec parameters")
    check_names("windows", {"ipsec": params})
    _round_trip(_PS_ROUTE.findall(text) == [str(n) for n in checked.networks], "windows", "routes")


# --------------------------------------------------------------------------- networkmanager

#: Where the keyfile expects the CA, the device certificate and its key (see the file's comments).
NM_DIRECTORY = PurePosixPath("/etc/NetworkManager/qoss")


def _networkmanager(checked: _Checked) -> Profile:
    """A NetworkManager keyfile for the strongSwan plugin (charon-nm, strongSwan 5.9.0 or later for
    ``remote-ts``). The plugin reads the device certificate (``usercert``, X.509 only) and its key
    (``userkey``) from separate files and cannot open a PKCS#12 file, so the keyfile names the two
    files the commands in its header unpack from the PKCS#12 (openssl asks for the passphrase, then
    for a new one for the key, which NetworkManager asks for when connecting). All under
    ``/etc/NetworkManager/qoss/<name>/``. The plugin has no lifetime setting: the gateway's
    rekeying governs."""
    inp = checked.inp
    for field in ("name", "remote_id", "local_id"):
        if "\\" in getattr(inp, field):
            raise InvalidInput(f"{field}: a keyfile reads a backslash as an escape")
    directory = NM_DIRECTORY / checked.stem
    ca_file = _ca_file(checked, "pem")
    key_stem = inp.p12_name.rsplit(".", 1)[0]
    cert_path, key_path = directory / f"{key_stem}.crt", directory / f"{key_stem}.key"
    ike, esp = _proposals(checked)
    keyfile = _keyfile()
    keyfile["connection"] = {"id": inp.name, "uuid": inp.uuid.lower(), "type": "vpn", "autoconnect": "false"}
    keyfile["vpn"] = {
        "service-type": "org.freedesktop.NetworkManager.strongswan",
        "address": inp.remote_address,
        "certificate": str(directory / ca_file),
        "remote-identity": inp.remote_id,
        "local-identity": inp.local_id,
        "method": "cert",
        "cert-source": "file",
        "usercert": str(cert_path),
        "userkey": str(key_path),
        "password-flags": "1",
        "virtual": "yes",
        "encap": "no",
        "ipcomp": "no",
        "proposal": "yes",
        "ike": ike,
        "esp": esp,
        "remote-ts": ";".join(str(n) for n in checked.networks),
    }
    for section, version in (("ipv4", 4), ("ipv6", 6)):
        routes = [n for n in checked.networks if n.version == version]
        keyfile[section] = {"method": "auto", "never-default": "true",
                            **{f"route{i}": str(n) for i, n in enumerate(routes, start=1)}}
    header = [
        f"# {inp.name}: {LABELS['networkmanager']} (strongSwan 5.9.0 or later).",
        "# The plugin cannot open a PKCS#12 file: unpack the device certificate and its key once, as root,",
        "# in the folder that holds this file (openssl asks for the PKCS#12 passphrase, then for a new one",
        "# for the key, which NetworkManager asks for when connecting):",
        f"#   install -d -m 0700 {shlex.quote(str(directory))}",
        f"#   install -m 0644 {shlex.quote(ca_file)} {shlex.quote(str(directory))}/",
        f"#   openssl pkcs12 -in {shlex.quote(inp.p12_name)} -clcerts -nokeys -out {shlex.quote(str(cert_path))}",
        f"#   openssl pkcs12 -in {shlex.quote(inp.p12_name)} -nocerts -out {shlex.quote(str(key_path))}",
        f"#   install -m 0600 {shlex.quote(checked.stem)}.nmconnection /etc/NetworkManager/system-connections/",
        "#   nmcli connection reload",
    ]
    body = _write_keyfile(keyfile)
    text = "\n".join(header) + "\n" + body
    _networkmanager_read_back(text, keyfile)
    files = {inp.p12_name: inp.p12, ca_file: _ca_pem(checked)}
    return Profile(f"{checked.stem}.nmconnection", _TEXT, text.encode("utf-8"), MappingProxyType(files))


def _keyfile() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=("#",),
                                       inline_comment_prefixes=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # NetworkManager's keys are case-sensitive
    return parser


def _write_keyfile(keyfile: configparser.ConfigParser) -> str:
    out = io.StringIO()
    keyfile.write(out, space_around_delimiters=False)
    return out.getvalue()


def _networkmanager_read_back(text: str, keyfile: configparser.ConfigParser) -> None:
    read = _keyfile()
    read.read_string(text)
    same = {s: dict(read[s]) for s in read.sections()} == {s: dict(keyfile[s]) for s in keyfile.sections()}
    _round_trip(same, "networkmanager", "keyfile")


# --------------------------------------------------------------------------- swanctl


def _swanctl(checked: _Checked) -> Profile:
    """A swanctl.conf road warrior (strongSwan's swanctl.conf(5)): a virtual IP, the proposals and
    lifetimes, public-key authentication both ways. ``local`` names only the identity: charon
    takes the certificate for it, and its key, from the PKCS#12 that ``swanctl --load-creds`` loads
    from ``/etc/swanctl/pkcs12/`` (asking for the passphrase, which is why the file has no
    ``secrets`` section). ``remote`` trusts the CA file in ``/etc/swanctl/x509ca/``. The header
    also shows the same connection with charon-cmd."""
    inp = checked.inp
    name = checked.stem
    ca_file = _ca_file(checked, "pem")
    ike, esp = _proposals(checked)
    vips = ",".join(vip for vip, version in (("0.0.0.0", 4), ("::", 6))  # noqa: S104 - asks for any virtual IP
                    if any(n.version == version for n in checked.networks))
    conn: dict[str, object] = {
        "version": "2",
        "remote_addrs": inp.remote_address,
        "vips": vips,
        "proposals": ike,
        "rekey_time": f"{inp.ike_lifetime}s",
        "local": {"auth": "pubkey", "id": inp.local_id},
        "remote": {"auth": "pubkey", "id": inp.remote_id, "cacerts": ca_file},
        "children": {name: {
            "remote_ts": ",".join(str(n) for n in checked.networks),
            "esp_proposals": esp,
            "rekey_time": f"{inp.child_lifetime}s",
            "life_time": f"{inp.child_lifetime + inp.child_lifetime // 10}s",
            "start_action": "none",
        }},
    }
    document = {"connections": {name: conn}}
    charon_cmd = shlex.join([
        "charon-cmd", "--host", inp.remote_address, "--identity", inp.local_id, "--remote-identity", inp.remote_id,
        "--cert", ca_file, "--p12", inp.p12_name, "--ike-proposal", ike,
        "--esp-proposal", esp, *(a for n in checked.networks for a in ("--remote-ts", str(n))),
        "--profile", "ikev2-pub"])
    header = [
        f"# {inp.name}: {LABELS['swanctl']} profile.",
        f"# Put {inp.p12_name} into /etc/swanctl/pkcs12/, {ca_file} into /etc/swanctl/x509ca/ and this file",
        "# into /etc/swanctl/conf.d/, then run `swanctl --load-all` (it asks for the PKCS#12 passphrase)",
        f"# and `swanctl --initiate --child {name}`. With charon-cmd instead, in the folder of the files:",
        f"#   {charon_cmd}",
    ]
    text = "\n".join(header) + "\n" + "".join(_swanctl_section(k, v, 0) for k, v in document.items())
    _round_trip(parse_swanctl(text) == document, "swanctl", "swanctl.conf")
    files = {inp.p12_name: inp.p12, ca_file: _ca_pem(checked)}
    return Profile(f"{name}.conf", _TEXT, text.encode("utf-8"), MappingProxyType(files))


def _swanctl_section(name: str, body: object, depth: int) -> str:
    indent = "    " * depth
    if isinstance(body, dict):
        inner = "".join(_swanctl_section(k, v, depth + 1) for k, v in body.items())
        return f"{indent}{name} {{\n{inner}{indent}}}\n"
    return f"{indent}{name} = {_swanctl_quote(str(body))}\n"


def _swanctl_quote(value: str) -> str:
    """A quoted swanctl.conf value: a backslash and a double quote are escaped with a backslash."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SWANCTL_TOKEN = re.compile(r'[ \t\r]*(?:#[^\n]*|([{}=\n])|"((?:[^"\\\n]|\\.)*)"|([^\s#{}="]+))')


def parse_swanctl(text: str) -> dict[str, object]:
    """Read the subset of swanctl.conf that :func:`write_profile` writes: nested ``name { ... }``
    sections and ``key = value`` lines, values bare or double-quoted (with backslash escapes),
    ``#`` comments.

    Raises:
        ValueError: text outside that subset.
    """
    tokens = _swanctl_tokens(text)
    document, end = _swanctl_body(tokens, 0)
    if end != len(tokens):
        raise ValueError("swanctl.conf: a '}' closes no section")
    return document


def _swanctl_tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        match = _SWANCTL_TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"swanctl.conf: cannot read {text[pos:pos + 20]!r}")
            break
        punct, quoted, bare = match.groups()
        if punct is not None:
            tokens.append(("punct", punct))
        elif quoted is not None:
            tokens.append(("value", re.sub(r"\\(.)", r"\1", quoted)))
        elif bare is not None:
            tokens.append(("value", bare))
        pos = match.end()
    return tokens


def _swanctl_body(tokens: list[tuple[str, str]], pos: int) -> tuple[dict[str, object], int]:
    body: dict[str, object] = {}
    while pos < len(tokens):
        kind, value = tokens[pos]
        if (kind, value) == ("punct", "\n"):
            pos += 1
            continue
        if (kind, value) == ("punct", "}"):
            return body, pos
        if kind != "value" or pos + 1 >= len(tokens):
            raise ValueError(f"swanctl.conf: expected a name, found {value!r}")
        follow = tokens[pos + 1]
        if follow == ("punct", "{"):
            inner, pos = _swanctl_body(tokens, pos + 2)
            if pos >= len(tokens) or tokens[pos] != ("punct", "}"):
                raise ValueError(f"swanctl.conf: section {value!r} is not closed")
            body[value] = inner
            pos += 1
        elif follow == ("punct", "="):
            pos += 2
            words: list[str] = []  # a value runs to the end of its line
            while pos < len(tokens) and tokens[pos][0] == "value":
                words.append(tokens[pos][1])
                pos += 1
            body[value] = " ".join(words)
        else:
            raise ValueError(f"swanctl.conf: expected '{{' or '=' after {value!r}")
    return body, pos


# --------------------------------------------------------------------------- DER (the PKCS#12 check)


def _der_oids(data: bytes) -> set[str] | None:
    """The object identifiers in a DER structure, looking into constructed values and into OCTET
    STRINGs that hold DER (encrypted content does not parse and stays opaque); None if ``data``
    is not one DER value."""
    oids: set[str] = set()
    parsed = _tlv(data, 0)
    if parsed is None or parsed[2] != len(data) or not _der_walk(data, oids, 0):
        return None
    return oids


def _der_walk(data: bytes, oids: set[str], depth: int) -> bool:
    """Collect the OIDs of a run of DER values into ``oids``; False (and nothing collected) if
    ``data`` is not exactly such a run."""
    if depth > 24:
        return False
    found: set[str] = set()
    pos = 0
    while pos < len(data):
        parsed = _tlv(data, pos)
        if parsed is None:
            return False
        tag, start, end = parsed
        content = data[start:end]
        if tag & 0x20:
            if not _der_walk(content, found, depth + 1):
                return False
        elif tag == 0x06:
            found.add(_oid(content))
        elif tag in (0x04, 0x80):  # OCTET STRING, or [0] IMPLICIT OCTET STRING: maybe DER inside
            _der_walk(content, found, depth + 1)
        pos = end
    oids |= found
    return True


def _tlv(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """(tag, content start, content end) of the DER value at ``pos``, or None."""
    if pos + 2 > len(data) or data[pos] & 0x1F == 0x1F:  # high tag numbers do not occur in PKCS#12
        return None
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 0 < count <= 4 or pos + count > len(data):
            return None
        length = int.from_bytes(data[pos:pos + count], "big")
        pos += count
    if pos + length > len(data):
        return None
    return tag, pos, pos + length


def _oid(content: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs:
        return ""
    first = min(arcs[0] // 40, 2)
    return ".".join(str(arc) for arc in (first, arcs[0] - 40 * first, *arcs[1:]))


_WRITERS: Mapping[str, Callable[[_Checked], Profile]] = MappingProxyType({
    "android": _android,
    "apple": _apple,
    "windows": _windows,
    "networkmanager": _networkmanager,
    "swanctl": _swanctl,
})
