"""A Target's device CA: made once (race-safe), its files guarded; device credentials in a
PKCS#12 that opens with its one-time passphrase only (OpenSSL agreeing); the gateway's
certificate kept while it fits and made again when it does not."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from app.adapters.agent.device_ca import DeviceCA, DeviceCAError, DeviceCredential
from app.domain.agent.conns import device_identity
from app.domain.errors import InvalidInput
from tests.fixtures.secrets import register

DAY = 86400
IKE_INTERMEDIATE = ObjectIdentifier("1.3.6.1.5.5.8.2.2")
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DEVICE = "0a1b2c3d4e5f.alice.devices.invalid"
#: What the gateway of the tests' CA is called and where it is reached.
GATEWAY = ["vpn.example.net", "gw.example.net", "gw_alice", "203.0.113.7", "192.0.2.1", "192.0.2.2", "2001:db8::1"]


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ca(tmp_path: Path, clock: Clock) -> DeviceCA:
    return DeviceCA.load_or_create(tmp_path / "ca", owner="alice", gateway=GATEWAY, clock=clock)


def issue(ca: DeviceCA, identity: str = DEVICE, lifetime: int = 60 * DAY) -> DeviceCredential:
    credential = ca.issue_device(identity=identity, lifetime=lifetime)
    register(credential.passphrase)  # the secret sweep: never in a log or a database
    return credential


def cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def ekus(cert: x509.Certificate) -> list[ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def signed_by(cert: x509.Certificate, ca: DeviceCA) -> None:
    public = x509.load_der_x509_certificate(ca.cert_der).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def legacy_ca(directory: Path, owner: str = "alice") -> DeviceCA:
    """A CA as qoss made it before its certificate carried name constraints and purposes."""
    directory.mkdir(mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"qoss {owner} device CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - timedelta(days=400)).not_valid_after(NOW + timedelta(days=3000))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    key_file = directory / "device-ca.key"
    key_file.touch(mode=0o600)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    (directory / "device-ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.utime(key_file, (time.time() - 60, time.time() - 60))  # settled: no creation under way
    return DeviceCA.load_or_create(directory, owner=owner, clock=Clock())


# --------------------------------------------------------------------------- the CA


def test_the_ca_is_made_once_and_loaded_after(tmp_path: Path, ca: DeviceCA, clock: Clock) -> None:
    again = DeviceCA.load_or_create(tmp_path / "ca", owner="alice", clock=clock)
    assert again.cert_der == ca.cert_der
    assert ca.common_name == "qoss alice device CA"
    assert mode(tmp_path / "ca" / "device-ca.key") == 0o600
    assert mode(tmp_path / "ca" / "device-ca.crt") == 0o644
    assert mode(tmp_path / "ca") == 0o700
    assert (tmp_path / "ca" / "device-ca.crt").read_bytes() == ca.cert_pem
    assert "alice" in repr(ca)
    assert "PRIVATE" not in repr(ca)


def test_the_ca_certificate_is_a_p256_ca_for_ten_years(ca: DeviceCA) -> None:
    cert = x509.load_der_x509_certificate(ca.cert_der)
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert isinstance(public.curve, ec.SECP256R1)
    assert cert.subject == cert.issuer
    cert.verify_directly_issued_by(cert)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    assert not usage.digital_signature
    assert cert.not_valid_after_utc - NOW >= timedelta(days=3652)


def test_racing_makers_end_with_one_ca(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    made: list[bytes] = []
    errors: list[BaseException] = []

    def make() -> None:
        barrier.wait()
        try:
            made.append(DeviceCA.load_or_create(tmp_path / "ca", owner="alice").cert_der)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == []
    assert len(made) == 8
    assert len(set(made)) == 1
    assert sorted(p.name for p in (tmp_path / "ca").iterdir()) == ["device-ca.crt", "device-ca.key"]


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o620, 0o602])
def test_a_key_file_others_can_read_or_write_is_refused(tmp_path: Path, ca: DeviceCA, loose: int) -> None:
    os.chmod(tmp_path / "ca" / "device-ca.key", loose)
    with pytest.raises(DeviceCAError, match="chmod 600"):
        DeviceCA.load_or_create(tmp_path / "ca", owner="alice")


def test_a_symlinked_key_file_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    key = tmp_path / "ca" / "device-ca.key"
    planted = tmp_path / "planted.key"
    key.rename(planted)
    key.symlink_to(planted)
    with pytest.raises(DeviceCAError, match="symbolic link"):
        DeviceCA.load_or_create(tmp_path / "ca", owner="alice")


def test_a_symlinked_ca_directory_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "ca")
    with pytest.raises(DeviceCAError, match="link"):
        DeviceCA.load_or_create(tmp_path / "link", owner="alice")


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    other = DeviceCA.load_or_create(tmp_path / "other", owner="alice")
    (tmp_path / "ca" / "device-ca.crt").write_bytes(other.cert_pem)
    with pytest.raises(DeviceCAError, match="does not match"):
        DeviceCA.load_or_create(tmp_path / "ca", owner="alice")


def test_another_owners_ca_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    with pytest.raises(DeviceCAError, match="qoss alice device CA"):
        DeviceCA.load_or_create(tmp_path / "ca", owner="bob")


def test_an_unfinished_creation_is_refused_with_what_to_do(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    directory.mkdir(mode=0o700)
    key = directory / "device-ca.key"
    key.touch(mode=0o600)  # a maker that died before writing its key
    long_ago = time.time() - 3600
    os.utime(key, (long_ago, long_ago))
    started = time.monotonic()
    with pytest.raises(DeviceCAError, match=r"move .*device-ca\.key away"):
        DeviceCA.load_or_create(directory, owner="alice")
    assert time.monotonic() - started < 1  # an old leftover is not waited for


# --------------------------------------------------------------------------- devices


def test_the_p12_opens_with_its_passphrase_and_no_other(ca: DeviceCA) -> None:
    credential = issue(ca)
    key, cert, extra = pkcs12.load_key_and_certificates(credential.p12, credential.passphrase.encode())
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)
    assert cert is not None
    assert cert.public_bytes(serialization.Encoding.DER) == credential.cert_der
    assert [c.public_bytes(serialization.Encoding.DER) for c in extra] == [ca.cert_der]
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    with pytest.raises(ValueError, match="Invalid password"):
        pkcs12.load_key_and_certificates(credential.p12, b"abcd-efgh-ijkm-npqr-stuv-wxyz")
    with pytest.raises(ValueError, match="Invalid password"):
        pkcs12.load_key_and_certificates(credential.p12, None)


def test_the_p12_carries_its_friendly_name(ca: DeviceCA) -> None:
    credential = ca.issue_device(identity=DEVICE, lifetime=60 * DAY, name="Alice's phone")
    register(credential.passphrase)
    p12 = pkcs12.load_pkcs12(credential.p12, credential.passphrase.encode())
    assert p12.cert is not None
    assert p12.cert.friendly_name == b"Alice's phone"
    assert [c.friendly_name for c in p12.additional_certs] == [b"qoss alice device CA"]
    default = issue(ca)
    unnamed = pkcs12.load_pkcs12(default.p12, default.passphrase.encode())
    assert unnamed.cert is not None
    assert unnamed.cert.friendly_name == DEVICE.encode()


def test_the_device_certificate_chains_to_the_ca_for_client_auth(ca: DeviceCA) -> None:
    credential = issue(ca, lifetime=75 * DAY)
    cert = x509.load_der_x509_certificate(credential.cert_der)
    signed_by(cert, ca)
    cert.verify_directly_issued_by(x509.load_der_x509_certificate(ca.cert_der))
    assert cn(cert) == DEVICE
    assert ExtendedKeyUsageOID.CLIENT_AUTH in ekus(cert)
    assert IKE_INTERMEDIATE in ekus(cert)
    assert ExtendedKeyUsageOID.SERVER_AUTH not in ekus(cert)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature
    assert not usage.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert credential.not_after == cert.not_valid_after_utc == NOW + timedelta(days=75)
    assert credential.not_after.tzinfo is UTC
    assert cert.not_valid_before_utc == NOW - timedelta(minutes=5)
    assert credential.serial == cert.serial_number
    assert 0 < credential.serial < 2**159


def test_a_device_identity_that_is_a_dns_name_is_also_its_alt_name(tmp_path: Path, ca: DeviceCA) -> None:
    cert = x509.load_der_x509_certificate(issue(ca).cert_der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [DEVICE]
    legacy = legacy_ca(tmp_path / "legacy")  # a CA without name constraints names any device
    cert = x509.load_der_x509_certificate(issue(legacy, identity="0a1b2c3d4e5f.al_ice").cert_der)
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_two_issues_differ_and_never_show_the_passphrase(ca: DeviceCA) -> None:
    first, second = issue(ca), issue(ca)
    assert first.passphrase != second.passphrase
    assert first.serial != second.serial
    for credential in (first, second):
        assert re.fullmatch(r"[a-km-np-z2-9]{4}(-[a-km-np-z2-9]{4}){5}", credential.passphrase)
        assert credential.passphrase not in repr(credential)
        assert credential.passphrase not in str(credential)
        assert "p12" not in repr(credential)


def test_the_device_key_is_never_written(tmp_path: Path, ca: DeviceCA) -> None:
    issue(ca)
    assert sorted(p.name for p in (tmp_path / "ca").iterdir()) == ["device-ca.crt", "device-ca.key"]


def test_openssl_reads_the_p12_with_its_passphrase_only(tmp_path: Path, ca: DeviceCA) -> None:
    credential = issue(ca)
    p12file = tmp_path / "device.p12"
    p12file.write_bytes(credential.p12)
    opened = subprocess.run(["openssl", "pkcs12", "-in", str(p12file), "-passin", "pass:" + credential.passphrase,
                             "-nokeys"], capture_output=True, text=True, timeout=10, check=False)
    assert opened.returncode == 0, opened.stderr
    assert f"CN = {DEVICE}" in opened.stdout
    assert "CN = qoss alice device CA" in opened.stdout
    wrong = subprocess.run(["openssl", "pkcs12", "-in", str(p12file), "-passin", "pass:abcd-efgh-ijkm-npqr-stuv-wxyz",
                            "-nokeys"], capture_output=True, text=True, timeout=10, check=False)
    assert wrong.returncode != 0
    assert DEVICE not in wrong.stdout


@pytest.mark.parametrize("identity", ["", "a,b", "a=b", "a+b", "a\nb", "a\x00b", "a b", 'a"b', "a\\b", "a/b",
                                      "-x", ".x", "a" * 65, "zoë", "CN=x"])
def test_a_bad_identity_is_refused(ca: DeviceCA, identity: str) -> None:
    with pytest.raises(InvalidInput, match="identity"):
        ca.issue_device(identity=identity, lifetime=60 * DAY)
    with pytest.raises(ValueError, match="identity"):
        DeviceCA.subject_dn(identity)


@pytest.mark.parametrize("lifetime", [3599, 90 * DAY + 1, 0, -60 * DAY, 60.0 * DAY])
def test_a_lifetime_outside_an_hour_to_90_days_is_refused(ca: DeviceCA, lifetime: int) -> None:
    with pytest.raises(InvalidInput, match="an hour to 90 days"):
        ca.issue_device(identity=DEVICE, lifetime=lifetime)


def test_a_bad_owner_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="owner"):
        DeviceCA.load_or_create(tmp_path / "ca", owner="alice, O=evil")
    assert not (tmp_path / "ca").exists()


def test_a_long_owner_is_cut_to_fit_the_cas_name(tmp_path: Path) -> None:
    owner = "t" * 63
    ca = DeviceCA.load_or_create(tmp_path / "ca", owner=owner)
    assert ca.common_name == f"qoss {'t' * 48}~ device CA"
    assert len(ca.common_name) == 64
    assert DeviceCA.load_or_create(tmp_path / "ca", owner=owner).cert_der == ca.cert_der
    with pytest.raises(InvalidInput, match="owner"):
        DeviceCA.load_or_create(tmp_path / "other", owner="t" * 64)


def test_the_subject_dn_is_as_strongswan_writes_it() -> None:
    assert DeviceCA.subject_dn(DEVICE) == f"CN={DEVICE}"


# --------------------------------------------------------------------------- the gateway


def test_the_gateway_certificate_names_its_addresses_and_ike_purposes(tmp_path: Path, ca: DeviceCA) -> None:
    gateway = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1", "2001:db8::1"])
    cert = x509.load_der_x509_certificate(gateway.cert_der)
    signed_by(cert, ca)
    assert cn(cert) == "vpn.example.net"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["vpn.example.net"]
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"192.0.2.1", "2001:db8::1"}
    assert ExtendedKeyUsageOID.SERVER_AUTH in ekus(cert)
    assert IKE_INTERMEDIATE in ekus(cert)
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    assert cert.not_valid_after_utc == NOW + timedelta(days=365)
    key = serialization.load_der_private_key(gateway.key_der, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert gateway.key_type == "ecdsa"
    assert key.public_key() == cert.public_key()
    assert mode(tmp_path / "ca" / "device-gateway.key") == 0o600
    assert "PRIVATE" not in repr(gateway)
    assert gateway.key_der.hex() not in repr(gateway)


def test_a_gateway_identity_that_is_no_dns_name_gets_no_dns_name(ca: DeviceCA) -> None:
    cert = x509.load_der_x509_certificate(ca.gateway(identity="203.0.113.7", addresses=["192.0.2.1"]).cert_der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == []
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"192.0.2.1", "203.0.113.7"}
    cert = x509.load_der_x509_certificate(ca.gateway(identity="gw_alice", addresses=["192.0.2.1"]).cert_der)
    assert cn(cert) == "gw_alice"
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == []


def test_the_gateway_is_kept_for_the_same_inputs_and_remade_for_new_ones(tmp_path: Path, ca: DeviceCA,
                                                                          clock: Clock) -> None:
    first = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    assert ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"]) == first
    reloaded = DeviceCA.load_or_create(tmp_path / "ca", owner="alice", clock=clock)
    assert reloaded.gateway(identity="vpn.example.net", addresses=["192.0.2.1"]) == first
    moved = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.2"])
    assert moved.cert_der != first.cert_der
    assert moved.key_der != first.key_der
    renamed = ca.gateway(identity="gw.example.net", addresses=["192.0.2.2"])
    assert renamed.cert_der != moved.cert_der


def test_the_gateway_is_renewed_when_less_than_30_days_remain(ca: DeviceCA, clock: Clock) -> None:
    first = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    clock.now = NOW + timedelta(days=335)  # exactly 30 days left: kept
    assert ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"]) == first
    clock.now += timedelta(seconds=1)
    renewed = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    assert renewed.cert_der != first.cert_der
    assert x509.load_der_x509_certificate(renewed.cert_der).not_valid_after_utc == clock.now + timedelta(days=365)


def test_a_gateway_of_another_ca_is_remade(tmp_path: Path, ca: DeviceCA) -> None:
    other = DeviceCA.load_or_create(tmp_path / "other", owner="alice", gateway=GATEWAY)
    foreign = other.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    for name in ("device-gateway.key", "device-gateway.crt"):
        (tmp_path / "ca" / name).write_bytes((tmp_path / "other" / name).read_bytes())
        os.chmod(tmp_path / "ca" / name, 0o600)
    mine = ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    assert mine.cert_der != foreign.cert_der
    signed_by(x509.load_der_x509_certificate(mine.cert_der), ca)


def test_a_readable_gateway_key_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])
    os.chmod(tmp_path / "ca" / "device-gateway.key", 0o644)
    with pytest.raises(DeviceCAError, match="chmod 600"):
        ca.gateway(identity="vpn.example.net", addresses=["192.0.2.1"])


@pytest.mark.parametrize("addresses", [["192.0.2.300"], ["vpn.example.net"], "192.0.2.1"])
def test_bad_gateway_addresses_are_refused(ca: DeviceCA, addresses: list[str]) -> None:
    with pytest.raises(InvalidInput, match="address"):
        ca.gateway(identity="vpn.example.net", addresses=addresses)


def test_a_bad_gateway_identity_is_refused(ca: DeviceCA) -> None:
    with pytest.raises(InvalidInput, match="identity"):
        ca.gateway(identity="vpn.example.net, O=evil", addresses=["192.0.2.1"])


def test_the_signature_hash_is_sha256(ca: DeviceCA) -> None:
    cert = x509.load_der_x509_certificate(issue(ca).cert_der)
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)


# --------------------------------------------------------------------------- what the CA may vouch for


def ca_key(directory: Path) -> ec.EllipticCurvePrivateKey:
    """The CA's key as whoever copied ``device-ca.key`` holds it."""
    key = serialization.load_pem_private_key((directory / "device-ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def forged(directory: Path, ca: DeviceCA, *, names: list[x509.GeneralName], common_name: str = "forged",
           purpose: ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH) -> x509.Certificate:
    """A leaf signed with the CA's own key: what a thief of the key would make (no
    subjectAltName without ``names``)."""
    key, issuer = ca_key(directory), x509.load_der_x509_certificate(ca.cert_der)
    leaf = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(issuer.subject).public_key(leaf.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW - timedelta(hours=1)).not_valid_after(NOW + timedelta(days=30)))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return (builder
            .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))


def verify_server(ca: DeviceCA, cert: x509.Certificate, name: str) -> None:
    """cryptography's RFC 5280 path validation for a TLS server ``name``; raises VerificationError."""
    subject: verification.Subject
    try:
        subject = verification.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = verification.DNSName(name)
    store = verification.Store([x509.load_der_x509_certificate(ca.cert_der)])
    verification.PolicyBuilder().store(store).time(NOW).build_server_verifier(subject).verify(cert, [])


def openssl_verify(tmp_path: Path, ca: DeviceCA, cert: x509.Certificate,
                   purpose: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "anchor.pem").write_bytes(ca.cert_pem)
    (tmp_path / "leaf.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return subprocess.run(["openssl", "verify", "-x509_strict", "-attime", str(int(NOW.timestamp())),
                           "-purpose", purpose, "-CAfile", str(tmp_path / "anchor.pem"), str(tmp_path / "leaf.pem")],
                          capture_output=True, text=True, timeout=10, check=False)


def test_the_ca_certificate_permits_only_the_device_names_and_the_gateway(ca: DeviceCA) -> None:
    cert = x509.load_der_x509_certificate(ca.cert_der)
    extension = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert not extension.critical  # strongSwan 5.9 refuses critical iPAddress subtrees; verifiers enforce either way
    permitted = extension.value.permitted_subtrees or []
    assert sorted(n.value for n in permitted if isinstance(n, x509.DNSName)) == [
        "devices.invalid", "gw.example.net", "vpn.example.net"]
    assert {str(n.value) for n in permitted if isinstance(n, x509.IPAddress)} == {
        "203.0.113.7/32", "192.0.2.1/32", "192.0.2.2/32", "2001:db8::1/128"}
    assert {type(n) for n in permitted} == {x509.DNSName, x509.IPAddress}
    assert extension.value.excluded_subtrees is None  # both families have permitted addresses
    purposes = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert not purposes.critical
    assert list(purposes.value) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH,
                                    ExtendedKeyUsageOID.IPSEC_IKE, IKE_INTERMEDIATE]
    assert ca.constrained


@pytest.mark.parametrize(("gateway", "excluded"), [([], {"0.0.0.0/0", "::/0"}), (["target-1.qoss", "10.99.0.3"],
                                                                                  {"::/0"})])
def test_a_family_without_a_gateway_address_is_excluded_whole(tmp_path: Path, gateway: list[str],
                                                              excluded: set[str]) -> None:
    ca = DeviceCA.load_or_create(tmp_path / "ca", owner="target-1", gateway=gateway, clock=Clock())
    constraints = x509.load_der_x509_certificate(ca.cert_der).extensions.get_extension_for_class(
        x509.NameConstraints).value
    assert {str(n.value) for n in constraints.excluded_subtrees or []} == excluded


@pytest.mark.parametrize("names", [
    [x509.DNSName("example.com")],
    [x509.DNSName("www.example.com")],
    [x509.DNSName("intranet.local"), x509.DNSName("vpn.example.net")],
    [x509.DNSName("devices.invalid.example.com")],
    [x509.IPAddress(ipaddress.ip_address("10.0.0.1"))],
    [x509.IPAddress(ipaddress.ip_address("2001:db8::2"))],
])
def test_a_tls_certificate_outside_the_constraints_signed_with_the_ca_key_is_refused(
        tmp_path: Path, ca: DeviceCA, names: list[x509.GeneralName]) -> None:
    cert = forged(tmp_path / "ca", ca, names=names)
    with pytest.raises(verification.VerificationError, match="name constraint"):
        verify_server(ca, cert, str(names[0].value))
    refused = openssl_verify(tmp_path, ca, cert, "sslserver")
    assert refused.returncode != 0
    assert "subtree violation" in refused.stdout + refused.stderr


def test_a_tls_certificate_naming_a_site_in_its_common_name_alone_is_refused(tmp_path: Path, ca: DeviceCA) -> None:
    # A client that still reads the common name (no subjectAltName) gets the constraints applied to it.
    cert = forged(tmp_path / "ca", ca, names=[], common_name="www.example.com")
    refused = openssl_verify(tmp_path, ca, cert, "sslserver")
    assert refused.returncode != 0
    assert "subtree violation" in refused.stdout + refused.stderr


def test_an_e_mail_certificate_signed_with_the_ca_key_is_refused_by_its_purpose(tmp_path: Path, ca: DeviceCA) -> None:
    cert = forged(tmp_path / "ca", ca, names=[x509.DNSName(DEVICE)], purpose=ExtendedKeyUsageOID.EMAIL_PROTECTION)
    refused = openssl_verify(tmp_path, ca, cert, "smimesign")
    assert refused.returncode != 0
    # Depth 1 is the CA: its own extended key usage holds no e-mail protection.
    assert "at 1 depth lookup: unsuitable certificate purpose" in refused.stdout + refused.stderr


def test_the_gateway_and_device_certificates_still_verify(tmp_path: Path, ca: DeviceCA) -> None:
    gateway = x509.load_der_x509_certificate(ca.gateway(identity="vpn.example.net",
                                                        addresses=["192.0.2.1", "2001:db8::1"]).cert_der)
    verify_server(ca, gateway, "vpn.example.net")
    verify_server(ca, gateway, "192.0.2.1")
    verify_server(ca, gateway, "2001:db8::1")
    assert openssl_verify(tmp_path, ca, gateway, "sslserver").returncode == 0
    device = x509.load_der_x509_certificate(issue(ca).cert_der)
    store = verification.Store([x509.load_der_x509_certificate(ca.cert_der)])
    verified = verification.PolicyBuilder().store(store).time(NOW).build_client_verifier().verify(device, [])
    assert verified.subjects == [x509.DNSName(DEVICE)]
    assert openssl_verify(tmp_path, ca, device, "sslclient").returncode == 0


@pytest.mark.parametrize("identity", ["0a1b2c3d4e5f.alice", "0a1b2c3d4e5f.al_ice.devices.invalid",
                                      "evil.devices.invalid.example.com", "example.com"])
def test_a_device_name_outside_the_device_namespace_is_refused(ca: DeviceCA, identity: str) -> None:
    with pytest.raises(InvalidInput, match=r"devices\.invalid"):
        ca.issue_device(identity=identity, lifetime=60 * DAY)


@pytest.mark.parametrize(("identity", "addresses", "named"), [("vpn.example.org", ["192.0.2.1"], "vpn.example.org"),
                                                              ("vpn.example.net", ["198.51.100.1"], "198.51.100.1"),
                                                              ("198.51.100.9", [], "198.51.100.9")])
def test_a_gateway_the_ca_does_not_permit_is_refused_with_how_to_rotate(
        tmp_path: Path, ca: DeviceCA, identity: str, addresses: list[str], named: str) -> None:
    with pytest.raises(DeviceCAError, match=f"{re.escape(named)}.*Rotating the device CA"):
        ca.gateway(identity=identity, addresses=addresses)
    assert not (tmp_path / "ca" / "device-gateway.key").exists()


def test_a_ca_made_before_the_constraints_keeps_its_enrolments_working(tmp_path: Path) -> None:
    legacy = legacy_ca(tmp_path / "legacy")
    assert not legacy.constrained
    device = x509.load_der_x509_certificate(issue(legacy, identity="0a1b2c3d4e5f.alice").cert_der)
    signed_by(device, legacy)
    gateway = x509.load_der_x509_certificate(legacy.gateway(identity="vpn.example.org", addresses=["198.51.100.1"])
                                             .cert_der)
    verify_server(legacy, gateway, "vpn.example.org")
    again = DeviceCA.load_or_create(tmp_path / "legacy", owner="alice", gateway=["vpn.example.net"])
    assert again.cert_der == legacy.cert_der  # loaded as it is, never replaced behind the devices' back


@pytest.mark.parametrize("user", ["alice", "Alice.Smith@example.org", "x" * 63, "a." * 31 + "b", "--", "ü"])
def test_every_device_name_qoss_gives_is_one_the_ca_may_sign(ca: DeviceCA, user: str) -> None:
    name = device_identity("0a1b2c3d4e5f" + "0" * 20, user)
    assert name.endswith(".devices.invalid")
    assert name.startswith("0a1b2c3d4e5f.")
    assert len(name) <= 64
    cert = x509.load_der_x509_certificate(issue(ca, identity=name).cert_der)
    assert cn(cert) == name
