"""Devices with a post-quantum minimum, in the agent lab (``qoss lab up --agent``): ``qoss lab device
NAME --platform P --post-quantum N`` enrols through the lab's Host and Target as a user would.

- swanctl: a real charon in ``PREFIX-device`` (its own mount namespace, kernel-libipsec), configured
  by ``swanctl --load-all`` from the profile and its files alone (plus the PKCS#12 passphrase a user
  would type), joins Target with the profile's PPK: both charons list the IKE SA with ``/PPK`` and a
  ping crosses. The same connection without the PPK is refused by Target.
- apple: the ``.mobileconfig`` reads back (plistlib) with ``PPK``, ``PPKIdentifier`` and
  ``PPKMandatory``; its PPK is the one Target keeps (sealed in its database, opened here with its
  key), and it is the one Target's charon holds: a charon in ``PREFIX-device`` standing in for the
  Apple client, configured from the profile's values (its identity, its PKCS#12, its PPK), joins
  with ``/PPK`` and a ping crosses, and with any other PPK it is refused.
- android: the same minimum is refused naming the platform and why, and nothing is written.
- a user's own tunnel (``qoss lab join NAME --post-quantum 5``, run in-process: the same group and
  exit path as the script; its ``qoss agent connect`` is a real process in the client's namespace):
  the PPK at both ends, a ping crosses; without the minimum, none.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import plistlib
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import pkcs12
from typer.testing import CliRunner

from app.adapters.agent.devices import LocalDeviceKit
from app.adapters.agent.profiles import parse_swanctl
from app.adapters.vici.gateway import ViciGateway
from app.cli.main import app
from app.lab.agent import TARGET_ID
from app.lab.charon import start_charon, wait_for_charon
from app.lab.processes import private_dir
from tests.fixtures.secrets import keep_log, register
from tests.integration.agent.test_device_join import LabCli, agent_lab, enrol, ping, refused_enrolment, wait_for

pytestmark = pytest.mark.charon


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    with agent_lab("qp") as made:
        yield made


class DeviceCharon:
    """A charon in the device's namespace (a mount namespace of its own, as the lab's hosts have),
    configured with swanctl from ``SWANCTL_DIR`` = ``workdir/swanctl``; stopped on leaving."""

    def __init__(self, netns: str, workdir: Path) -> None:
        self.netns = netns
        self.home = private_dir(workdir / "charon")
        self.swanctl_dir = private_dir(workdir / "swanctl")
        for sub in ("conf.d", "pkcs12", "x509ca"):
            private_dir(self.swanctl_dir / sub)
        (self.swanctl_dir / "swanctl.conf").write_text("include conf.d/*.conf\n")
        self.socket = str(self.home / "charon.vici")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DeviceCharon:
        self.proc = start_charon(netns=self.netns, host_dir=self.home, conf=str(self.home / "strongswan.conf"))
        try:
            wait_for_charon(name="device", vici_socket=self.socket, log_path=str(self.home / "charon.log"),
                            proc=self.proc, timeout=20)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this charon was started in, only
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        keep_log(self.home / "charon.log", f"device-pq-{self.home.parent.name}-charon.log")

    def swanctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, "env", f"SWANCTL_DIR={self.swanctl_dir}", "swanctl", *args,
             "--uri", f"unix://{self.socket}"], capture_output=True, text=True, timeout=timeout, check=False)

    def load(self) -> None:
        done = self.swanctl("--load-all", "--noprompt", "--file", str(self.swanctl_dir / "swanctl.conf"))
        assert done.returncode == 0, done.stdout + done.stderr

    def initiate(self, child: str) -> subprocess.CompletedProcess[str]:
        return self.swanctl("--initiate", "--child", child, "--timeout", "15", timeout=30)

    def list_sas(self) -> str:
        return self.swanctl("--list-sas").stdout

    def log(self) -> str:
        path = self.home / "charon.log"
        return path.read_text(errors="replace") if path.exists() else ""


def kept_ppk(cli: LabCli, ticket: str) -> tuple[str, bytes]:
    """The PPK Target keeps for ``ticket``: its id, and the key opened from the sealed copy in
    Target's database with Target's own sealing key (the lab's key directory)."""
    agent = cli.root / "lab" / "agent"
    keep_log(agent / "target.db", "device-pq-target.db")  # the sweep: the PPK is nowhere in it in clear
    with contextlib.closing(sqlite3.connect(agent / "target.db")) as db:
        (suite,) = db.execute("SELECT suite FROM agent_sessions WHERE ticket = ?", (ticket,)).fetchone()
    kept = (json.loads(suite) if isinstance(suite, str) else suite)["ppk"]
    kit = LocalDeviceKit(agent / "keys", owner=TARGET_ID)
    return kept["id"], kit.open_ppk(kept["sealed"], context=f"{ticket} {kept['id']}")


def _ppk_sa(listing: str) -> bool:
    return any(line.strip().endswith("/PPK") for line in listing.splitlines())


def test_a_swanctl_device_joins_with_the_ppk_of_its_profile(lab: tuple[LabCli, dict[str, Any]],
                                                            tmp_path: Path) -> None:
    cli, up = lab
    netns, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    report = enrol(cli, "pia", "swanctl", tmp_path / "out", "--post-quantum", "5")
    text = Path(report["profile"]).read_text()
    assert "ppk_required" in text
    ppk_id, ppk = kept_ppk(cli, report["ticket"])
    register(ppk)
    assert f'"0s{base64.b64encode(ppk).decode()}"' in text  # the profile holds the PPK Target keeps
    assert ppk_id in text
    gateway = ViciGateway(target["vici_socket"], 10.0)
    conn = f"qoss-agent-{report['ticket'][:16]}"
    assert conn in gateway.get_shared()  # the PPK, loaded as the conn's shared secret
    (conn_conf,) = parse_swanctl(text)["connections"].values()  # type: ignore[union-attr]
    (child,) = conn_conf["children"]

    with DeviceCharon(netns, tmp_path / "joined") as device:
        _install(device, report, text)
        device.load()
        done = device.initiate(child)
        assert done.returncode == 0, done.stdout + done.stderr + device.log()[-3000:]
        assert _ppk_sa(device.list_sas()), device.list_sas()
        (sa,) = [sa for sa in gateway.list_sas() if sa.name == conn]
        assert sa.state == "ESTABLISHED"
        listing = subprocess.run(["swanctl", "--list-sas", "--uri", f"unix://{target['vici_socket']}"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout
        assert _ppk_sa(listing), listing
        assert wait_for(lambda: ping(netns, inside), 15, 0.2), device.log()[-3000:]

    # Without the PPK, the same device is refused: Target's conn requires it.
    without = "\n".join(line for line in text.splitlines() if "ppk_" not in line)
    with DeviceCharon(netns, tmp_path / "without") as device:
        _install(device, report, without)
        device.load()
        done = device.initiate(child)
        assert done.returncode != 0, done.stdout
        assert not ping(netns, inside)


def _install(device: DeviceCharon, report: dict[str, Any], conf: str) -> None:
    """The profile as its header says (files into pkcs12/ and x509ca/, the conf into conf.d/), and
    the PKCS#12 passphrase the user types at ``swanctl --load-all``, as a secret of its own."""
    for path in report["files"]:
        name = Path(path).name
        folder = "pkcs12" if name.endswith(".p12") else "x509ca"
        (device.swanctl_dir / folder / name).write_bytes(Path(path).read_bytes())
    (device.swanctl_dir / "conf.d" / "device.conf").write_text(conf)
    p12 = next(Path(p).name for p in report["files"] if p.endswith(".p12"))
    passphrase = report["passphrase"]
    (device.swanctl_dir / "conf.d" / "passphrase.conf").write_text(
        f'secrets {{\n    pkcs12-device {{\n        file = {p12}\n        secret = "{passphrase}"\n    }}\n}}\n')


def test_an_apple_profile_carries_the_ppk_targets_charon_holds(lab: tuple[LabCli, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    cli, up = lab
    netns, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    report = enrol(cli, "quinn", "apple", tmp_path / "out", "--post-quantum", "5")
    top = plistlib.loads(Path(report["profile"]).read_bytes())
    payloads = {p["PayloadType"]: p for p in top["PayloadContent"]}
    ikev2 = payloads["com.apple.vpn.managed"]["IKEv2"]
    assert isinstance(ikev2["PPK"], bytes)
    assert len(ikev2["PPK"]) == 32
    assert ikev2["PPKMandatory"] == 1
    register(ikev2["PPK"])
    assert kept_ppk(cli, report["ticket"]) == (ikev2["PPKIdentifier"], ikev2["PPK"])

    # A charon standing in for the Apple client, with what the profile says: Target's charon takes
    # exactly that PPK (and its id), and refuses another.
    p12 = payloads["com.apple.security.pkcs12"]["PayloadContent"]
    key, cert, _ = pkcs12.load_key_and_certificates(p12, report["passphrase"].encode())
    assert key is not None
    assert cert is not None
    for attempt, ppk in (("apple", ikev2["PPK"]), ("other", os.urandom(32))):
        with DeviceCharon(netns, tmp_path / attempt) as device:
            (device.swanctl_dir / "pkcs12" / "apple.p12").write_bytes(p12)
            (device.swanctl_dir / "conf.d" / "apple.conf").write_text(_apple_stand_in(ikev2, report, ppk,
                                                                                             target["protected"]))
            device.load()
            done = device.initiate("apple")
            if attempt == "apple":
                assert done.returncode == 0, done.stdout + done.stderr + device.log()[-3000:]
                assert _ppk_sa(device.list_sas()), device.list_sas()
                assert wait_for(lambda: ping(netns, inside), 15, 0.2), device.log()[-3000:]
            else:
                assert done.returncode != 0, done.stdout
                assert not ping(netns, inside)


def _apple_stand_in(ikev2: dict[str, Any], report: dict[str, Any], ppk: bytes, remote_ts: list[str]) -> str:
    """swanctl.conf for a charon that does what the Apple client does with this profile: its
    LocalIdentifier, the PKCS#12, the negotiated proposals, and the PPK under PPKIdentifier."""
    return f"""connections {{
    apple {{
        remote_addrs = {ikev2["RemoteAddress"]}
        vips = 0.0.0.0
        proposals = {report["ike_proposal"]}
        ppk_id = {ikev2["PPKIdentifier"]}
        ppk_required = yes
        local {{
            auth = pubkey
            id = {ikev2["LocalIdentifier"]}
        }}
        remote {{
            auth = pubkey
            id = {ikev2["RemoteIdentifier"]}
        }}
        children {{
            apple {{
                remote_ts = {",".join(remote_ts)}
                esp_proposals = {report["esp_proposal"]}
                start_action = none
            }}
        }}
    }}
}}
secrets {{
    pkcs12-apple {{
        file = apple.p12
        secret = "{report["passphrase"]}"
    }}
    ppk-apple {{
        id = {ikev2["PPKIdentifier"]}
        secret = 0x{ppk.hex()}
    }}
}}
"""


def test_an_android_enrolment_with_a_post_quantum_minimum_is_refused_naming_the_platform(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, _ = lab
    says = refused_enrolment(cli, "rosa", "android", tmp_path / "out", "--post-quantum", "5")
    assert "strongSwan VPN Client for Android (android)" in says, says
    assert "the strongSwan app has no post-quantum setting" in says


def _list_sas(vici_socket: str, conn: str) -> str:
    return subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{vici_socket}"],
                          capture_output=True, text=True, timeout=20, check=False).stdout


def _joined(cli: LabCli, *args: str) -> dict[str, Any]:
    """``qoss lab join ARGS`` on ``cli``'s lab, in-process; what it printed."""
    done = CliRunner().invoke(app, ["lab", "join", *args], env={"QOSS_LAB_DIR": str(cli.root / "lab")})
    assert done.exit_code == 0, (done.exit_code, done.stdout, done.stderr[-3000:])
    printed: dict[str, Any] = json.loads(done.stdout)
    return printed


def test_a_users_tunnel_with_a_post_quantum_minimum_has_the_ppk_at_both_ends(lab: tuple[LabCli, dict[str, Any]]
                                                                             ) -> None:
    """``qoss lab join NAME --post-quantum 5`` (``qoss agent connect --post-quantum 5``): Target makes
    the PPK, loads it, and hands it to the client sealed hybrid; both charons list ``/PPK`` and the
    ping crosses. Without the minimum, no PPK."""
    cli, up = lab
    joined = _joined(cli, "sam", "--post-quantum", "5")
    assert joined["ping"]["crossed"], joined
    for role in ("client", "target"):
        listing = _list_sas(up[role]["vici_socket"], joined["conn"])
        assert joined["conn"] in listing
        assert _ppk_sa(listing), listing
    plain = _joined(cli, "tara")
    assert plain["ping"]["crossed"], plain
    for role in ("client", "target"):
        listing = _list_sas(up[role]["vici_socket"], plain["conn"])
        assert plain["conn"] in listing
        assert not _ppk_sa(listing), listing
