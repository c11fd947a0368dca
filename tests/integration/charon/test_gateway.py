"""ViciGateway against real charons (strongSwan 5.9.8, kernel-libipsec) in network namespaces."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from app.adapters.vici import EventKind, EventListener, SaEvent, ViciGateway
from app.adapters.vici.session import unix_connect
from app.domain.algorithms import lookup
from app.domain.errors import GatewayRejected, GatewayUnreachable
from app.domain.tunnels import keywords_from_charon
from app.lab.hosts import Lab
from app.lab.processes import LabError
from tests.integration.charon.conftest import PSK, Pair, clean_up, conn, load_both, ping, sas, temporary_lab

pytestmark = pytest.mark.charon

VARIABLE_KEY = ("AES_", "CAMELLIA_", "BLOWFISH_")


def _expected(esp: str) -> tuple[str, int | None, str | None]:
    """(encr sa_name, keysize, integ sa_name) for a one-proposal ESP string."""
    parts = [lookup(p) for p in esp.split("-")]
    encr = parts[0]
    integ = parts[1].sa_name if len(parts) > 1 else None
    keysize = encr.key_size if encr.sa_name.startswith(VARIABLE_KEY) else None
    return encr.sa_name, keysize, integ


def _nothing_left(pair: Pair) -> None:
    for peer in (pair.left, pair.right):
        assert peer.gateway.list_conns() == []
        assert peer.gateway.get_shared() == []
        assert peer.gateway.list_sas() == []


def test_version_and_stats_report_libipsec(pair: Pair) -> None:
    for peer in (pair.left, pair.right):
        version = peer.gateway.version()
        assert version.daemon == "charon"
        assert version.version.startswith("5.9")
        stats = peer.gateway.stats()
        assert stats.backend == "kernel-libipsec"
        assert {"kernel-libipsec", "vici"} <= set(stats.plugins)


def test_get_algorithms_lists_the_common_ones(pair: Pair) -> None:
    algs = pair.left.gateway.get_algorithms()
    assert {"AES_CBC", "3DES_CBC"} <= set(algs.encryption)
    assert {"AES_GCM_16", "CHACHA20_POLY1305"} <= set(algs.aead)
    assert {"HMAC_SHA1_96", "HMAC_SHA2_256_128"} <= set(algs.integrity)
    assert {"MODP_2048", "CURVE_25519", "ECP_256"} <= set(algs.ke)
    keywords = keywords_from_charon(algs.as_sections())
    assert {"aes128", "aes256", "sha256", "sha1", "modp2048", "x25519", "aes128gcm16"} <= keywords


@pytest.mark.parametrize(
    ("ike", "esp"),
    [
        ("aes128gcm16-prfsha256-x25519", "aes128gcm16"),
        ("aes128-sha256-modp2048", "chacha20poly1305"),
        ("aes128-sha256-modp2048", "aes128-sha256"),
        ("aes128gcm16-prfsha256-x25519", "aes256-sha512"),
        ("aes128-sha256-modp2048", "3des-sha1"),
    ],
)
def test_tunnel_up_verified_on_both_ends_and_torn_down(pair: Pair, ike: str, esp: str) -> None:
    name = "t-" + esp.replace("-", "")
    ike_parts = [lookup(p) for p in ike.split("-")]
    encr, keysize, integ = _expected(esp)
    try:
        load_both(pair, name, ike, esp)
        assert name in pair.left.gateway.list_conns()
        assert name in pair.right.gateway.get_shared()
        log = pair.left.gateway.initiate(child=name, ike=name, timeout_ms=5000)
        assert any("established" in line for line in log)
        for peer in (pair.left, pair.right):
            (ike_sa,) = sas(peer, name)
            assert ike_sa.state == "ESTABLISHED"
            assert ike_sa.encr_alg == ike_parts[0].sa_name
            assert ike_sa.encr_keysize == 128
            assert ike_sa.dh_group == ike_parts[-1].sa_name
            (child,) = ike_sa.children
            assert (child.state, child.protocol, child.mode) == ("INSTALLED", "ESP", "TUNNEL")
            assert (child.encr_alg, child.encr_keysize, child.integ_alg) == (encr, keysize, integ)
            assert child.local_ts == (f"{peer.host.inside_address}/32",)
        result = ping(pair)
        assert result.returncode == 0, result.stdout + result.stderr
        (child,) = sas(pair.left, name)[0].children
        assert child.packets_out >= 2
        assert child.bytes_out > 0
        (ike_sa,) = sas(pair.left, name)
        pair.left.gateway.terminate(ike_id=ike_sa.uniqueid, timeout_ms=3000)
        for peer in (pair.left, pair.right):
            peer.gateway.unload_conn(name)
            peer.gateway.unload_shared(name)
        _nothing_left(pair)
    finally:
        clean_up(pair, name)


def test_mismatched_esp_is_rejected_with_no_proposal_chosen(pair: Pair) -> None:
    name = "t-mismatch"
    try:
        load_both(pair, name, "aes128-sha256-modp2048", "aes128-sha256", esp_right="aes256-sha512")
        with pytest.raises(GatewayRejected, match="NO_PROPOSAL_CHOSEN") as info:
            pair.left.gateway.initiate(child=name, ike=name, timeout_ms=5000)
        assert "establishing CHILD_SA" in str(info.value)
        for peer in (pair.left, pair.right):
            assert all(not sa.children for sa in sas(peer, name))
    finally:
        clean_up(pair, name)
    _nothing_left(pair)


def test_mismatched_ike_is_rejected_with_no_proposal_chosen(pair: Pair) -> None:
    name = "t-ikemismatch"
    try:
        for me, peer, ike in ((pair.right, pair.left, "aes256-sha512-ecp384"),
                              (pair.left, pair.right, "aes128-sha256-modp2048")):
            me.gateway.load_shared(name, PSK, ["left", "right"])
            me.gateway.load_conn(name, conn(me=me.host, peer=peer.host, name=name, ike=ike, esp="aes128-sha256"))
        with pytest.raises(GatewayRejected, match="NO_PROPOSAL_CHOSEN"):
            pair.left.gateway.initiate(child=name, ike=name, timeout_ms=5000)
    finally:
        clean_up(pair, name)
    _nothing_left(pair)


def test_events_report_up_and_down(pair: Pair) -> None:
    name = "t-events"
    events: list[SaEvent] = []
    with EventListener(pair.right.host.vici_socket, events.append, poll_interval=0.05):
        try:
            load_both(pair, name, "aes128gcm16-prfsha256-x25519", "aes128gcm16")
            pair.left.gateway.initiate(child=name, ike=name, timeout_ms=5000)
            (ike_sa,) = sas(pair.left, name)
            pair.left.gateway.terminate(ike_id=ike_sa.uniqueid, timeout_ms=3000)
        finally:
            clean_up(pair, name)
        seen: set[tuple[EventKind, bool | None]] = set()
        for _ in range(100):
            seen = {(e.kind, e.up) for e in events if e.ike_name == name}
            if (EventKind.IKE_UPDOWN, False) in seen:
                break
            time.sleep(0.02)
    assert {(EventKind.IKE_UPDOWN, True), (EventKind.CHILD_UPDOWN, True),
            (EventKind.IKE_UPDOWN, False)} <= seen
    up = next(e for e in events if e.kind is EventKind.CHILD_UPDOWN and e.up)
    assert [c.encr_alg for c in up.children] == ["AES_GCM_16"]


def test_set_ups_at_once_from_one_lab_host_are_all_answered(pair: Pair) -> None:
    """Twelve IKE_SA_INITs in flight at once from one host: the responder answers every one
    (with charon's DoS protection it drops all beyond five half-open from one address)."""
    names = [f"t-burst-{i}" for i in range(12)]
    log = Path(pair.right.host.log_path)
    offset = log.stat().st_size
    try:
        for name in names:
            for me, peer in ((pair.right, pair.left), (pair.left, pair.right)):
                ids = [f"{name}.{h.host.name}" for h in (me, peer)]
                me.gateway.load_shared(name, PSK, ids)
                me.gateway.load_conn(name, {**conn(me=me.host, peer=peer.host, name=name, ike="aes128gcm16-prfsha256"
                                                   "-x25519", esp="aes128gcm16"),
                                            "local": {"auth": "psk", "id": ids[0]},
                                            "remote": {"auth": "psk", "id": ids[1]}})
        with unix_connect(pair.left.host.vici_socket, 10.0) as session:
            for name in names:  # a negative timeout: charon answers at once and initiates in the background
                for _ in session.initiate({"child": name, "ike": name, "timeout": -1}):
                    pass
        up: set[str] = set()
        for _ in range(150):
            up = {sa.name for sa in pair.right.gateway.list_sas() if sa.state == "ESTABLISHED" and sa.children}
            if up >= set(names):
                break
            time.sleep(0.1)
        with log.open(errors="replace") as f:
            f.seek(offset)
            dropped = [line for line in f if "half-open IKE_SA limit" in line]
        assert dropped == []
        assert up >= set(names)
    finally:
        for name in names:
            clean_up(pair, name)


def test_secret_is_not_in_errors_from_real_charon(pair: Pair) -> None:
    with pytest.raises(GatewayRejected) as info:
        pair.left.gateway.load_shared("t-badtype", PSK, ["left"], type="NOPE")
    assert PSK not in str(info.value)
    assert pair.left.gateway.get_shared() == []


def test_stopped_charon_is_unreachable() -> None:
    with temporary_lab("qs") as lab:
        host = lab.host("right")
        gateway = host.gateway(timeout=2.0)
        assert gateway.version().daemon == "charon"
        lab.stop_charon("right")
        assert not lab.status().charons["right"]
        with pytest.raises(GatewayUnreachable) as info:
            gateway.list_sas()
        assert info.value.socket_path == host.vici_socket
        assert isinstance(info.value.__cause__, OSError)
        with pytest.raises(GatewayUnreachable):
            ViciGateway(host.vici_socket).load_shared("x", PSK, ["left"])


def test_failed_up_leaves_nothing_behind(tmp_path_factory: pytest.TempPathFactory) -> None:
    state = tmp_path_factory.mktemp("lab")
    lab = Lab(state, prefix="qfail", charon="/nonexistent/charon", startup_timeout=3.0)
    with pytest.raises(LabError, match="charon on left"):
        lab.up()
    assert not (state / "lab.json").exists()
    status = lab.status()
    assert status.namespaces == {}
    lab.down()  # idempotent
    assert not Path("/run/netns/qfail-left").exists()
    assert not Path("/run/netns/qfail-right").exists()


def test_three_hosts_share_a_bridge(tmp_path_factory: pytest.TempPathFactory) -> None:
    state = tmp_path_factory.mktemp("lab3")
    lab = Lab(state, prefix="qtri")
    try:
        hosts = lab.up(names=["client", "host", "target"])
        assert [h.netns for h in hosts] == ["qtri-client", "qtri-host", "qtri-target"]
        assert [h.ike_address for h in hosts] == ["10.99.0.1", "10.99.0.2", "10.99.0.3"]
        assert lab.status().healthy
        for h in hosts:
            assert h.gateway().stats().backend == "kernel-libipsec"
        result = subprocess.run(["ip", "netns", "exec", "qtri-client", "ping", "-c", "1", "-W", "1", "10.99.0.3"],
                                capture_output=True, text=True, timeout=10, check=False)
        assert result.returncode == 0, result.stdout
    finally:
        lab.down()
    assert not any(Path("/run/netns", n).exists() for n in ("qtri-client", "qtri-host", "qtri-target", "qtri-hub"))
    assert not lab.status().namespaces
