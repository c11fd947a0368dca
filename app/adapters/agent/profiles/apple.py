"""Apple's profile: an unsigned ``.mobileconfig`` for the built-in IKEv2 client of iOS, iPadOS and macOS."""

from __future__ import annotations

import plistlib
import uuid

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from app.adapters.agent.profiles.common import Checked, Profile, ca_der, ca_file_name, profile, round_trip
from app.domain.agent.platforms import LABELS, check_names
from app.domain.errors import InvalidInput

__all__ = ["write"]


#: The key type of the device certificate, as Apple's CertificateType names it.
_APPLE_CURVES = {"secp256r1": "ECDSA256", "secp384r1": "ECDSA384", "secp521r1": "ECDSA521"}
_PBES2 = "1.2.840.113549.1.5.13"


def write(checked: Checked) -> Profile:
    """An unsigned ``.mobileconfig`` (Apple Developer, Device Management: "VPN", "VPN.IKEv2",
    "PKCS12", "Root"): the PKCS#12 payload without its password (the device asks on install), the
    CA as a trusted root, and an IKEv2 VPN payload with certificate authentication, the suite as
    IKE and child SA parameters, PFS when the ESP proposal has a key exchange, and on-demand rules
    for the domains (see :func:`app.adapters.agent.profiles.write_profile`).

    The CA is a "Root" payload because Apple's IKEv2 client evaluates the gateway's chain against
    the system's trust and Apple's reference has no payload that trusts a certificate for a VPN
    alone ("PKCS1" installs one without trust as an anchor). What narrows it is the CA certificate
    itself (its name constraints and purposes, which Apple enforces) and, on iOS and iPadOS, that a
    root from a profile the user installed is not trusted for TLS until they turn on full trust
    for it in Certificate Trust Settings; ``ServerCertificateIssuerCommonName`` pins the VPN to it.

    With a PPK (RFC 8784) the IKEv2 payload also has ``PPK`` (the key, data), ``PPKIdentifier``
    and ``PPKMandatory`` = 1 (iOS 18, iPadOS 18, macOS 15: the client connects only if the gateway
    takes that PPK). Unlike the device's key, which is inside the PKCS#12 under its passphrase, the
    PPK is a plain value of the profile: an unsigned, unencrypted ``.mobileconfig`` can only be
    encrypted to a certificate the device already holds. What protects it is what protects the
    whole profile on its way: sealed end to end to the user, written readable by the user alone,
    sealed again for a link; once installed the device keeps it in its keychain."""
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
                                  PayloadCertificateFileName=ca_file_name(checked), PayloadContent=ca_der(checked))
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
    return profile(checked, content)


def _apple_payload(kind: str, identifier: str, payload_uuid: str, part: str, display: str,
                   **keys: object) -> dict[str, object]:
    return {"PayloadType": kind, "PayloadVersion": 1, "PayloadIdentifier": f"{identifier}.{part}",
            "PayloadUUID": payload_uuid, "PayloadDisplayName": display, **keys}


def _apple_ikev2(checked: Checked, certificate_type: str, certificate_uuid: str) -> dict[str, object]:
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
    if inp.ppk is not None and inp.ppk_id is not None:
        ikev2.update({"PPK": inp.ppk, "PPKIdentifier": inp.ppk_id, "PPKMandatory": 1})
    if inp.domains:
        # A rule without match keys applies on every network; for each connection its ActionParameters
        # decide: these domains connect when they do not resolve outside the tunnel.
        ikev2["OnDemandRules"] = [{"Action": "EvaluateConnection", "ActionParameters": [
            {"Domains": list(inp.domains), "DomainAction": "ConnectIfNeeded"}]}]
    return ikev2


def _apple_certificate_type(checked: Checked) -> str:
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
    round_trip(read == top, "apple", "plist")
    ikev2 = read["PayloadContent"][2]["IKEv2"]
    round_trip(("PPK" in ikev2) == ("PPKIdentifier" in ikev2) == ("PPKMandatory" in ikev2)
               and ikev2.get("PPKMandatory", 1) == 1, "apple", "PPK, PPKIdentifier and PPKMandatory")
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
