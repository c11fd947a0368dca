"""ViciGateway against the fake charon: typed decoding, streamed replies, error mapping."""

from __future__ import annotations

import logging
import socket
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import vici

from app.adapters.vici import ChildSa, IkeSa, ViciGateway
from app.adapters.vici.commands import (
    Command,
    initiate_command,
    list_sas_command,
    load_conn_command,
    load_pool_command,
    load_shared_command,
    sas_of,
    unload_command,
)
from app.adapters.vici.session import Connect, SessionPool, unix_connect
from app.domain.errors import GatewayError, GatewayRejected, GatewayUnreachable
from tests.fakes import FakeCharon, Reply, child_sa_message, ike_sa_message

SECRET = "correct-horse-battery-staple-4242"


def _no_bytes(value: Any) -> None:
    assert not isinstance(value, bytes | bytearray), value
    if isinstance(value, dict):
        for k, v in value.items():
            _no_bytes(k)
            _no_bytes(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _no_bytes(v)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _no_bytes(getattr(value, name))


def _chain_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


# -- decoding ------------------------------------------------------------------------------


def test_version_is_decoded(gateway: ViciGateway) -> None:
    info = gateway.version()
    assert (info.daemon, info.version, info.machine) == ("charon", "5.9.8", "x86_64")
    _no_bytes(info)


def test_stats_derives_libipsec_backend(gateway: ViciGateway) -> None:
    stats = gateway.stats()
    assert stats.backend == "kernel-libipsec"
    assert "vici" in stats.plugins
    assert stats.workers_total == 16
    _no_bytes(stats)


def test_stats_netlink_backend_without_libipsec(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.plugins = ["charon", "openssl", "kernel-netlink", "vici"]
    assert gateway.stats().backend == "kernel-netlink"


def test_stats_no_backend(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.plugins = ["charon", "openssl", "vici"]
    assert gateway.stats().backend is None


def test_get_algorithms_normalises_dh_section(gateway: ViciGateway) -> None:
    algs = gateway.get_algorithms()
    assert algs.ke == {"MODP_2048": "openssl", "CURVE_25519": "openssl"}
    assert algs.encryption["AES_CBC"] == "aesni"
    assert "AES_GCM_16" in algs.aead
    assert "hasher" in algs.other
    assert "dh" not in algs.as_sections()
    assert algs.as_sections()["ke"] == algs.ke


def test_get_algorithms_reads_6_0_ke_section(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.algorithms = {"ke": {"ML_KEM_768": "ml"}, "encryption": {"AES_CBC": "aes"}}
    assert gateway.get_algorithms().ke == {"ML_KEM_768": "ml"}


def test_list_sas_decodes_ike_and_child(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.sas["qoss-t1"] = ike_sa_message(
        uniqueid=7, encr_alg="AES_GCM_16", encr_keysize=128, integ_alg=None, dh_group="CURVE_25519",
        children={"qoss-t1-3": child_sa_message(name="qoss-t1", uniqueid=3, encr_alg="CHACHA20_POLY1305",
                                                 encr_keysize=None, integ_alg=None, bytes_in=1400, bytes_out=2800)},
    )
    fake.sas["other"] = ike_sa_message(uniqueid=8)
    sas = gateway.list_sas()
    assert [sa.name for sa in sas] == ["qoss-t1", "other"]
    sa = sas[0]
    assert isinstance(sa, IkeSa)
    assert (sa.uniqueid, sa.state, sa.encr_alg, sa.encr_keysize, sa.integ_alg, sa.prf_alg, sa.dh_group) == (
        7, "ESTABLISHED", "AES_GCM_16", 128, None, "PRF_HMAC_SHA2_256", "CURVE_25519")
    assert (sa.local_host, sa.remote_host, sa.local_id, sa.remote_id, sa.initiator) == (
        "10.99.0.1", "10.99.0.2", "left", "right", True)
    (child,) = sa.children
    assert isinstance(child, ChildSa)
    assert (child.name, child.uniqueid, child.state, child.protocol, child.mode) == (
        "qoss-t1", 3, "INSTALLED", "ESP", "TUNNEL")
    assert (child.encr_alg, child.encr_keysize, child.integ_alg) == ("CHACHA20_POLY1305", None, None)
    assert (child.bytes_in, child.bytes_out, child.packets_in, child.packets_out) == (1400, 2800, 14, 28)
    assert (child.local_ts, child.remote_ts) == (("10.1.0.1/32",), ("10.2.0.1/32",))
    _no_bytes(sas)


def test_list_sas_filters_by_ike(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.sas["a"] = ike_sa_message(uniqueid=1)
    fake.sas["b"] = ike_sa_message(uniqueid=2)
    assert [sa.name for sa in gateway.list_sas(ike="b")] == ["b"]
    assert fake.messages("list-sas")[-1]["ike"] == "b"


def test_streamed_reply_is_consumed_so_the_next_command_works(fake: FakeCharon) -> None:
    # One session for two commands: only works if the first stream was read to the end.
    for i in range(5):
        fake.sas[f"sa{i}"] = ike_sa_message(uniqueid=i)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(fake.socket_path)
    session = vici.Session(sock=sock)

    @contextmanager
    def shared(path: str, timeout: float) -> Iterator[Any]:
        yield session

    try:
        gateway = ViciGateway(fake.socket_path, connect=shared)
        assert len(gateway.list_sas()) == 5
        assert gateway.version().daemon == "charon"
        assert len(gateway.list_sas()) == 5
    finally:
        sock.close()


def test_conn_secret_pool_round_trip(fake: FakeCharon, gateway: ViciGateway) -> None:
    gateway.load_conn("qoss-t1", {"version": "2", "proposals": ["aes128-sha256-modp2048"],
                                  "children": {"qoss-t1": {"esp_proposals": ["aes128-sha256"]}}})
    gateway.load_shared("qoss-t1", SECRET.encode(), ["left", "right"])
    gateway.load_pool("mobile", "10.3.0.0/28", {"dns": ["10.1.0.53"]})
    assert gateway.list_conns() == ["qoss-t1"]
    assert gateway.get_shared() == ["qoss-t1"]
    (pool,) = gateway.get_pools()
    assert (pool.name, pool.base, pool.size, pool.leases) == ("mobile", "10.3.0.0", 14, ())
    assert fake.messages("load-conn")[0]["qoss-t1"]["children"]["qoss-t1"]["esp_proposals"] == ["aes128-sha256"]
    assert fake.messages("load-shared")[0] == {
        "id": "qoss-t1", "type": "IKE", "data": SECRET, "owners": ["left", "right"]}
    assert fake.messages("load-pool")[0] == {"mobile": {"addrs": "10.3.0.0/28", "dns": ["10.1.0.53"]}}
    gateway.unload_conn("qoss-t1")
    gateway.unload_shared("qoss-t1")
    gateway.unload_pool("mobile")
    assert (gateway.list_conns(), gateway.get_shared(), gateway.get_pools()) == ([], [], [])


# -- batches ------------------------------------------------------------------------------


def _loads() -> list[Command]:
    return [load_pool_command("qoss-t1", "10.3.0.2/32"), load_shared_command("qoss-t1", SECRET, ["left", "right"]),
            load_conn_command("qoss-t1", {"version": "2", "proposals": ["aes128-sha256-modp2048"]})]


def test_batch_runs_each_command_in_order_on_one_connection(fake: FakeCharon, gateway: ViciGateway) -> None:
    replies = gateway.batch(_loads())
    assert replies == [{"success": "yes"}] * 3
    assert fake.commands == ["load-pool", "load-shared", "load-conn"]
    assert (list(fake.pools), list(fake.shared), list(fake.conns)) == (["qoss-t1"], ["qoss-t1"], ["qoss-t1"])
    assert fake.messages("load-shared")[0]["data"] == SECRET
    replies = gateway.batch([unload_command(w, "qoss-t1") for w in ("conn", "shared", "pool")])
    assert replies == [{"success": "yes"}] * 3
    assert (fake.pools, fake.shared, fake.conns) == ({}, {}, {})
    assert gateway.batch([]) == []


def test_batch_refusal_is_that_commands_own_and_keeps_the_secret(
    fake: FakeCharon, gateway: ViciGateway, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("load-shared", lambda msg: Reply({"success": "no", "errmsg": f"bad secret {msg['data']}"}))
    caplog.set_level(logging.DEBUG)
    pool, shared, conn = gateway.batch(_loads())
    assert pool == conn == {"success": "yes"}
    assert isinstance(shared, GatewayRejected)
    assert "load-shared: bad secret <secret>" in str(shared)
    assert SECRET not in _chain_text(shared)
    assert SECRET not in caplog.text
    assert list(fake.conns) == ["qoss-t1"]  # the others ran
    assert gateway.version().daemon == "charon"  # and the connection is still in step


def test_batch_socket_failure_is_unreachable_for_the_whole_batch(fake: FakeCharon) -> None:
    fake.drop("load-shared")
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pool=None)
    with pytest.raises(GatewayUnreachable) as info:
        gateway.batch(_loads())
    assert SECRET not in _chain_text(info.value)
    with pytest.raises(ValueError, match="nothing to unload"):
        unload_command("ike", "x")


@contextmanager
def _answering_after_three() -> Iterator[tuple[Connect, list[bytes]]]:
    """A VICI peer that answers only once it has received three requests (each ``success``):
    a client that waits for a reply before sending the next request deadlocks (until its
    timeout). Yields the :data:`Connect` seam to it and the request packets it received."""
    from tests.fakes.fake_charon import CMD_RESPONSE, encode_message

    ours, theirs = socket.socketpair()
    received: list[bytes] = []

    def serve() -> None:
        data = b""
        while len(received) < 3:
            chunk = theirs.recv(65536)
            if not chunk:
                return
            data += chunk
            while len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
                size = int.from_bytes(data[:4], "big")
                received.append(data[4:4 + size])
                data = data[4 + size:]
        for _ in received:
            reply = bytes([CMD_RESPONSE]) + encode_message({"success": "yes"})
            theirs.sendall(len(reply).to_bytes(4, "big") + reply)

    @contextmanager
    def connect(path: str, timeout: float) -> Iterator[Any]:
        ours.settimeout(timeout)
        yield vici.Session(sock=ours)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield connect, received
    finally:
        server.join(timeout=5)
        ours.close()
        theirs.close()


def test_batch_sends_every_request_before_it_reads_a_reply() -> None:
    """Pipelined: a server that answers only once it has all three requests is not a deadlock."""
    with _answering_after_three() as (connect, received):
        replies = ViciGateway("/x.vici", timeout=2.0, connect=connect, pool=None).batch(_loads())
    assert replies == [{"success": "yes"}] * 3
    assert [r[2:2 + r[1]] for r in received] == [b"load-pool", b"load-shared", b"load-conn"]


def test_a_pipeline_sends_now_and_reads_every_reply_at_the_end(fake: FakeCharon) -> None:
    pool = SessionPool()
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pool=pool)
    fake.script("load-pool", lambda msg: Reply({"success": "no", "errmsg": f"bad pool {SECRET}"}))
    with gateway.pipeline() as p:
        p.send(_loads()[1:])  # secret and conn
        p.send([])
        p.send(_loads()[:1])  # then the pool
        shared, conn, pool_reply = p.finish()
        assert p.finish() == [shared, conn, pool_reply]  # nothing left to read: the same replies
    assert shared == conn == {"success": "yes"}
    assert isinstance(pool_reply, GatewayRejected)
    assert "load-pool: bad pool" in str(pool_reply)
    assert SECRET not in _chain_text(pool_reply)
    assert fake.commands == ["load-shared", "load-conn", "load-pool"]
    assert pool.idle((unix_connect, fake.socket_path, 2.0)) == 1  # every reply read: kept
    pool.close()


def test_a_pipeline_closed_unread_drops_its_connection(fake: FakeCharon) -> None:
    """Replies left unread would put the connection out of step: it is closed, not pooled."""
    pool = SessionPool()
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pool=pool)
    with gateway.pipeline() as p:
        p.send(_loads())
    assert pool.idle((unix_connect, fake.socket_path, 2.0)) == 0
    gateway.version()  # a new connection serves the next command
    assert pool.idle((unix_connect, fake.socket_path, 2.0)) == 1
    pool.close()


def test_a_pipeline_reads_nothing_before_finish() -> None:
    """A server that answers only once it has all three requests: two sends, then one read."""
    with _answering_after_three() as (connect, _), \
            ViciGateway("/x.vici", timeout=2.0, connect=connect, pool=None).pipeline() as p:
        p.send(_loads()[:2])
        p.send(_loads()[2:])
        replies = p.finish()
    assert replies == [{"success": "yes"}] * 3


def test_streamed_commands_in_a_batch_carry_their_events(fake: FakeCharon) -> None:
    """Load, initiate and list-sas in one batch: each streamed command's events come with its
    reply, the connection stays in step (it is pooled and serves the next command)."""
    pool = SessionPool()
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pool=pool)

    def initiate(message: dict[str, Any]) -> Reply:
        fake.sas["c"] = ike_sa_message(children={"c": child_sa_message(name="c")})
        return Reply({"success": "yes"}, [("control-log", {"msg": "CHILD_SA c{1} established"}),
                                          ("list-sa", {"stray": {}})])  # not registered: not sent

    fake.script("initiate", initiate)
    conn, started, listed = gateway.batch([load_conn_command("c", {"children": {"c": {}}}),
                                           initiate_command(child="c", ike="c", timeout_ms=2000),
                                           list_sas_command(ike="c")])
    assert conn == {"success": "yes"}
    assert started == {"success": "yes", "events": [{"msg": "CHILD_SA c{1} established"}]}
    assert isinstance(listed, dict)
    [sa] = sas_of(listed["events"])
    assert (sa.name, [c.name for c in sa.children]) == ("c", ["c"])
    assert fake.commands == ["load-conn", "initiate", "list-sas"]
    assert fake.listeners("control-log") == fake.listeners("list-sa") == 0  # each unregistered after
    assert pool.idle((unix_connect, fake.socket_path, 2.0)) == 1
    assert gateway.version().daemon == "charon"
    pool.close()


def test_a_failed_streamed_command_in_a_batch_gives_charons_reasons(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.fail("initiate", "establishing CHILD_SA 'c' failed",
              log=["sending packet: from 10.99.0.1[500] to 10.99.0.2[500]",
                   "received NO_PROPOSAL_CHOSEN notify error"])
    started, listed = gateway.batch([initiate_command(child="c"), list_sas_command(ike="c")])
    assert isinstance(started, GatewayRejected)
    assert started.message == ("initiate: establishing CHILD_SA 'c' failed "
                               "[charon log: received NO_PROPOSAL_CHOSEN notify error]")
    assert listed == {"events": []}


def test_an_unknown_event_stream_fails_the_batch(fake: FakeCharon, gateway: ViciGateway) -> None:
    with pytest.raises(GatewayRejected, match="does not know the event stream"):
        gateway.batch([Command("list-sas", {}, stream="no-such-event")])


def test_a_streamed_command_waits_its_own_time_on_top_of_the_timeout(fake: FakeCharon) -> None:
    """initiate's timeout extends the wait for its reply; a command without one keeps the gateway's."""
    def slow(message: dict[str, Any]) -> Reply:
        threading.Event().wait(0.4)
        return Reply({"success": "yes"})

    fake.script("initiate", slow)
    fake.script("list-sas", slow)
    gateway = ViciGateway(fake.socket_path, timeout=0.2, pool=None)
    [started] = gateway.batch([initiate_command(child="c", timeout_ms=1000)])
    assert started == {"success": "yes", "events": []}
    with pytest.raises(GatewayUnreachable, match="no answer within"):
        gateway.batch([list_sas_command()])


def test_streamed_commands_on_a_session_without_a_socket_are_run_one_by_one() -> None:
    """A test's session (no transport) is asked through streamed_request, with the same results."""
    class Session:
        def request(self, command: str, message: Any = None) -> dict[str, Any]:
            return {"success": b"yes"}

        def streamed_request(self, command: str, event: str, message: Any = None) -> Iterator[dict[str, Any]]:
            yield {"msg": f"{command} {event}".encode()}
            if command == "initiate":
                raise vici.exception.CommandException("Command failed: no config")

    @contextmanager
    def connect(path: str, timeout: float) -> Iterator[Any]:
        yield Session()

    gateway = ViciGateway("/x.vici", timeout=1.0, connect=connect, pool=None)
    started, listed = gateway.batch([initiate_command(child="c"), list_sas_command()])
    assert isinstance(started, GatewayRejected)
    assert started.message == "initiate: no config [charon log: initiate control-log]"
    assert listed == {"events": [{"msg": "list-sas list-sa"}]}


def test_a_pipeline_whose_socket_is_gone_is_unreachable(socket_dir: Path) -> None:
    with pytest.raises(GatewayUnreachable), ViciGateway(str(socket_dir / "gone.vici")).pipeline() as p:
        p.send(_loads())


def test_initiate_returns_charon_log(fake: FakeCharon, gateway: ViciGateway) -> None:
    gateway.load_conn("c", {"children": {"c": {}}})
    log = gateway.initiate(child="c", ike="c", timeout_ms=2000)
    assert log[-1] == "CHILD_SA c{1} established"
    assert fake.messages("initiate")[0] == {"timeout": "2000", "loglevel": "1", "init-limits": "no",
                                            "child": "c", "ike": "c"}


def test_terminate_needs_a_selector(gateway: ViciGateway) -> None:
    with pytest.raises(ValueError, match="terminate needs"):
        gateway.terminate()


def test_terminate_sends_selectors(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.sas["x"] = ike_sa_message()
    assert gateway.terminate(ike="x", force=True) == ["IKE_SA deleted"]
    assert fake.messages("terminate")[0] == {"timeout": "5000", "loglevel": "1", "ike": "x", "force": "yes"}


# -- errors ---------------------------------------------------------------------------------


def test_socket_missing_is_unreachable_naming_the_path(socket_dir: Path) -> None:
    path = str(socket_dir / "nothing.vici")
    with pytest.raises(GatewayUnreachable) as info:
        ViciGateway(path).version()
    assert info.value.socket_path == path
    assert path in str(info.value)
    assert "no such socket" in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert isinstance(info.value, ConnectionError)


def test_refused_socket_is_unreachable(socket_dir: Path) -> None:
    path = socket_dir / "dead.vici"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens
    with pytest.raises(GatewayUnreachable, match="refused") as info:
        ViciGateway(str(path)).list_sas()
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_silent_daemon_times_out(socket_dir: Path) -> None:
    path = socket_dir / "mute.vici"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    try:
        with pytest.raises(GatewayUnreachable, match=r"no answer within 0\.2 s") as info:
            ViciGateway(str(path), timeout=0.2).version()
        assert isinstance(info.value.__cause__, TimeoutError)
    finally:
        server.close()


def test_dropped_connection_is_unreachable(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.drop("stats")
    with pytest.raises(GatewayUnreachable) as info:
        gateway.stats()
    assert info.value.__cause__ is not None


def test_errmsg_is_rejected_with_charons_message(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.fail("load-conn", "invalid proposal 'aes128-foo'")
    with pytest.raises(GatewayRejected) as info:
        gateway.load_conn("c", {"proposals": ["aes128-foo"]})
    assert "invalid proposal 'aes128-foo'" in str(info.value)
    assert isinstance(info.value.__cause__, vici.exception.CommandException)
    assert isinstance(info.value, RuntimeError)


def test_initiate_failure_carries_the_reason_from_the_log(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.fail("initiate", "establishing CHILD_SA 'c' failed", log=[
        "generating IKE_AUTH request 1 [ IDi AUTH SA TSi TSr ]",
        "parsed IKE_AUTH response 1 [ IDr AUTH N(NO_PROP) ]",
        "received NO_PROPOSAL_CHOSEN notify, no CHILD_SA built",
        "failed to establish CHILD_SA, keeping IKE_SA",
    ])
    with pytest.raises(GatewayRejected) as info:
        gateway.initiate(child="c", timeout_ms=1000)
    text = str(info.value)
    assert "establishing CHILD_SA 'c' failed" in text
    assert "NO_PROPOSAL_CHOSEN" in text
    assert "generating IKE_AUTH" not in text  # message traces are left out
    assert fake.count("initiate") == 1
    # the stream was read to the end: the same gateway still works
    assert gateway.version().daemon == "charon"


def test_unknown_command_is_rejected(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.unknown("get-shared")
    with pytest.raises(GatewayRejected, match="does not know") as info:
        gateway.get_shared()
    assert isinstance(info.value.__cause__, vici.exception.SessionException)


def test_unknown_errors_of_the_seam_are_mapped_and_chained() -> None:
    @contextmanager
    def broken(path: str, timeout: float) -> Iterator[Any]:
        raise vici.exception.DeserializationException("Expected end of list at 7")
        yield  # pragma: no cover

    with pytest.raises(GatewayUnreachable, match="protocol error") as info:
        ViciGateway("/x.vici", connect=broken).list_conns()
    assert isinstance(info.value.__cause__, vici.exception.DeserializationException)


def test_no_command_reaches_charon_when_unreachable(socket_dir: Path) -> None:
    with pytest.raises(GatewayError):
        ViciGateway(str(socket_dir / "gone.vici")).load_conn("c", {})


# -- secrets ----------------------------------------------------------------------------------


def test_secret_never_in_rejection(fake: FakeCharon, gateway: ViciGateway, caplog: pytest.LogCaptureFixture) -> None:
    # A hostile (or buggy) daemon echoing the secret must not leak it upwards.
    fake.script("load-shared", lambda msg: Reply({"success": "no", "errmsg": f"bad secret {msg['data']}"}))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GatewayRejected) as info:
        gateway.load_shared("qoss-t1", SECRET, ["left", "right"])
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    assert SECRET not in _chain_text(info.value)
    assert SECRET not in caplog.text
    assert "bad secret <secret>" in str(info.value)


def test_secret_never_in_plain_failure(fake: FakeCharon, gateway: ViciGateway,
                                       caplog: pytest.LogCaptureFixture) -> None:
    fake.fail("load-shared", "loading shared secret failed")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GatewayRejected) as info:
        gateway.load_shared("qoss-t1", SECRET.encode(), ["left"])
    assert "loading shared secret failed" in str(info.value)
    assert isinstance(info.value.__cause__, vici.exception.CommandException)
    assert SECRET not in _chain_text(info.value)
    assert SECRET not in caplog.text
    assert SECRET not in repr(gateway)


def test_secret_never_in_unreachable(socket_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = ViciGateway(str(socket_dir / "gone.vici"))
    with pytest.raises(GatewayUnreachable) as info:
        gateway.load_shared("qoss-t1", SECRET, ["left"])
    assert SECRET not in _chain_text(info.value)
    assert SECRET not in caplog.text


# -- concurrency and async ----------------------------------------------------------------------


def test_one_connection_per_operation_allows_threads(fake: FakeCharon, gateway: ViciGateway) -> None:
    fake.sas["a"] = ike_sa_message()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                assert gateway.list_sas()[0].name == "a"
                assert gateway.version().version == "5.9.8"
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert fake.count("version") == 40
