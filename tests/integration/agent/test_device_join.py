"""A phone joins with the VPN client it already has: ``qoss lab up --agent``, then ``qoss lab device
NAME --platform android`` enrols a device through the lab's Host and Target as its user would, and
Debian's stock ``charon-cmd`` in ``PREFIX-device`` (no qoss there) joins configured only from what the
``.sswan`` profile says. A proposal other than the negotiated one is refused; after ``--revoke`` the
live tunnel ends within 5 s and the next join is refused. The other platforms' profiles of such an
enrolment carry the negotiated suite in their own names; a platform that cannot meet the minimums
gets a refusal naming it, and no profile.

Over IPv6: a second lab, ``qoss lab up --agent --family 6`` (Target's IKE address ``fd00:71::3``,
protecting ``fd03::/64``, handing out ``fd08::/124``); charon-cmd joins Target over IPv6 from its
``.sswan`` alone, pings ``fd03::1`` from its IPv6 virtual IP through the tunnel, and revoking the
device ends the tunnel and leaves nothing on Target or the device."""

from __future__ import annotations

import base64
import configparser
import hashlib
import ipaddress
import json
import os
import plistlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from app.adapters.vici.gateway import ViciGateway
from app.domain.agent.platforms import check_names, express
from app.lab.agent import POOL, POOL6, AgentLab
from app.lab.agent_users import device
from tests.fixtures.handoff import link_parts, open_sealed_profile
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.stock_client import CharonCmd, StockProfile

pytestmark = pytest.mark.charon

_CHARON_CMD = shutil.which("charon-cmd") or "/usr/sbin/charon-cmd"


class LabCli:
    """``qoss lab …`` as an operator runs it, on a lab of its own (QOSS_LAB_DIR, --prefix)."""

    def __init__(self, root: Path, prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.env = {**os.environ, "QOSS_LAB_DIR": str(root / "lab")}

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "app.cli", "lab", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False)
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def describe(self) -> dict[str, Any]:
        return json.loads((self.root / "lab" / "agent" / "agent.json").read_text())


@contextmanager
def agent_lab(hint: str, *family: str) -> Iterator[tuple[LabCli, dict[str, Any]]]:
    """``qoss lab up --agent [--family F]`` under a prefix of its own and what it printed; always
    ``qoss lab down``, which must leave none of its namespaces."""
    assert Path(_CHARON_CMD).exists(), "charon-cmd (Debian package charon-cmd) is set up by scripts/test.sh"
    root = Path(tempfile.mkdtemp(prefix="qoss-dev-", dir="/tmp"))
    cli = LabCli(root, f"{hint}{os.getpid() % 100000}")
    try:
        up = json.loads(cli.run("up", "--agent", *family, "--prefix", cli.prefix).stdout)
        yield cli, up
    finally:
        agent = root / "lab" / "agent"  # the leak sweep reads the servers' and charons' logs for passphrases
        for log in [agent / "host.log", agent / "target.log", *agent.glob("lab/*/charon.log")]:
            if log.exists():
                keep_log(log, f"device-join-{hint}-{log.parent.name}-{log.name}")
        try:
            down = cli.run("down", check=False)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not list(Path("/run/netns").glob(f"{cli.prefix}-*"))


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    with agent_lab("qd") as made:
        yield made


@pytest.fixture(scope="module")
def ipv6_lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    """The agent lab over IPv6 (``--family 6``)."""
    with agent_lab("qd6", "--family", "6") as made:
        yield made


def enrol(cli: LabCli, user: str, platform: str, out: Path, *extra: str, check: bool = True) -> Any:
    done = cli.run("device", user, "--platform", platform, "--out", str(out), *extra, check=check)
    if not check:
        return done
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout  # one JSON line
    report = json.loads(done.stdout)
    register(report["passphrase"])  # shown once: never in a log or a database
    return report


def refused_enrolment(cli: LabCli, user: str, platform: str, out: Path, *extra: str) -> str:
    """``qoss lab device`` for ``user`` on ``platform`` refused (exit 2) with nothing written in
    ``out``; what it said on stderr."""
    done = enrol(cli, user, platform, out, *extra, check=False)
    assert done.returncode == 2
    assert not out.exists() or not any(out.iterdir())
    return str(done.stderr)


def stock_profile(report: dict[str, Any], workdir: Path) -> StockProfile:
    """Everything charon-cmd needs, read from the .sswan profile (and the passphrase shown once)."""
    profile = json.loads(Path(report["profile"]).read_text())
    workdir.mkdir(parents=True, exist_ok=True)
    ca = x509.load_der_x509_certificate(base64.b64decode(profile["remote"]["cert"]))
    (workdir / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (workdir / "device.p12").write_bytes(base64.b64decode(profile["local"]["p12"]))
    return StockProfile(host=profile["remote"]["addr"], identity=profile["local"]["id"],
                        remote_identity=profile["remote"]["id"], ike_proposal=profile["ike-proposal"],
                        esp_proposal=profile["esp-proposal"], ca_pem=workdir / "ca.pem", p12=workdir / "device.p12",
                        passphrase=report["passphrase"])


def ping(netns: str, address: str) -> bool:
    return subprocess.run(["ip", "netns", "exec", netns, "ping", "-n", "-c", "1", "-W", "1", address],
                          capture_output=True, timeout=10, check=False).returncode == 0


def wait_for(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def test_a_stock_client_joins_from_the_sswan_profile_and_revocation_ends_it(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, up = lab
    netns, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    assert not ping(netns, inside)  # no route there but the tunnel's
    report = enrol(cli, "dana", "android", tmp_path / "out", "--confidentiality", "8", "--integrity", "8")
    assert Path(report["profile"]).name.endswith(".sswan")
    assert oct(Path(report["profile"]).stat().st_mode & 0o777) == "0o600"
    assert report["passphrase"] not in Path(report["profile"]).read_text()
    profile = stock_profile(report, tmp_path / "device")
    assert (profile.ike_proposal, profile.esp_proposal) == (report["ike_proposal"], report["esp_proposal"])
    gateway = ViciGateway(target["vici_socket"], 10.0)

    # A proposal other than the negotiated one: charon refuses it.
    other_ike = "aes128-sha1-modp1024" if "aes128-sha1" not in profile.ike_proposal else "aes256-sha512-ecp521"
    refused = CharonCmd(netns, tmp_path / "refused", _with(profile, ike_proposal=other_ike), limit=30)
    with refused:
        refused.type_passphrase()
        assert refused.wait_exit(15) not in (None, 0)
    assert "NO_PROPOSAL_CHOSEN" in refused.log(), refused.log()[-2000:]

    # The profile as it is: a virtual IP, a ping across, the negotiated suite at Target.
    with CharonCmd(netns, tmp_path / "joined", profile, limit=60) as joined:
        joined.type_passphrase()
        assert wait_for(lambda: ping(netns, inside), 15, 0.2), joined.log()[-3000:]
        vip = joined.virtual_ip()
        assert vip is not None, joined.log()[-2000:]
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
        (sa,) = [sa for sa in gateway.list_sas() if sa.remote_id == profile.identity]
        child = sa.children[0]
        assert child.state == "INSTALLED"
        assert child.protocol == "ESP"
        assert _charon_names(profile.esp_proposal) == _charon_child(child)
        assert sa.local_id == profile.remote_identity

        # Revoked: the live tunnel ends within 5 s.
        started = time.monotonic()
        revoked = json.loads(cli.run("device", "dana", "--revoke").stdout)
        assert revoked == {"revoked": [report["ticket"]]}
        assert wait_for(lambda: not joined.alive() or joined.virtual_ip() is None, 5.0), joined.log()[-2000:]
        assert time.monotonic() - started <= 5.0 + 3.0  # the revoke command's own start-up included
        assert wait_for(lambda: not any(s.remote_id == profile.identity for s in gateway.list_sas()), 5.0)
    assert not ping(netns, inside)

    # ... and the next join is refused.
    again = CharonCmd(netns, tmp_path / "again", profile, limit=30)
    with again:
        again.type_passphrase()
        assert again.wait_exit(20) not in (None, 0), again.log()[-2000:]
    # Target holds nothing for it any more: charon answers the first message with a refusal.
    assert re.search(r"received (NO_PROPOSAL_CHOSEN|AUTHENTICATION_FAILED) notify", again.log()), again.log()[-2000:]
    assert not [c for c in gateway.list_conns() if c == f"qoss-agent-{report['ticket'][:16]}"]


def _with(profile: StockProfile, **changes: str) -> StockProfile:
    return StockProfile(**{**{f: getattr(profile, f) for f in profile.__dataclass_fields__}, **changes})


_CHARON = {"aes128gcm16": "AES_GCM_16-128", "aes256gcm16": "AES_GCM_16-256", "aes128": "AES_CBC-128",
           "aes256": "AES_CBC-256", "chacha20poly1305": "CHACHA20_POLY1305", "sha256": "HMAC_SHA2_256_128",
           "sha384": "HMAC_SHA2_384_192", "sha512": "HMAC_SHA2_512_256", "sha1": "HMAC_SHA1_96"}


def _charon_names(esp: str) -> list[str]:
    """The ESP proposal's encryption and integrity as charon reports them (the PFS group is for rekeys)."""
    return [_CHARON[k] for k in esp.split("-") if k in _CHARON]


def _charon_child(child: Any) -> list[str]:
    encr = f"{child.encr_alg}-{child.encr_keysize}" if child.encr_keysize else child.encr_alg
    return [n for n in (encr, child.integ_alg) if n]


def _in_names(platform: str, report: dict[str, Any]) -> dict[str, dict[str, object]]:
    """The enrolment's negotiated suite in ``platform``'s own names (lifetimes aside)."""
    named = express(platform, ike_proposal=report["ike_proposal"], esp_proposal=report["esp_proposal"],
                    ike_lifetime=14400, child_lifetime=3600)
    check_names(platform, named)
    return {part: {k: v for k, v in values.items() if k != "LifeTimeInMinutes"} for part, values in named.items()}


def test_apple_windows_and_networkmanager_profiles_carry_the_negotiated_suite_in_their_names(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, _ = lab
    apple = enrol(cli, "erin", "apple", tmp_path / "apple", "--confidentiality", "8", "--integrity", "8")
    top = plistlib.loads(Path(apple["profile"]).read_bytes())
    payloads = {p["PayloadType"]: p for p in top["PayloadContent"]}
    ikev2 = payloads["com.apple.vpn.managed"]["IKEv2"]
    want = _in_names("apple", apple)
    for part, key in (("ike", "IKESecurityAssociationParameters"), ("child", "ChildSecurityAssociationParameters")):
        got = {k: v for k, v in ikev2[key].items() if k != "LifeTimeInMinutes"}
        assert got == want[part]
    assert ikev2["RemoteIdentifier"] == apple["gateway"]["identity"]
    assert ikev2["LocalIdentifier"] == apple["identity"]
    assert apple["passphrase"].encode() not in Path(apple["profile"]).read_bytes()
    # The user asks Target, through Host, what became of the device: active.
    listed = json.loads(AgentLab(cli.root / "lab" / "agent").agent("erin", "device", "list").stdout)
    (mine,) = [d for d in listed if d["ticket"] == apple["ticket"]]
    assert mine["state"] == "active", mine

    windows = enrol(cli, "erin", "windows", tmp_path / "windows", "--confidentiality", "8", "--integrity", "8")
    script = Path(windows["profile"]).read_bytes().decode("utf-8-sig")
    (line,) = [ln for ln in script.splitlines() if ln.startswith("Set-VpnConnectionIPsecConfiguration ")]
    params = dict(re.findall(r" -(\w+) (\S+)", line))
    params.pop("ConnectionName")
    params.pop("Force", None)
    assert params == {k: str(v) for k, v in _in_names("windows", windows)["ipsec"].items()}
    assert [Path(f).name for f in windows["files"]]  # the PKCS#12 and the CA beside the script
    assert all(oct(Path(f).stat().st_mode & 0o777) == "0o600" for f in windows["files"])

    nm = enrol(cli, "erin", "networkmanager", tmp_path / "nm", "--confidentiality", "8", "--integrity", "8")
    keyfile = configparser.ConfigParser(interpolation=None)
    keyfile.read_string(Path(nm["profile"]).read_text())
    assert (keyfile["vpn"]["ike"], keyfile["vpn"]["esp"]) == (nm["ike_proposal"], nm["esp_proposal"])
    assert keyfile["vpn"]["proposal"] == "yes"


def test_a_platform_that_cannot_meet_the_minimums_is_refused_by_name_and_gets_no_profile(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, _ = lab
    says = refused_enrolment(cli, "frank", "windows", tmp_path / "out", "--integrity", "9")
    assert "Windows 10/11 built-in IKEv2" in says, says
    assert "integrity" in says
    android = enrol(cli, "frank", "android", tmp_path / "android", "--integrity", "9")  # strongSwan can
    assert android["esp_proposal"]


_FETCH = r"""
import sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(sys.argv[1], timeout=10) as answer:
        sys.stdout.buffer.write(answer.read())
        sys.stderr.write(answer.headers.get("Content-Type", ""))
except urllib.error.HTTPError as exc:
    sys.stderr.write(str(exc.code))
    sys.exit(3)
"""


def test_the_phone_fetches_its_profile_once_from_the_link(lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    """The link opens Host's page; Host serves the profile sealed, and the link's key (only in its
    fragment, never sent) opens it whole; the CA fingerprint printed beside the passphrase is the one
    the phone's Settings show for the profile's CA."""
    cli, up = lab
    report = enrol(cli, "gina", "apple", tmp_path / "out", "--link")
    assert report["link"].startswith("http://")
    assert report["passphrase"] not in report["link"]
    secret, key = link_parts(report["link"])
    sealed_url = f"{report['link'].split('#', 1)[0].removesuffix('/ui/handoff')}/v1/agent/handoffs/{secret}"

    def fetch(url: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["ip", "netns", "exec", up["device"]["netns"], sys.executable, "-I", "-S", "-c",
                               _FETCH, url], capture_output=True, timeout=30, check=False)

    page = fetch(report["link"])  # what the phone's browser asks for: the page, never the fragment
    assert page.returncode == 0, page.stderr
    assert page.stderr.decode().startswith("text/html")
    assert secret.encode() not in page.stdout
    first = fetch(sealed_url)
    assert first.returncode == 0, first.stderr
    assert first.stderr.decode() == "application/octet-stream"
    profile = Path(report["profile"]).read_bytes()
    assert report["gateway"]["address"].encode() not in first.stdout  # Host keeps what it cannot read
    assert open_sealed_profile(key, first.stdout) == profile
    (ca,) = [p["PayloadContent"] for p in plistlib.loads(profile)["PayloadContent"]
             if p["PayloadType"] == "com.apple.security.root"]
    assert report["ca_fingerprint"] == ":".join(f"{b:02X}" for b in hashlib.sha256(ca).digest())
    again = fetch(sealed_url)
    assert (again.returncode, again.stderr.decode()) == (3, "404")
    windows = enrol(cli, "gina", "windows", tmp_path / "windows", "--link", check=False)
    assert windows.returncode == 2
    assert "files beside it" in windows.stderr
    assert not (tmp_path / "windows").exists()  # refused before anything was enrolled


def ping6(netns: str, address: str) -> bool:
    return subprocess.run(["ip", "netns", "exec", netns, "ping", "-6", "-n", "-c", "1", "-W", "1", address],
                          capture_output=True, timeout=10, check=False).returncode == 0


def _selected(log: str, protocol: str) -> str:
    """What charon-cmd logged as the ``protocol`` (IKE, ESP) proposal the gateway selected."""
    found = re.search(rf"selected proposal: {protocol}:(\S+)", log)
    assert found, log[-2000:]
    return found.group(1)


def test_a_stock_client_joins_over_ipv6_from_the_sswan_profile_and_revocation_ends_it(
        ipv6_lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, up = ipv6_lab
    netns, target = up["device"]["netns"], up["target"]
    assert (up["families"], up["pool"], target["ike_address"], target["protected"]) == (
        [6], POOL6, "fd00:71::3", ["fd03::/64"])
    inside = str(ipaddress.ip_network(target["protected"][0])[1])  # fd03::1, on Target's lo
    assert not ping6(netns, inside)  # no route there but the tunnel's
    lab = AgentLab(cli.root / "lab" / "agent")
    report = device(lab, "ivy", platform="android", out_dir=str(tmp_path / "out"),
                    min_levels={"confidentiality": 8, "integrity": 8})
    register(report["passphrase"])
    profile = stock_profile(report, tmp_path / "device")
    subnets = json.loads(Path(report["profile"]).read_text())["split-tunneling"]["subnets"]
    assert (profile.host, subnets) == (target["ike_address"], target["protected"])
    gateway = ViciGateway(target["vici_socket"], 10.0)
    conn = f"qoss-agent-{report['ticket'][:16]}"

    with CharonCmd(netns, tmp_path / "joined", profile, remote_ts=subnets, ipv6=True, limit=60) as joined:
        joined.type_passphrase()
        assert wait_for(lambda: ping6(netns, inside), 15, 0.2), joined.log()[-3000:]
        vip = joined.virtual_ip()
        assert vip is not None, joined.log()[-2000:]
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL6)
        # Target's side: IKE between the IPv6 addresses, the negotiated suite, the ping counted in its SA.
        (sa,) = [sa for sa in gateway.list_sas() if sa.remote_id == profile.identity]
        assert (sa.name, sa.local_host, sa.remote_host) == (conn, "fd00:71::3", up["device"]["ike_address"])
        assert sa.remote_vips == (vip,)
        assert _charon_names(profile.ike_proposal) == _charon_child(sa)
        child = sa.children[0]
        assert (child.state, child.protocol) == ("INSTALLED", "ESP")
        assert _charon_names(profile.esp_proposal) == _charon_child(child)
        assert (child.local_ts, child.remote_ts) == (("fd03::/64",), (f"{vip}/128",))
        assert child.packets_in >= 1  # the ping crossed this SA
        assert child.packets_out >= 1
        # The device's side: charon-cmd selected the same suite and installed the same selectors.
        log = joined.log()
        for protocol, names in (("IKE", _charon_child(sa)), ("ESP", _charon_child(child))):
            assert all(name.replace("-", "_") in _selected(log, protocol) for name in names), log[-2000:]
        assert f"TS {vip}/128 === fd03::/64" in log, log[-2000:]

        # Revoked: the live tunnel ends within 5 s.
        started = time.monotonic()
        lab.agent("ivy", "device", "revoke", report["ticket"])
        assert wait_for(lambda: not joined.alive() or joined.virtual_ip() is None, 5.0), joined.log()[-2000:]
        assert time.monotonic() - started <= 5.0 + 3.0  # the revoke command's own start-up included
        assert wait_for(lambda: not any(s.remote_id == profile.identity for s in gateway.list_sas()), 5.0)
    assert not ping6(netns, inside)
    # Nothing left behind: no conn or pool for the device on Target, no TUN device on the device.
    assert conn not in gateway.list_conns()
    assert not [p for p in gateway.get_pools() if p.name.startswith(conn)]
    assert subprocess.run(["ip", "-n", netns, "link", "show", "ipsec0"], capture_output=True, timeout=5,
                          check=False).returncode != 0
