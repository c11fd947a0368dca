"""The device CA's certificates, field by field: what a new CA's name constraints permit, what
they leave outside, the names a certificate may carry, keys in PEM, the one-time passphrase.

Errors::

    InvalidInput (ValueError)     an owner, identity or address that cannot be used (app.domain.errors)
    ValueError                    a key that is not ECDSA P-256, a clock without a time zone
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.domain.agent.conns import DEVICE_NAMESPACE
from app.domain.errors import InvalidInput

__all__ = ["MAX_CN", "MAX_OWNER", "Address", "aware", "builder", "ca_common_name", "check_addresses",
           "check_gateway_identity", "check_name", "common_name", "constraints_of", "is_dns_name", "key_pem",
           "key_usage", "matches", "name_constraints", "outside", "parse_key", "passphrase"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_CN = 64  # X.520 ub-common-name
MAX_OWNER = 63  # a party id's limit
_CA_NAME = "qoss {owner} device CA"
_OWNER_IN_CN = MAX_CN - len(_CA_NAME.format(owner=""))  # 49: a longer owner is cut to fit, marked with "~"

#: No 0/O/1/l/I (nor o, i's nearest look-alikes gone with them): 32 symbols, 5 bits each, easy on a phone.
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"
_PASSPHRASE_GROUPS, _GROUP = 6, 4  # 24 symbols: 120 bits

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


# --------------------------------------------------------------------------- name constraints


def name_constraints(gateway: Sequence[str]) -> x509.NameConstraints:
    """What a new CA permits: DNS names under the device namespace, the gateway's DNS names and
    exactly its addresses; with no address of a family, every address of that family excluded
    (a permitted subtree of one family does not constrain the other in every verifier)."""
    if isinstance(gateway, str | bytes):
        raise InvalidInput("gateway is a list of names and addresses, not one string")
    names: dict[str, None] = {DEVICE_NAMESPACE: None}
    ips: dict[Address, None] = {}
    for entry in gateway:
        value = check_gateway_identity(entry)
        with contextlib.suppress(ValueError):
            ips[ipaddress.ip_address(value)] = None
            continue
        if is_dns_name(value):
            names[value.lower()] = None
    permitted: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    permitted += [x509.IPAddress(ipaddress.ip_network(ip)) for ip in ips]
    families = {ip.version for ip in ips}
    excluded: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_network(net)) for version, net in
                                        ((4, "0.0.0.0/0"), (6, "::/0")) if version not in families]
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded or None)


def constraints_of(cert: x509.Certificate) -> x509.NameConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None


def outside(constraints: x509.NameConstraints | None, *, dns: Sequence[str], ips: Sequence[Address]) -> list[str]:
    """The names and addresses ``constraints`` do not permit (RFC 5280 4.2.1.10: a DNS name is
    within a subtree when it is the subtree's name or ends in ``.`` and that name)."""
    if constraints is None:
        return []
    permitted = list(constraints.permitted_subtrees or ())
    excluded = list(constraints.excluded_subtrees or ())

    def dns_within(name: str, trees: list[x509.GeneralName]) -> bool:
        name = name.lower().rstrip(".")
        return any(name == t.value.lower() or name.endswith("." + t.value.lower().lstrip("."))
                   for t in trees if isinstance(t, x509.DNSName))

    def ip_within(ip: Address, trees: list[x509.GeneralName]) -> bool:
        return any(isinstance(t.value, ipaddress.IPv4Network | ipaddress.IPv6Network)
                   and t.value.version == ip.version and ip in t.value
                   for t in trees if isinstance(t, x509.IPAddress))

    dns_limited = any(isinstance(t, x509.DNSName) for t in permitted)
    ip_limited = any(isinstance(t, x509.IPAddress) for t in permitted)
    return ([name for name in dns if dns_within(name, excluded) or (dns_limited and not dns_within(name, permitted))]
            + [str(ip) for ip in ips if ip_within(ip, excluded) or (ip_limited and not ip_within(ip, permitted))])


# --------------------------------------------------------------------------- certificates


def ca_common_name(owner: str) -> str:
    return _CA_NAME.format(owner=owner if len(owner) <= _OWNER_IN_CN else owner[:_OWNER_IN_CN - 1] + "~")


def builder(identity: str, key: ec.EllipticCurvePrivateKey, *, not_before: datetime,
             not_after: datetime) -> x509.CertificateBuilder:
    public = key.public_key()
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))


def key_usage(*, digital_signature: bool = False, key_cert_sign: bool = False,
               crl_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=digital_signature, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
                         crl_sign=crl_sign, encipher_only=False, decipher_only=False)


def common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def parse_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """An ECDSA P-256 private key from PEM.

    Raises:
        ValueError: anything else.
    """
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("not an ECDSA P-256 key")
    return key


def matches(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def passphrase() -> str:
    symbols = "".join(secrets.choice(_ALPHABET) for _ in range(_PASSPHRASE_GROUPS * _GROUP))
    return "-".join(symbols[i:i + _GROUP] for i in range(0, len(symbols), _GROUP))


def aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("the CA's clock must give aware datetimes")
    return now.astimezone(UTC).replace(microsecond=0)


# --------------------------------------------------------------------------- input


def check_name(value: str, *, what: str, limit: int) -> str:
    """An owner or device identity: safe in a DN and in a strongSwan identity string as it stands."""
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not _NAME.fullmatch(value):
        raise InvalidInput(f"an {what} is 1-{limit} of letters, digits, '.', '_', '-', starting with a letter or "
                           f"digit (no spaces, commas, '=', '+', quotes or control characters), not {value!r:.80}")
    return value


def check_gateway_identity(identity: str) -> str:
    if isinstance(identity, str) and len(identity) <= MAX_CN:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(identity))
    return check_name(identity, what="identity", limit=MAX_CN)


def check_addresses(addresses: Sequence[str]) -> tuple[Address, ...]:
    if isinstance(addresses, str | bytes):
        raise InvalidInput("addresses is a list of IP addresses, not one string")
    ips: dict[Address, None] = {}
    for address in addresses:
        try:
            ips[ipaddress.ip_address(address)] = None
        except ValueError:
            raise InvalidInput(f"not an IP address: {address!r:.80}") from None
    return tuple(ips)


def is_dns_name(value: str) -> bool:
    """A host name a certificate may carry as dNSName (LDH labels, the last not all digits)."""
    labels = value.split(".")
    return (len(value) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit())

