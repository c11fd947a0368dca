"""The agent client against a fake charon that speaks the real VICI protocol: the cache of its
charon's capabilities (read once, kept in memory and in the state directory, read again after
a charon restart, after the TTL, or when asked to), and ``connect``'s one pipelined exchange
with its charon (load, initiate, list-sas; or, with charon's reports, load and an initiate that
does not wait, then the report) with everything it undoes when a step fails."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.adapters.agent.crypto import CRYPTO, KeyPair, open_sealed, seal
from app.adapters.agent.transport import post_message
from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.sa_events import SaEventHub
from app.domain.agent import ClientRequest, Kind, Response, TunnelingInfo
from app.domain.errors import GatewayRejected, TunnelVerificationFailed
from app.services.agent.client import AgentClient
from app.services.agent.client_capabilities import CAPABILITIES_TTL
from app.services.agent.config import ClientConfig, Party
from tests.fakes.fake_charon import FakeCharon, Reply, child_sa_message, ike_sa_message

HOST = KeyPair.generate("host-1")
TARGET = KeyPair.generate("target-1")
USER = KeyPair.generate("alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def charon(tmp_path: Path) -> Iterator[FakeCharon]:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        yield fake


def client(tmp_path: Path, socket_path: str, clock: Clock) -> AgentClient:
    config = ClientConfig(
        user="alice", key_dir=tmp_path / "keys",
        host={"id": "host-1", "url": "http://127.0.0.1:9", **HOST.public.as_dict()},
        targets={"target-1": Party(**TARGET.public.as_dict())},
        vici_socket=socket_path, state_dir=tmp_path / "state",
    )
    return AgentClient(config=config, keys=USER, crypto=CRYPTO, vici=ViciGateway(socket_path, timeout=2.0),
                       post=post_message, clock=clock)


def reads(fake: FakeCharon) -> int:
    return fake.count("get-algorithms") + fake.count("stats")


def test_read_once_then_cached_in_memory_and_on_disk(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    first = client(tmp_path, charon.socket_path, clock)
    algorithms, native = first.capabilities()
    assert "aes128gcm16" in algorithms
    assert native is False  # kernel-libipsec: no AH, no transport mode
    assert reads(charon) == 2
    assert first.capabilities() == (algorithms, native)
    assert reads(charon) == 2
    # A new process (the next `qoss agent connect`) finds the state directory's copy.
    again = client(tmp_path, charon.socket_path, clock)
    assert again.capabilities() == (algorithms, native)
    assert reads(charon) == 2
    path = tmp_path / "state" / "capabilities.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert again.tunnels() == []  # the cache file is not a tunnel


def test_refresh_reads_again(tmp_path: Path, charon: FakeCharon) -> None:
    c = client(tmp_path, charon.socket_path, Clock())
    c.capabilities()
    charon.algorithms["aead"].pop("CHACHA20_POLY1305")
    assert "chacha20poly1305" in c.capabilities()[0]
    assert "chacha20poly1305" not in c.capabilities(refresh=True)[0]
    assert reads(charon) == 4


def test_a_restarted_charon_is_read_again(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    c = client(tmp_path, charon.socket_path, clock)
    assert c.capabilities()[1] is False
    charon.stop()
    with FakeCharon(charon.socket_path) as restarted:
        restarted.plugins.remove("kernel-libipsec")  # now kernel-netlink: AH and transport possible
        assert c.capabilities()[1] is True
        assert reads(restarted) == 2
        assert client(tmp_path, charon.socket_path, clock).capabilities()[1] is True
        assert reads(restarted) == 2


def test_read_again_after_the_ttl(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    c = client(tmp_path, charon.socket_path, clock)
    c.capabilities()
    clock.now += CAPABILITIES_TTL - 1
    c.capabilities()
    assert reads(charon) == 2
    clock.now += 2
    c.capabilities()
    assert reads(charon) == 4


def test_a_damaged_cache_file_is_ignored(tmp_path: Path, charon: FakeCharon) -> None:
    clock = Clock()
    client(tmp_path, charon.socket_path, clock).capabilities()
    path = tmp_path / "state" / "capabilities.json"
    raw = json.loads(path.read_text())
    for bad in ("not json", json.dumps({**raw, "algorithms": "aes128"}), json.dumps({**raw, "native": "yes"})):
        path.write_text(bad)
        before = reads(charon)
        assert "aes128" in client(tmp_path, charon.socket_path, clock).capabilities()[0]
        assert reads(charon) == before + 2


# --------------------------------------------------------------------------- connect: one VICI exchange

SUITE = {"protocol": "esp", "encryption": "aes128", "integrity": "sha256",
         "ike": {"encryption": "aes128", "integrity": "sha256", "prf": "prfsha256", "key_exchange": "modp2048"}}
SESSION_KEY = b"s" * 32


class FakeHost:
    """Host and Target for the client: opens the client's request and answers it as Target would
    (a response sealed to the user and signed by Target); records what it was asked."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.asked: list[ClientRequest] = []

    def __call__(self, url: str, wire: bytes) -> bytes:
        kind, body, _ = open_sealed(wire, kinds=[Kind.CONNECT, Kind.DISCONNECT], me=HOST)
        request = ClientRequest.parse(body, kind=kind)
        self.asked.append(request)
        info = None if kind is Kind.DISCONNECT else TunnelingInfo(
            ticket="ab" * 16, protection="esp", target_address="10.99.0.2", target_identity="target.example",
            client_identity="abab.alice", remote_ts=("10.2.0.1/32",), ike_proposal="aes128-sha256-prfsha256-modp2048",
            esp_proposal="aes128-sha256-modp2048", mode="tunnel", suite=SUITE, notes=(),
            expires=int(self.clock.now) + 600)
        response = Response(kind=Kind.CLOSED if info is None else Kind.RESPONSE, request_id=request.request_id,
                            session_key=None if info is None else SESSION_KEY, tunneling_info=info,
                            target="target-1", user_id="alice", host="host-1", timestamp=int(self.clock.now))
        return seal(kind=response.kind, to="alice", body=response.body(), signer=TARGET,
                    recipient=USER.public.kem)


def connecting(tmp_path: Path, charon: FakeCharon, **sa: Any) -> tuple[AgentClient, FakeHost]:
    """A client whose Host answers like Target and whose charon brings up an IKE_SA with ``sa``'s
    algorithms (the fake's defaults otherwise) and a virtual IP when asked to initiate."""
    clock = Clock()
    host = FakeHost(clock)
    c = client(tmp_path, charon.socket_path, clock)
    c._post = host

    def initiate(message: dict[str, Any]) -> Reply:
        name = message["ike"]
        charon.sas[name] = {**ike_sa_message(
            **{k: v for k, v in sa.items() if not k.startswith("child_")},
            children={name: child_sa_message(name=name, **{k[6:]: v for k, v in sa.items() if k.startswith("child_")})},
        ), "local-vips": ["10.8.0.7"]}
        return Reply({"success": "yes"}, [("control-log", {"msg": f"CHILD_SA {name}{{1}} established"})])

    charon.script("initiate", initiate)
    return c, host


def test_connect_loads_initiates_and_checks_in_one_exchange(tmp_path: Path, charon: FakeCharon) -> None:
    """Secret, conn, initiate and list-sas go to charon in that order with nothing between them
    (no event listener, no second round of commands): the tunnel's report has the virtual IP."""
    c, host = connecting(tmp_path, charon)
    c.capabilities()
    report = c.connect(target="target-1", objective_id=3)
    assert charon.commands[-4:] == ["load-shared", "load-conn", "initiate", "list-sas"]
    assert charon.commands.count("list-sas") == 1
    assert charon.listeners("child-updown") == 0
    name = report["conn"]
    assert charon.messages("initiate")[-1]["child"] == name
    assert charon.messages("list-sas")[-1] == {"ike": name}
    assert report["virtual_ip"] == "10.8.0.7"
    assert [t["ticket"] for t in c.tunnels()] == [report["ticket"]]
    assert c.tunnels()[0]["virtual_ip"] == "10.8.0.7"
    assert "s" * 32 not in json.dumps(c.tunnels())  # the session key is never written down
    assert [r.kind for r in host.asked] == [Kind.CONNECT]


def test_a_disconnect_tears_the_tunnel_down_in_one_batch(tmp_path: Path, charon: FakeCharon) -> None:
    """Terminate and both unloads go to charon at once, no list-sas first; then Target is told."""
    c, host = connecting(tmp_path, charon)
    report = c.connect(target="target-1", objective_id=3)
    before = len(charon.commands)
    c.disconnect(report["ticket"])
    assert charon.commands[before:] == ["terminate", "unload-conn", "unload-shared"]
    assert (charon.conns, charon.shared, charon.sas) == ({}, {}, {})
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]
    assert c.tunnels() == []


def test_another_suite_than_targets_fails_the_connect_and_undoes_it(tmp_path: Path, charon: FakeCharon) -> None:
    c, host = connecting(tmp_path, charon, child_encr_alg="3DES_CBC", child_encr_keysize=None)
    with pytest.raises(TunnelVerificationFailed, match="CHILD_SA encryption: negotiated 3DES_CBC"):
        c.connect(target="target-1", objective_id=3)
    assert (charon.conns, charon.shared, charon.sas) == ({}, {}, {})  # unloaded and terminated
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]  # Target closes its side
    assert c.tunnels() == []


def test_a_refused_load_fails_the_connect_with_charons_reason(tmp_path: Path, charon: FakeCharon) -> None:
    c, host = connecting(tmp_path, charon)
    charon.fail("load-conn", f"invalid proposal {SESSION_KEY.decode()}")
    with pytest.raises(GatewayRejected) as info:
        c.connect(target="target-1", objective_id=3)
    assert "load-conn: invalid proposal <secret>" in info.value.message  # the key is scrubbed
    assert SESSION_KEY.decode() not in str(info.value)
    assert charon.shared == {}
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]
    assert c.tunnels() == []


def test_a_failed_initiate_says_why_from_charons_log(tmp_path: Path, charon: FakeCharon) -> None:
    c, _ = connecting(tmp_path, charon)
    charon.fail("initiate", "establishing CHILD_SA 'x' failed",
                log=["generating IKE_AUTH request 1 [ IDi AUTH SA TSi TSr ]",
                     "received AUTHENTICATION_FAILED notify error"])
    with pytest.raises(GatewayRejected, match="AUTHENTICATION_FAILED") as info:
        c.connect(target="target-1", objective_id=3)
    assert "generating IKE_AUTH" not in info.value.message
    assert (charon.conns, charon.shared) == ({}, {})
    assert c.tunnels() == []


def test_a_record_that_cannot_be_written_undoes_the_connect(tmp_path: Path, charon: FakeCharon) -> None:
    c, host = connecting(tmp_path, charon)
    c.capabilities()
    (tmp_path / "state" / f"{'ab' * 16}.json").mkdir()  # a directory where the record goes
    with pytest.raises(IsADirectoryError):
        c.connect(target="target-1", objective_id=3)
    assert (charon.conns, charon.shared, charon.sas) == ({}, {}, {})
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]


# --------------------------------------------------------------------------- connect without waiting in charon


def reporting(tmp_path: Path, charon: FakeCharon, hub: SaEventHub, *, report: bool = True,
              **sa: Any) -> tuple[AgentClient, FakeHost]:
    """As :func:`connecting`, with charon's reports read (``hub``): an initiate that does not wait
    (timeout -1) brings the SAs up and, with ``report``, charon reports the CHILD_SA up."""
    c, host = connecting(tmp_path, charon, **sa)
    c._reports = hub
    waiting = charon._persistent["initiate"]

    def initiate(message: dict[str, Any]) -> Reply:
        reply = waiting(message)  # type: ignore[operator]
        name = message["ike"]
        if message["timeout"] == "-1" and report:
            charon.emit("child-updown", {"up": "yes", name: charon.sas[name]})
        return reply

    charon.script("initiate", initiate)
    return c, host


def test_with_reports_charon_is_not_made_to_wait_and_its_report_is_verified(
    tmp_path: Path, charon: FakeCharon, hub: SaEventHub
) -> None:
    """Secret, conn and an initiate that does not wait go to charon in one write; charon's report of
    the CHILD_SA is what is checked (no list-sas), and its virtual IP is the tunnel's."""
    c, _ = reporting(tmp_path, charon, hub)
    c.capabilities()
    report = c.connect(target="target-1", objective_id=3)
    assert charon.commands[-3:] == ["load-shared", "load-conn", "initiate"]
    assert charon.messages("initiate")[-1]["timeout"] == "-1"
    assert "list-sas" not in charon.commands
    assert charon.listeners("child-updown") == 1
    assert (hub.reported, hub.missed) == (1, 0)
    assert report["virtual_ip"] == "10.8.0.7"
    assert c.tunnels()[0]["virtual_ip"] == "10.8.0.7"


def test_with_reports_off_for_the_client_charon_waits_as_before(tmp_path: Path, charon: FakeCharon) -> None:
    hub = SaEventHub(detached=False)
    try:
        c, _ = reporting(tmp_path, charon, hub)
        c.capabilities()
        assert c.connect(target="target-1", objective_id=3)["virtual_ip"] == "10.8.0.7"
    finally:
        hub.close()
    assert charon.messages("initiate")[-1]["timeout"] == "15000"
    assert charon.commands[-4:] == ["load-shared", "load-conn", "initiate", "list-sas"]


def test_no_report_in_time_is_answered_by_list_sas(
    tmp_path: Path, charon: FakeCharon, hub: SaEventHub, quick_reports: None
) -> None:
    c, _ = reporting(tmp_path, charon, hub, report=False)
    report = c.connect(target="target-1", objective_id=3)
    assert report["virtual_ip"] == "10.8.0.7"
    assert [m["timeout"] for m in charon.messages("initiate")] == ["-1"]  # not initiated twice
    assert charon.messages("list-sas")[-1] == {"ike": report["conn"]}
    assert (hub.reported, hub.missed) == (0, 1)


def test_a_reported_suite_other_than_targets_is_checked_with_list_sas_and_fails(
    tmp_path: Path, charon: FakeCharon, hub: SaEventHub
) -> None:
    c, host = reporting(tmp_path, charon, hub, child_encr_alg="3DES_CBC", child_encr_keysize=None)
    with pytest.raises(TunnelVerificationFailed, match="CHILD_SA encryption: negotiated 3DES_CBC"):
        c.connect(target="target-1", objective_id=3)
    assert "list-sas" in charon.commands  # the report alone condemns nothing
    assert (charon.conns, charon.shared, charon.sas) == ({}, {}, {})
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]
    assert c.tunnels() == []


def test_a_detached_initiate_that_failed_is_asked_again_waiting_for_charons_reason(
    tmp_path: Path, charon: FakeCharon, hub: SaEventHub, quick_reports: None
) -> None:
    c, host = reporting(tmp_path, charon, hub)

    def refused(message: dict[str, Any]) -> Reply:
        if message["timeout"] == "-1":  # queued; what charon then does leaves no SA
            return Reply({"success": "yes"})
        return Reply({"success": "no", "errmsg": "establishing CHILD_SA failed"},
                     [("control-log", {"group": "IKE", "level": "1",
                                       "msg": "received AUTHENTICATION_FAILED notify error"})])

    charon.script("initiate", refused)
    with pytest.raises(GatewayRejected, match="AUTHENTICATION_FAILED"):
        c.connect(target="target-1", objective_id=3)
    timeouts = [m["timeout"] for m in charon.messages("initiate")]
    assert timeouts[0] == "-1"
    assert int(timeouts[1]) > 0
    assert (charon.conns, charon.shared, charon.sas) == ({}, {}, {})
    assert [r.kind for r in host.asked] == [Kind.CONNECT, Kind.DISCONNECT]
    assert c.tunnels() == []
