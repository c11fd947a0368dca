"""A Target's own CA: the gateway's certificate and short-lived device credentials.

Phones and laptops with stock IKEv2 clients (the strongSwan app, Apple, Windows,
NetworkManager, charon-cmd) authenticate to a Target's charon with a certificate this CA
issued. The CA is one ECDSA P-256 key and its self-signed certificate, kept in a directory of
the Target's: ``device-ca.key`` (0600) and ``device-ca.crt`` (0644), beside the gateway's own
``device-gateway.key`` (0600) and ``device-gateway.crt``. A device's private key never touches
the disk: it leaves only inside the PKCS#12 file handed out, encrypted with a one-time
passphrase that is shown once and never kept.

Devices install the CA as a trust anchor, so the CA vouches for as little as IKE needs: its
certificate carries name constraints (DNS names under
:data:`~app.domain.agent.conns.DEVICE_NAMESPACE` and the gateway's own names and addresses,
nothing else) and an extended key usage that limits every certificate below it to TLS
server/client authentication and the IKE purposes. Whoever holds its key can still mint a
certificate only for the gateway's own names or for a device name that resolves nowhere, and no
code-signing or e-mail certificate. A CA made before it carried these limits is still loaded
(:attr:`DeviceCA.constrained` is False): enrolled devices keep working until it is replaced
(docs/agent.md, "Rotating the device CA").

Every file is opened relative to the open directory, without following links; a key file
anyone else may read or write is refused, never used. The first process to make the CA wins
(the key is created with ``O_CREAT|O_EXCL``, the certificate written whole and renamed into
place); any other process making it at the same moment loads the winner's. The gateway's
files are renewed under a lock on the directory, so two processes never mix their halves.

Errors::

    DeviceCAError (ValueError)    a file that cannot be used: a link, open to others, not ours,
                                  a key that does not match its certificate, another owner's CA
    InvalidInput (ValueError)     an owner, identity, address, name or lifetime that cannot be
                                  used (app.domain.errors)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from app.domain.agent.conns import DEVICE_NAMESPACE
from app.domain.errors import InvalidInput

__all__ = ["DeviceCA", "DeviceCAError", "DeviceCredential", "GatewayCredential"]

CA_KEY = "device-ca.key"
CA_CERT = "device-ca.crt"
GATEWAY_KEY = "device-gateway.key"
GATEWAY_CERT = "device-gateway.crt"

#: The "IP security IKE intermediate" purpose (RFC 4945 names it; Windows and macOS want it).
IKE_INTERMEDIATE = ObjectIdentifier("1.3.6.1.5.5.8.2.2")
#: What the CA may vouch for, as an extended key usage in the CA certificate itself. RFC 5280
#: defines the extension for end entities; Windows (its "EKU chaining"), Apple's trust evaluation
#: and OpenSSL read it in a CA as the purposes every certificate below may have. TLS server and
#: client authentication (Windows' IKEv2 client wants serverAuth in the gateway's certificate),
#: ipsecIKE (RFC 4945) and IKE intermediate: no code signing, e-mail, time stamping or OCSP.
CA_PURPOSES = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.IPSEC_IKE,
               IKE_INTERMEDIATE)

_CA_LIFETIME = timedelta(days=3653)  # ten years, leap days included
_GATEWAY_LIFETIME = timedelta(days=365)
_GATEWAY_RENEW = timedelta(days=30)  # a gateway certificate with less left is made again
_BACKDATE = timedelta(minutes=5)  # a device whose clock runs a little behind still accepts a fresh certificate
_DEVICE_LIFETIME = range(3600, 90 * 86400 + 1)  # seconds: an hour to 90 days
_MAX_CN = 64  # X.520 ub-common-name
_CA_NAME = "qoss {owner} device CA"
_MAX_OWNER = 63  # a party id's limit
_OWNER_IN_CN = _MAX_CN - len(_CA_NAME.format(owner=""))  # 49: a longer owner is cut to fit, marked with "~"

#: No 0/O/1/l/I (nor o, i's nearest look-alikes gone with them): 32 symbols, 5 bits each, easy on a phone.
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"
_PASSPHRASE_GROUPS, _GROUP = 6, 4  # 24 symbols: 120 bits
#: PBKDF2 rounds of the PKCS#12 encryption. The passphrase carries 120 bits, so the rounds are a
#: margin, not the defence; kept modest so a phone opens the file at once.
_KDF_ROUNDS = 100_000

#: How long a CA key file may stay incomplete (no certificate yet) before it counts as the
#: leftover of a creation that died rather than one still under way in another process.
_SETTLE = 5.0
_POLL = 0.02

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class DeviceCAError(ValueError):
    """A file of the CA's directory cannot be used: a link, not a regular file, not the
    service's own, open to other users, a key that does not match its certificate, or the
    CA of another owner. Never repaired by qoss: the message says what to do."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True, slots=True)
class DeviceCredential:
    """What a device is handed once: its PKCS#12 file and the passphrase that opens it.

    Attributes:
        p12: PKCS#12 with the device's key, its certificate and the CA certificate, encrypted
            with ``passphrase`` (PBES2, AES-256-CBC, HMAC-SHA256).
        passphrase: the one-time passphrase (``xxxx-xxxx-xxxx-xxxx-xxxx-xxxx``): show it once,
            never store it.
        cert_der: the device certificate (DER).
        serial: its serial number.
        not_after: when it expires (aware, UTC).
    """

    p12: bytes
    passphrase: str
    cert_der: bytes
    serial: int
    not_after: datetime

    def __repr__(self) -> str:
        return f"DeviceCredential(serial={self.serial:#x}, not_after={self.not_after.isoformat()})"


@dataclass(frozen=True, slots=True)
class GatewayCredential:
    """The gateway's certificate and private key, for charon (``load-cert``, ``load-key``).

    Attributes:
        cert_der: the gateway certificate (DER).
        key_der: its private key, PKCS#8 DER.
        key_type: the key's type as VICI's ``load-key`` names it (``"ecdsa"``).
    """

    cert_der: bytes
    key_der: bytes
    key_type: str

    def __repr__(self) -> str:
        try:
            subject = x509.load_der_x509_certificate(self.cert_der).subject.rfc4514_string()
        except ValueError:
            subject = "?"
        return f"GatewayCredential(subject={subject!r}, key_type={self.key_type!r})"


# --------------------------------------------------------------------------- the CA


class DeviceCA:
    """One Target's CA, loaded from (or made in) its directory by :meth:`load_or_create`.

    Holds the CA's private key in memory; never printed.
    """

    __slots__ = ("_cert", "_clock", "_directory", "_key")

    def __init__(self, *, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate,
                 clock: Callable[[], datetime]) -> None:
        self._directory = directory
        self._key = key
        self._cert = cert
        self._clock = clock

    def __repr__(self) -> str:
        return f"DeviceCA({self.common_name!r}, directory={str(self._directory)!r})"

    @classmethod
    def load_or_create(cls, directory: Path, *, owner: str, gateway: Sequence[str] = (),
                       clock: Callable[[], datetime] = _utc_now) -> DeviceCA:
        """The CA of Target ``owner`` kept in ``directory``, made there on first use.

        The CA is ECDSA P-256, self-signed, ``CN=qoss <owner> device CA``, ``CA:true``
        with path length 0, key usage keyCertSign and cRLSign, valid ten years; name constraints
        (not critical: strongSwan 5.9 refuses a CA whose critical constraints name addresses)
        permit the DNS names under ``devices.invalid``, the DNS names of ``gateway`` and exactly
        its addresses (with no address there, none at all); its extended key usage is
        :data:`CA_PURPOSES`. ``directory`` is made (0700) if missing. Two processes making it at
        once end with the same CA. A CA already there is loaded as it is: ``gateway`` shapes a
        new CA only (:meth:`gateway` refuses a name the CA does not permit).

        Args:
            directory: where ``device-ca.key`` (0600) and ``device-ca.crt`` (0644) are kept.
            owner: the Target's name: 1-63 of letters, digits, ``.``, ``_``, ``-``, starting with a
                letter or digit. One longer than 49 is cut to 48 and ``~`` in the CA's name,
                which may hold 64 characters.
            gateway: the gateway's IKE identity and the addresses devices reach it at: what its
                certificate may name (a name that is no DNS name is never in a certificate's
                subjectAltName, so it permits nothing).
            clock: the current time (aware), for certificate validity.

        Raises:
            InvalidInput: ``owner`` cannot be put in the CA's name, or a ``gateway`` entry is
                neither a gateway identity nor an IP address.
            DeviceCAError: the directory or a file in it is a link, not the service's own, or
                open to others; the key does not match the certificate; the CA is another
                owner's; a creation died half-way (the message names the file to move away).
        """
        common_name = _ca_common_name(_check_name(owner, what="owner", limit=_MAX_OWNER))
        constraints = _name_constraints(gateway)
        directory = Path(directory).absolute()
        with _open_directory(directory) as dfd:
            key, cert = _load_or_create_ca(dfd, directory, common_name, constraints, clock)
        return cls(directory=directory, key=key, cert=cert, clock=clock)

    # ----------------------------------------------------------------------- the CA certificate

    @property
    def cert_der(self) -> bytes:
        """The CA certificate, DER (what devices and charon trust)."""
        return self._cert.public_bytes(serialization.Encoding.DER)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def common_name(self) -> str:
        """The CA's common name, ``qoss <owner> device CA``."""
        return _common_name(self._cert)

    @property
    def constrained(self) -> bool:
        """Whether the CA certificate limits the names below it (False for a CA made before it
        carried name constraints: replace it, docs/agent.md "Rotating the device CA")."""
        return _constraints_of(self._cert) is not None

    @staticmethod
    def subject_dn(identity: str) -> str:
        """A device identity as strongSwan writes the subject of its certificate: ``CN=<identity>``.

        Raises:
            InvalidInput: not a device identity (see :meth:`issue_device`).
        """
        return f"CN={_check_name(identity, what='identity', limit=_MAX_CN)}"

    # ----------------------------------------------------------------------- the gateway

    def gateway(self, *, identity: str, addresses: Sequence[str]) -> GatewayCredential:
        """The gateway's own certificate and key, issued by this CA and kept beside it.

        The certificate has ``CN=identity``; subjectAltName dNSName ``identity`` when it is a
        DNS name, and iPAddress for each of ``addresses`` (and for ``identity`` when it is an
        address); extended key usage serverAuth and IKE intermediate; key usage
        digitalSignature; one year's validity. The stored pair is returned while it matches
        ``identity`` and ``addresses``, was issued by this CA and has 30 days or more left;
        otherwise a new key and certificate replace it.

        Args:
            identity: the gateway's IKE identity: a host name or an IP address.
            addresses: the IP addresses devices reach the gateway at.

        Raises:
            InvalidInput: ``identity`` or an address cannot be used.
            DeviceCAError: a gateway file is a link, not the service's own, or open to others; the
                CA's name constraints do not permit ``identity`` or an address (the gateway moved
                since the CA was made: the message says how to make a new CA).
        """
        identity = _check_gateway_identity(identity)
        ips = _check_addresses(addresses)
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_address(identity)
            ips = ips if ip in ips else (*ips, ip)
        dns = (identity,) if _is_dns_name(identity) else ()
        outside = _outside(_constraints_of(self._cert), dns=dns, ips=ips)
        if outside:
            raise DeviceCAError(f"the device CA in {self._directory} may not vouch for {', '.join(outside)}: its "
                                "name constraints hold the gateway's names and addresses as they were when it was "
                                "made; make a new CA (docs/agent.md, \"Rotating the device CA\")")
        now = self._now()
        with _open_directory(self._directory) as dfd:
            fcntl.flock(dfd, fcntl.LOCK_EX)  # released when the descriptor closes
            stored = self._stored_gateway(dfd)
            if stored is not None and self._gateway_fits(stored[1], identity=identity, dns=dns, ips=ips, now=now):
                key, cert = stored
            else:
                key = ec.generate_private_key(ec.SECP256R1())
                cert = self._sign(
                    _builder(identity, key, not_before=now - _BACKDATE, not_after=now + _GATEWAY_LIFETIME)
                    .add_extension(x509.SubjectAlternativeName([*map(x509.DNSName, dns), *map(x509.IPAddress, ips)]),
                                   critical=False)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, IKE_INTERMEDIATE]),
                                   critical=False))
                _replace(dfd, GATEWAY_KEY, _key_pem(key), mode=0o600)
                _replace(dfd, GATEWAY_CERT, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        key_der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return GatewayCredential(cert_der=cert.public_bytes(serialization.Encoding.DER), key_der=key_der,
                                 key_type="ecdsa")

    def _stored_gateway(self, dfd: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
        """The stored gateway pair, or None if missing, unreadable as a pair, or not matching."""
        key_file = _read(dfd, self._directory, GATEWAY_KEY, secret=True)
        cert_file = _read(dfd, self._directory, GATEWAY_CERT, secret=False)
        if key_file is None or cert_file is None:
            return None
        try:
            key = _parse_key(key_file.data)
            cert = x509.load_pem_x509_certificate(cert_file.data)
        except ValueError:
            return None
        return (key, cert) if _matches(key, cert) else None

    def _gateway_fits(self, cert: x509.Certificate, *, identity: str, dns: tuple[str, ...],
                      ips: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...], now: datetime) -> bool:
        try:
            cert.verify_directly_issued_by(self._cert)
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
            return False
        return (_common_name(cert) == identity
                and set(san.get_values_for_type(x509.DNSName)) == set(dns)
                and set(san.get_values_for_type(x509.IPAddress)) == set(ips)
                and cert.not_valid_after_utc - now >= _GATEWAY_RENEW)

    # ----------------------------------------------------------------------- devices

    def issue_device(self, *, identity: str, lifetime: int, name: str | None = None,
                     legacy: bool = False) -> DeviceCredential:
        """A new key and certificate for one device, packed as PKCS#12 under a one-time passphrase.

        The certificate has ``CN=identity`` (and subjectAltName dNSName ``identity`` when it is
        a DNS name, which Apple's clients match their local identifier against; a CA with name
        constraints issues only names under ``devices.invalid``), extended key
        usage clientAuth and IKE intermediate, key usage digitalSignature; it is valid from five
        minutes ago for ``lifetime`` seconds from now, with a random 159-bit serial. The key is
        never written anywhere but into the returned PKCS#12.

        Args:
            identity: the device's identity, e.g. ``0a1b2c3d4e5f.alice.devices.invalid``
                (:func:`~app.domain.agent.conns.device_identity`): 1-64 of letters, digits, ``.``,
                ``_``, ``-``, starting with a letter or digit.
            lifetime: seconds, from an hour to 90 days.
            name: the PKCS#12 friendly name clients show (default ``identity``): 1-64
                printable characters.
            legacy: the PKCS#12 encrypted the old way (3DES, SHA-1 MAC), for clients that open
                nothing else (Apple's); otherwise PBES2 with AES-256 and a SHA-256 MAC.

        Raises:
            InvalidInput: ``identity``, ``lifetime`` or ``name`` cannot be used, or the CA's name
                constraints do not permit ``identity``.
        """
        identity = _check_name(identity, what="identity", limit=_MAX_CN)
        constraints = _constraints_of(self._cert)
        if constraints is not None and (not _is_dns_name(identity) or _outside(constraints, dns=(identity,), ips=())):
            raise InvalidInput(f"a device's identity is a DNS name under {DEVICE_NAMESPACE} (the only device names "
                               f"this CA may vouch for), not {identity!r:.80}")
        if isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime not in _DEVICE_LIFETIME:
            raise InvalidInput(f"a device certificate's lifetime is {_DEVICE_LIFETIME.start} to "
                               f"{_DEVICE_LIFETIME.stop - 1} seconds (an hour to 90 days), not {lifetime!r}")
        friendly = identity if name is None else name
        if not isinstance(friendly, str) or not 1 <= len(friendly) <= _MAX_CN or not friendly.isprintable():
            raise InvalidInput("a credential's name is 1-64 printable characters")
        now = self._now()
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(identity, key, not_before=now - _BACKDATE, not_after=now + timedelta(seconds=lifetime))
        if _is_dns_name(identity):
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(identity)]), critical=False)
        cert = self._sign(
            builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, IKE_INTERMEDIATE]),
                                  critical=False))
        passphrase = _passphrase()
        algorithm, mac = ((pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC, hashes.SHA1()) if legacy  # noqa: S303
                          else (pkcs12.PBES.PBESv2SHA256AndAES256CBC, hashes.SHA256()))
        encryption = (serialization.PrivateFormat.PKCS12.encryption_builder()
                      .kdf_rounds(_KDF_ROUNDS)
                      .key_cert_algorithm(algorithm)
                      .hmac_hash(mac)
                      .build(passphrase.encode("ascii")))
        ca = pkcs12.PKCS12Certificate(self._cert, self.common_name.encode("utf-8"))
        p12 = pkcs12.serialize_key_and_certificates(friendly.encode("utf-8"), key, cert, [ca], encryption)
        return DeviceCredential(p12=p12, passphrase=passphrase, cert_der=cert.public_bytes(serialization.Encoding.DER),
                                serial=cert.serial_number, not_after=cert.not_valid_after_utc)

    # ----------------------------------------------------------------------- helpers

    def _now(self) -> datetime:
        return _aware(self._clock())

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        """Finish an end-entity certificate: issuer, key usage, CA:false, authority key id; signed."""
        ca_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key())
        return (builder.issuer_name(self._cert.subject)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_key_usage(digital_signature=True), critical=True)
                .add_extension(ca_key_id, critical=False)
                .sign(self._key, hashes.SHA256()))


# --------------------------------------------------------------------------- making and loading the CA


def _load_or_create_ca(dfd: int, directory: Path, common_name: str, constraints: x509.NameConstraints,
                       clock: Callable[[], datetime]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Load the CA; make it if there is no key file; wait while another process is making it."""
    deadline = time.monotonic() + _SETTLE
    while True:
        key_file = _read(dfd, directory, CA_KEY, secret=True)
        if key_file is None:
            made = _create_ca(dfd, common_name, constraints, clock)
            if made is not None:
                return made
            continue  # another process created the key first: load theirs
        cert_file = _read(dfd, directory, CA_CERT, secret=False)
        try:
            key = _parse_key(key_file.data)
            problem = None if cert_file is not None else f"{directory / CA_CERT} is missing beside {CA_KEY}"
        except ValueError:
            problem = f"{directory / CA_KEY} is not an ECDSA P-256 private key in PEM"
        # The key is written before the certificate: a key younger than _SETTLE without its
        # certificate, or with an older (stale) one, is another process's creation under way.
        under_way = time.time() - key_file.mtime < _SETTLE and (
            problem is not None or (cert_file is not None and cert_file.mtime < key_file.mtime))
        if under_way and time.monotonic() < deadline:
            time.sleep(_POLL)
            continue
        if problem is not None:
            raise DeviceCAError(f"{problem} (a creation that did not finish?): move {directory / CA_KEY} away "
                                "to make a new CA, which every device must then trust anew")
        assert cert_file is not None
        return key, _check_ca_cert(cert_file.data, key, directory, common_name)


def _check_ca_cert(pem: bytes, key: ec.EllipticCurvePrivateKey, directory: Path,
                   common_name: str) -> x509.Certificate:
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise DeviceCAError(f"{directory / CA_CERT} is not a PEM certificate") from None
    if not _matches(key, cert):
        raise DeviceCAError(f"{directory / CA_KEY} does not match the certificate {directory / CA_CERT}: "
                            "restore the pair, or move both away to make a new CA")
    found = _common_name(cert)
    if found != common_name:
        raise DeviceCAError(f"{directory} holds the CA {found!r}, not {common_name!r}: "
                            "give each Target its own directory")
    return cert


def _create_ca(dfd: int, common_name: str, constraints: x509.NameConstraints,
               clock: Callable[[], datetime]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    """Make the CA, unless another process creates the key file first (then None)."""
    now = _aware(clock())
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
            # Not critical, as RFC 5280 asks: strongSwan 5.9 cannot parse an iPAddress subtree and
            # refuses the whole certificate when this extension is critical. Windows, Apple, OpenSSL
            # and browsers enforce name constraints either way (the CA/Browser Forum's Baseline
            # Requirements allow them non-critical for such software); strongSwan's own clients keep
            # this CA in their own store, for this VPN only.
            .add_extension(constraints, critical=False)
            .add_extension(x509.ExtendedKeyUsage(CA_PURPOSES), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    if not _create(dfd, CA_KEY, _key_pem(key), mode=0o600):
        return None
    try:
        _replace(dfd, CA_CERT, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    except BaseException:
        with contextlib.suppress(OSError):  # no key without its certificate: the next attempt starts over
            os.unlink(CA_KEY, dir_fd=dfd)
        raise
    return key, cert


# --------------------------------------------------------------------------- name constraints

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _name_constraints(gateway: Sequence[str]) -> x509.NameConstraints:
    """What a new CA permits: DNS names under the device namespace, the gateway's DNS names and
    exactly its addresses; with no address of a family, every address of that family excluded
    (a permitted subtree of one family does not constrain the other in every verifier)."""
    if isinstance(gateway, str | bytes):
        raise InvalidInput("gateway is a list of names and addresses, not one string")
    names: dict[str, None] = {DEVICE_NAMESPACE: None}
    ips: dict[_Address, None] = {}
    for entry in gateway:
        value = _check_gateway_identity(entry)
        with contextlib.suppress(ValueError):
            ips[ipaddress.ip_address(value)] = None
            continue
        if _is_dns_name(value):
            names[value.lower()] = None
    permitted: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    permitted += [x509.IPAddress(ipaddress.ip_network(ip)) for ip in ips]
    families = {ip.version for ip in ips}
    excluded: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_network(net)) for version, net in
                                        ((4, "0.0.0.0/0"), (6, "::/0")) if version not in families]
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded or None)


def _constraints_of(cert: x509.Certificate) -> x509.NameConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None


def _outside(constraints: x509.NameConstraints | None, *, dns: Sequence[str], ips: Sequence[_Address]) -> list[str]:
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

    def ip_within(ip: _Address, trees: list[x509.GeneralName]) -> bool:
        return any(isinstance(t.value, ipaddress.IPv4Network | ipaddress.IPv6Network)
                   and t.value.version == ip.version and ip in t.value
                   for t in trees if isinstance(t, x509.IPAddress))

    dns_limited = any(isinstance(t, x509.DNSName) for t in permitted)
    ip_limited = any(isinstance(t, x509.IPAddress) for t in permitted)
    return ([name for name in dns if dns_within(name, excluded) or (dns_limited and not dns_within(name, permitted))]
            + [str(ip) for ip in ips if ip_within(ip, excluded) or (ip_limited and not ip_within(ip, permitted))])


# --------------------------------------------------------------------------- certificates


def _ca_common_name(owner: str) -> str:
    return _CA_NAME.format(owner=owner if len(owner) <= _OWNER_IN_CN else owner[:_OWNER_IN_CN - 1] + "~")


def _builder(identity: str, key: ec.EllipticCurvePrivateKey, *, not_before: datetime,
             not_after: datetime) -> x509.CertificateBuilder:
    public = key.public_key()
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))


def _key_usage(*, digital_signature: bool = False, key_cert_sign: bool = False,
               crl_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=digital_signature, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
                         crl_sign=crl_sign, encipher_only=False, decipher_only=False)


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _parse_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """An ECDSA P-256 private key from PEM.

    Raises:
        ValueError: anything else.
    """
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("not an ECDSA P-256 key")
    return key


def _matches(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def _passphrase() -> str:
    symbols = "".join(secrets.choice(_ALPHABET) for _ in range(_PASSPHRASE_GROUPS * _GROUP))
    return "-".join(symbols[i:i + _GROUP] for i in range(0, len(symbols), _GROUP))


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("the CA's clock must give aware datetimes")
    return now.astimezone(UTC).replace(microsecond=0)


# --------------------------------------------------------------------------- input


def _check_name(value: str, *, what: str, limit: int) -> str:
    """An owner or device identity: safe in a DN and in a strongSwan identity string as it stands."""
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not _NAME.fullmatch(value):
        raise InvalidInput(f"an {what} is 1-{limit} of letters, digits, '.', '_', '-', starting with a letter or "
                           f"digit (no spaces, commas, '=', '+', quotes or control characters), not {value!r:.80}")
    return value


def _check_gateway_identity(identity: str) -> str:
    if isinstance(identity, str) and len(identity) <= _MAX_CN:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(identity))
    return _check_name(identity, what="identity", limit=_MAX_CN)


def _check_addresses(addresses: Sequence[str]) -> tuple[_Address, ...]:
    if isinstance(addresses, str | bytes):
        raise InvalidInput("addresses is a list of IP addresses, not one string")
    ips: dict[_Address, None] = {}
    for address in addresses:
        try:
            ips[ipaddress.ip_address(address)] = None
        except ValueError:
            raise InvalidInput(f"not an IP address: {address!r:.80}") from None
    return tuple(ips)


def _is_dns_name(value: str) -> bool:
    """A host name a certificate may carry as dNSName (LDH labels, the last not all digits)."""
    labels = value.split(".")
    return (len(value) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit())


# --------------------------------------------------------------------------- files


@dataclass(frozen=True, slots=True)
class _File:
    data: bytes
    mtime: float


@contextlib.contextmanager
def _open_directory(directory: Path) -> Iterator[int]:
    """The CA's directory, open (made 0700 if missing); a link, or one others may write to, refused."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DeviceCAError(f"the CA directory {directory} is a link or not a directory: name the directory "
                                "itself") from exc
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise DeviceCAError(f"the CA directory {directory} is owned by uid {st.st_uid}, not by the service's "
                                f"user ({os.geteuid()})")
        if st.st_mode & 0o022:
            raise DeviceCAError(f"the CA directory {directory} is writable by other users "
                                f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 700 it")
        yield fd
    finally:
        os.close(fd)


def _read(dfd: int, directory: Path, name: str, *, secret: bool) -> _File | None:
    """A file of the directory, or None if it does not exist.

    Raises:
        DeviceCAError: a link, not a regular file, not the service's own, writable by others,
            or (``secret``) readable by others.
    """
    path = directory / name
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DeviceCAError(f"{path} is a symbolic link: refused (put the file itself there)") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DeviceCAError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise DeviceCAError(f"{path} is owned by uid {st.st_uid}, not by the service's user ({os.geteuid()})")
        if st.st_mode & (0o077 if secret else 0o022):
            who = "read or written by other users" if secret else "written by other users"
            fix = "chmod 600 it" if secret else "chmod 644 it"
            raise DeviceCAError(f"{path} may be {who} (mode {stat.S_IMODE(st.st_mode):o}): {fix}")
        return _File(handle.read(), st.st_mtime)


def _write_whole(fd: int, data: bytes, mode: int) -> None:
    """Give the open file ``mode``, write ``data`` and sync it; closes ``fd``."""
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _create(dfd: int, name: str, data: bytes, *, mode: int) -> bool:
    """Write a new file whole, unless it exists already (then False and nothing written)."""
    try:
        fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=dfd)
    except FileExistsError:
        return False
    try:
        _write_whole(fd, data, mode)
        os.fsync(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise
    return True


def _replace(dfd: int, name: str, data: bytes, *, mode: int) -> None:
    """Write a file whole: a temporary file in the directory, renamed over ``name``."""
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=dfd)
    try:
        _write_whole(fd, data, mode)
        os.replace(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
