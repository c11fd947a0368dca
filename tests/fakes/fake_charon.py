"""A fake charon that speaks the real VICI wire protocol over a UNIX socket.

Written from strongSwan's ``src/libcharon/plugins/vici/README.md``, independently of
the ``vici`` package, so that a test against it also checks our use of the framing:

- a packet is a 4-byte big-endian length, then one byte of packet type
  (``CMD_REQUEST`` 0, ``CMD_RESPONSE`` 1, ``CMD_UNKNOWN`` 2, ``EVENT_REGISTER`` 3,
  ``EVENT_UNREGISTER`` 4, ``EVENT_CONFIRM`` 5, ``EVENT_UNKNOWN`` 6, ``EVENT`` 7),
  for named types a 1-byte name length and the name, then the message;
- a message is a sequence of elements: ``SECTION_START`` 1 (named), ``SECTION_END`` 2,
  ``KEY_VALUE`` 3 (name, 2-byte length, value), ``LIST_START`` 4 (named),
  ``LIST_ITEM`` 5 (2-byte length, value), ``LIST_END`` 6.

The fake keeps a little state (connections, shared-secret ids, pools, SAs) so that the
usual load / list / unload round trips behave, records every command it receives,
and can be scripted per command: a fixed reply, a failure (``errmsg``), events to
stream before the reply, ``CMD_UNKNOWN``, or a dropped connection. Each client
connection is served by its own thread, like charon's.

Usage::

    with FakeCharon(tmp_path / "charon.vici") as fake:
        fake.fail("load-conn", "invalid configuration")
        gateway = ViciGateway(fake.socket_path)
        ...
        assert fake.count("load-conn") == 1
"""

from __future__ import annotations

import contextlib
import copy
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "CMD_REQUEST",
    "CMD_RESPONSE",
    "CMD_UNKNOWN",
    "EVENT",
    "EVENT_CONFIRM",
    "EVENT_REGISTER",
    "EVENT_UNKNOWN",
    "EVENT_UNREGISTER",
    "STREAMED",
    "Call",
    "FakeCharon",
    "Reply",
    "child_sa_message",
    "decode_message",
    "encode_message",
    "ike_sa_message",
    "iter_packets",
]

CMD_REQUEST = 0
CMD_RESPONSE = 1
CMD_UNKNOWN = 2
EVENT_REGISTER = 3
EVENT_UNREGISTER = 4
EVENT_CONFIRM = 5
EVENT_UNKNOWN = 6
EVENT = 7

SECTION_START = 1
SECTION_END = 2
KEY_VALUE = 3
LIST_START = 4
LIST_ITEM = 5
LIST_END = 6

#: Streamed commands and the event each streams (as in charon 5.9).
STREAMED = {
    "initiate": "control-log",
    "terminate": "control-log",
    "rekey": "control-log",
    "redirect": "control-log",
    "list-sas": "list-sa",
    "list-conns": "list-conn",
    "list-policies": "list-policy",
    "list-certs": "list-cert",
    "list-authorities": "list-authority",
}
#: Events a client may register for.
KNOWN_EVENTS = frozenset(
    {*STREAMED.values(), "log", "ike-updown", "child-updown", "ike-rekey", "child-rekey",
     "ike-state-established", "ike-state-destroying", "child-state-installing",
     "child-state-installed", "child-state-updown", "child-state-rekeyed", "child-state-destroying",
     "ike-update"}
)


# -- the message codec ------------------------------------------------------------------


def _blob(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError("a VICI value is at most 65535 bytes")
    return struct.pack("!H", len(data)) + data


def _name(marker: int, name: str) -> bytes:
    data = name.encode("utf-8")
    if len(data) > 0xFF:
        raise ValueError("a VICI name is at most 255 bytes")
    return struct.pack("!BB", marker, len(data)) + data


def encode_message(message: Mapping[str, Any]) -> bytes:
    """A dict (sections = dicts, lists = lists, anything else a value) as a VICI message."""
    out = bytearray()
    for key, value in message.items():
        if isinstance(value, Mapping):
            out += _name(SECTION_START, key) + encode_message(value) + bytes([SECTION_END])
        elif isinstance(value, list | tuple):
            out += _name(LIST_START, key)
            for item in value:
                out += bytes([LIST_ITEM]) + _blob(item)
            out += bytes([LIST_END])
        else:
            out += _name(KEY_VALUE, key) + _blob(value)
    return bytes(out)


def decode_message(data: bytes) -> dict[str, Any]:
    """A VICI message as a dict whose values are ``bytes`` (as on the wire)."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError("truncated VICI message")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    def name() -> str:
        return take(take(1)[0]).decode("utf-8")

    def blob() -> bytes:
        (length,) = struct.unpack("!H", take(2))
        return take(length)

    root: dict[str, Any] = {}
    stack = [root]
    while pos < len(data):
        marker = take(1)[0]
        if marker == SECTION_START:
            section: dict[str, Any] = {}
            stack[-1][name()] = section
            stack.append(section)
        elif marker == SECTION_END:
            if len(stack) == 1:
                raise ValueError("unbalanced section end")
            stack.pop()
        elif marker == KEY_VALUE:
            key = name()
            stack[-1][key] = blob()
        elif marker == LIST_START:
            key = name()
            items = []
            while (item := take(1)[0]) == LIST_ITEM:
                items.append(blob())
            if item != LIST_END:
                raise ValueError("bad list element")
            stack[-1][key] = items
        else:
            raise ValueError(f"unknown VICI element type {marker}")
    if len(stack) != 1:
        raise ValueError("unterminated section")
    return root


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, dict):
        return {k: _text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


def ike_sa_message(
    *,
    uniqueid: int = 1,
    state: str = "ESTABLISHED",
    local_host: str = "10.99.0.1",
    remote_host: str = "10.99.0.2",
    encr_alg: str = "AES_CBC",
    encr_keysize: int | None = 128,
    integ_alg: str | None = "HMAC_SHA2_256_128",
    prf_alg: str = "PRF_HMAC_SHA2_256",
    dh_group: str = "MODP_2048",
    children: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """An IKE_SA section as charon 5.9.8 writes it in ``list-sa`` (all values text)."""
    sa: dict[str, Any] = {
        "uniqueid": str(uniqueid), "version": "2", "state": state,
        "local-host": local_host, "local-port": "4500", "local-id": "left",
        "remote-host": remote_host, "remote-port": "4500", "remote-id": "right",
        "initiator": "yes", "initiator-spi": "0123456789abcdef", "responder-spi": "fedcba9876543210",
        "encr-alg": encr_alg,
    }
    if encr_keysize is not None:
        sa["encr-keysize"] = str(encr_keysize)
    if integ_alg is not None:
        sa["integ-alg"] = integ_alg
    sa.update({"prf-alg": prf_alg, "dh-group": dh_group, "established": "1", "rekey-time": "13000"})
    sa["child-sas"] = {k: dict(v) for k, v in (children or {}).items()}
    return sa


def child_sa_message(
    *,
    name: str = "net",
    uniqueid: int = 1,
    state: str = "INSTALLED",
    encr_alg: str = "AES_CBC",
    encr_keysize: int | None = 128,
    integ_alg: str | None = "HMAC_SHA2_256_128",
    bytes_in: int = 0,
    bytes_out: int = 0,
    local_ts: tuple[str, ...] = ("10.1.0.1/32",),
    remote_ts: tuple[str, ...] = ("10.2.0.1/32",),
) -> dict[str, Any]:
    """A CHILD_SA section as charon 5.9.8 writes it in ``list-sa``."""
    sa: dict[str, Any] = {
        "name": name, "uniqueid": str(uniqueid), "reqid": str(uniqueid), "state": state,
        "mode": "TUNNEL", "protocol": "ESP", "spi-in": "c0ffee01", "spi-out": "c0ffee02",
        "encr-alg": encr_alg,
    }
    if encr_keysize is not None:
        sa["encr-keysize"] = str(encr_keysize)
    if integ_alg is not None:
        sa["integ-alg"] = integ_alg
    sa.update({
        "bytes-in": str(bytes_in), "packets-in": str(bytes_in // 100), "bytes-out": str(bytes_out),
        "packets-out": str(bytes_out // 100), "rekey-time": "3000", "life-time": "3600",
        "install-time": "1", "local-ts": list(local_ts), "remote-ts": list(remote_ts),
    })
    return sa


# -- the daemon ------------------------------------------------------------------------------


@dataclass
class Reply:
    """What the fake answers to one command.

    Attributes:
        response: the ``CMD_RESPONSE`` message (None with ``unknown`` or ``drop``).
        events: ``(event name, message)`` pairs streamed first; sent only if the client
            registered for that event, like charon.
        unknown: answer ``CMD_UNKNOWN`` instead.
        drop: close the connection without answering.
    """

    response: dict[str, Any] | None = None
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    unknown: bool = False
    drop: bool = False


@dataclass(frozen=True)
class Call:
    """One command the fake received; message values decoded to ``str``."""

    command: str
    message: dict[str, Any]


Handler = Callable[[dict[str, Any]], Reply]

_OK: dict[str, Any] = {"success": "yes"}


class _Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.events: set[str] = set()
        self.lock = threading.Lock()

    def send(self, packet: bytes) -> None:
        with self.lock:
            self.sock.sendall(struct.pack("!I", len(packet)) + packet)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class FakeCharon:
    """A VICI server on ``socket_path``, each client served in its own thread.

    Attributes:
        calls: every command received, in order.
        conns: loaded connections, name -> config (decoded).
        shared: loaded shared-secret ids -> owners (the secret itself is not kept).
        pools: loaded pools, name -> attributes.
        sas: what ``list-sas`` streams: IKE_SA name -> section (see :func:`ike_sa_message`).
        version: what ``version`` answers.
        plugins: the ``stats`` plugin list.
        algorithms: what ``get-algorithms`` answers.
    """

    def __init__(self, socket_path: str | Path) -> None:
        self.socket_path = str(socket_path)
        self.calls: list[Call] = []
        self.conns: dict[str, Any] = {}
        self.shared: dict[str, list[str]] = {}
        self.certs: list[Any] = []
        self.keys: list[Any] = []
        self.pools: dict[str, dict[str, Any]] = {}
        self.sas: dict[str, dict[str, Any]] = {}
        self.version: dict[str, Any] = {
            "daemon": "charon", "version": "5.9.8", "sysname": "Linux",
            "release": "6.1.0-fake", "machine": "x86_64",
        }
        self.plugins = ["charon", "aes", "sha2", "openssl", "kernel-libipsec", "kernel-netlink", "vici"]
        self.algorithms: dict[str, Any] = {
            "encryption": {"AES_CBC": "aesni", "3DES_CBC": "openssl", "NULL": "openssl"},
            "integrity": {"HMAC_SHA1_96": "openssl", "HMAC_SHA2_256_128": "openssl"},
            "aead": {"AES_GCM_16": "aesni", "CHACHA20_POLY1305": "openssl"},
            "prf": {"PRF_HMAC_SHA2_256": "openssl"},
            "dh": {"MODP_2048": "openssl", "CURVE_25519": "openssl"},
            "hasher": {"HASH_SHA2_256": "sha2"},
        }
        self._scripts: dict[str, list[Reply | Handler]] = {}
        self._persistent: dict[str, Reply | Handler] = {}
        self._lock = threading.Lock()
        self._clients: list[_Client] = []
        self._threads: list[threading.Thread] = []
        self._server: socket.socket | None = None
        self._stopped = threading.Event()

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> FakeCharon:
        """Listen on the socket and accept clients in a thread."""
        with contextlib.suppress(FileNotFoundError):
            Path(self.socket_path).unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(16)
        self._server = server
        thread = threading.Thread(target=self._accept, name="fake-charon", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Close every connection and the socket, and remove the socket file."""
        self._stopped.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            with contextlib.suppress(OSError):
                client.sock.shutdown(socket.SHUT_RDWR)
            client.sock.close()
        for thread in self._threads:
            thread.join(2)
        with contextlib.suppress(FileNotFoundError):
            Path(self.socket_path).unlink()

    def __enter__(self) -> FakeCharon:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- scripting ---------------------------------------------------------------------

    def script(self, command: str, reply: Reply | Handler, *, once: bool = False) -> None:
        """Answer ``command`` with ``reply`` (or ``reply(message)``), always or just once.

        One-shot scripts are used first, in the order given.
        """
        if once:
            self._scripts.setdefault(command, []).append(reply)
        else:
            self._persistent[command] = reply

    def fail(self, command: str, errmsg: str, *, log: list[str] | None = None, once: bool = False) -> None:
        """Answer ``command`` with ``success = no`` and ``errmsg``, streaming ``log`` lines first."""
        events = [("control-log", {"group": "IKE", "level": "1", "msg": line}) for line in log or []]
        self.script(command, Reply({"success": "no", "errmsg": errmsg}, events), once=once)

    def unknown(self, command: str) -> None:
        """Answer ``command`` with ``CMD_UNKNOWN``."""
        self.script(command, Reply(unknown=True))

    def drop(self, command: str) -> None:
        """Close the connection when ``command`` arrives."""
        self.script(command, Reply(drop=True))

    def emit(self, event: str, message: Mapping[str, Any]) -> int:
        """Send an event to every client registered for it; returns how many got it."""
        packet = _name(EVENT, event) + encode_message(message)
        sent = 0
        with self._lock:
            clients = [c for c in self._clients if event in c.events]
        for client in clients:
            with contextlib.suppress(OSError):
                client.send(packet)
                sent += 1
        return sent

    def listeners(self, event: str) -> int:
        """How many clients are registered for ``event`` right now."""
        with self._lock:
            return sum(1 for c in self._clients if event in c.events)

    # -- inspection -----------------------------------------------------------------------

    @property
    def commands(self) -> list[str]:
        """The names of the commands received, in order."""
        with self._lock:
            return [c.command for c in self.calls]

    def count(self, command: str) -> int:
        """How many times ``command`` was received."""
        return self.commands.count(command)

    def messages(self, command: str) -> list[dict[str, Any]]:
        """The messages of every ``command`` received."""
        with self._lock:
            return [c.message for c in self.calls if c.command == command]

    # -- serving -------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            client = _Client(sock)
            with self._lock:
                self._clients.append(client)
            thread = threading.Thread(target=self._serve, args=(client,), name="fake-charon-client", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, client: _Client) -> None:
        try:
            while True:
                header = _recv_exact(client.sock, 4)
                if header is None:
                    return
                (length,) = struct.unpack("!I", header)
                packet = _recv_exact(client.sock, length)
                if packet is None or not packet:
                    return
                if not self._handle(client, packet):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                if client in self._clients:
                    self._clients.remove(client)
            client.sock.close()

    def _handle(self, client: _Client, packet: bytes) -> bool:
        kind = packet[0]
        name_len = packet[1]
        name = packet[2:2 + name_len].decode("utf-8")
        body = packet[2 + name_len:]
        if kind in (EVENT_REGISTER, EVENT_UNREGISTER):
            if name not in KNOWN_EVENTS:
                client.send(bytes([EVENT_UNKNOWN]))
                return True
            with self._lock:
                (client.events.add if kind == EVENT_REGISTER else client.events.discard)(name)
            client.send(bytes([EVENT_CONFIRM]))
            return True
        if kind != CMD_REQUEST:
            return False
        message = decode_message(body)
        with self._lock:
            self.calls.append(Call(name, _text(message)))
        reply = self._reply(name, message)
        if reply.drop:
            return False
        if reply.unknown:
            client.send(bytes([CMD_UNKNOWN]))
            return True
        for event, event_message in reply.events:
            if event in client.events:
                client.send(_name(EVENT, event) + encode_message(event_message))
        client.send(bytes([CMD_RESPONSE]) + encode_message(reply.response or {}))
        return True

    def _reply(self, command: str, raw: dict[str, Any]) -> Reply:
        message = _text(raw)
        with self._lock:
            queued = self._scripts.get(command)
            scripted = queued.pop(0) if queued else self._persistent.get(command)
        if scripted is not None:
            return scripted(message) if callable(scripted) else copy.deepcopy(scripted)
        default = getattr(self, "_cmd_" + command.replace("-", "_"), None)
        if default is None:
            return Reply(unknown=True)
        result: Reply = default(message)
        return result

    # -- default behaviour, close to charon 5.9.8 ---------------------------------------------

    def _cmd_version(self, message: dict[str, Any]) -> Reply:
        return Reply(dict(self.version))

    def _cmd_stats(self, message: dict[str, Any]) -> Reply:
        return Reply({
            "uptime": {"running": "1 minute", "since": "Jan 01 00:00:00 2026"},
            "workers": {"total": "16", "idle": "11", "active": {"critical": "4", "high": "0",
                                                                 "medium": "1", "low": "0"}},
            "queues": {"critical": "0", "high": "0", "medium": "0", "low": "0"},
            "scheduled": "0",
            "ikesas": {"total": str(len(self.sas)), "half-open": "0"},
            "plugins": list(self.plugins),
        })

    def _cmd_get_algorithms(self, message: dict[str, Any]) -> Reply:
        return Reply(copy.deepcopy(self.algorithms))

    def _cmd_load_conn(self, message: dict[str, Any]) -> Reply:
        for name, conn in message.items():
            self.conns[name] = conn
        return Reply(dict(_OK))

    def _cmd_unload_conn(self, message: dict[str, Any]) -> Reply:
        name = message.get("name", "")
        if self.conns.pop(name, None) is None:
            return Reply({"success": "no", "errmsg": f"unloading connection '{name}' failed"})
        return Reply(dict(_OK))

    def _cmd_list_conns(self, message: dict[str, Any]) -> Reply:
        events = [("list-conn", {name: conn}) for name, conn in self.conns.items()]
        return Reply({}, events)

    def _cmd_load_shared(self, message: dict[str, Any]) -> Reply:
        if message.get("type") not in ("IKE", "EAP", "XAUTH", "NTLM", "PPK"):
            return Reply({"success": "no", "errmsg": f"invalid credential type: {message.get('type')}"})
        if "id" in message:
            self.shared[message["id"]] = list(message.get("owners", []))
        return Reply(dict(_OK))

    def _cmd_unload_shared(self, message: dict[str, Any]) -> Reply:
        if self.shared.pop(message.get("id", ""), None) is None:
            return Reply({"success": "no", "errmsg": "unloading shared secret failed"})
        return Reply(dict(_OK))

    def _cmd_get_shared(self, message: dict[str, Any]) -> Reply:
        return Reply({"keys": list(self.shared)})

    def _cmd_load_cert(self, message: dict[str, Any]) -> Reply:
        if message.get("type") != "X509" or not message.get("data"):
            return Reply({"success": "no", "errmsg": "parsing X509 certificate failed"})
        self.certs.append(message["data"])
        return Reply(dict(_OK))

    def _cmd_load_key(self, message: dict[str, Any]) -> Reply:
        if not message.get("data"):
            return Reply({"success": "no", "errmsg": "parsing private key failed"})
        self.keys.append(message["data"])
        return Reply({**_OK, "id": f"{len(self.keys):040x}"})

    def _cmd_load_pool(self, message: dict[str, Any]) -> Reply:
        for name, pool in message.items():
            self.pools[name] = pool
        return Reply(dict(_OK))

    def _cmd_unload_pool(self, message: dict[str, Any]) -> Reply:
        if self.pools.pop(message.get("name", ""), None) is None:
            return Reply({"success": "no", "errmsg": f"pool '{message.get('name')}' not found"})
        return Reply(dict(_OK))

    def _cmd_get_pools(self, message: dict[str, Any]) -> Reply:
        out: dict[str, dict[str, Any]] = {name: {"base": str(pool.get("addrs", "")).split("/")[0], "size": "14",
                      "online": "0", "offline": "0"} for name, pool in self.pools.items()}
        if message.get("leases") == "yes":
            for pool in out.values():
                pool["leases"] = {}
        return Reply(out)

    def _cmd_initiate(self, message: dict[str, Any]) -> Reply:
        child = message.get("child", "")
        conn = next((c for c in self.conns.values() if child in c.get("children", {})), None)
        if conn is None:
            return Reply({"success": "no", "errmsg": f"CHILD_SA config '{child}' not found"})
        log = [("control-log", {"group": "IKE", "level": "0", "ikesa-name": child, "ikesa-uniqueid": "1",
                                "msg": f"initiating IKE_SA {child}[1] to 10.99.0.2"}),
               ("control-log", {"group": "CHD", "level": "0", "ikesa-name": child, "ikesa-uniqueid": "1",
                                "msg": f"CHILD_SA {child}{{1}} established"})]
        return Reply(dict(_OK), log)

    def _cmd_terminate(self, message: dict[str, Any]) -> Reply:
        ike = message.get("ike")
        if ike is not None and ike in self.sas:
            del self.sas[ike]
            return Reply({"success": "yes", "matches": "1", "terminated": "1"},
                         [("control-log", {"group": "IKE", "level": "0", "msg": "IKE_SA deleted"})])
        return Reply({"success": "no", "errmsg": "no matching SAs to terminate found",
                      "matches": "0", "terminated": "0"})

    def _cmd_list_sas(self, message: dict[str, Any]) -> Reply:
        wanted = message.get("ike")
        events = [("list-sa", {name: sa}) for name, sa in self.sas.items() if wanted in (None, name)]
        return Reply({}, events)


def iter_packets(data: bytes) -> Iterator[bytes]:
    """Split a byte stream into VICI packets (for tests of the framing itself)."""
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack("!I", data[pos:pos + 4])
        yield data[pos + 4:pos + 4 + length]
        pos += 4 + length
