"""One strongSwan charon driven through its VICI UNIX socket.

:class:`ViciGateway` wraps the ``vici`` package (strongSwan's own client). Every
operation takes a connection of its own: an idle one from a small per-socket pool
(:class:`SessionPool`) or a new one, so one caller at a time uses a connection and a
gateway object may be shared between threads. Streamed replies
(``initiate``, ``terminate``, ``list-sas``, ``list-conns``) are always consumed to the
end. Replies are decoded once into the dataclasses of :mod:`app.adapters.vici.models`.

A connection goes back to the pool only when its command ended cleanly (a reply, or
charon's own ``success = no``, after which a streamed command has unregistered its
events); one that saw a socket error, a timeout or a protocol error is closed. An idle
connection that charon closed (it restarted) is noticed before use and replaced; a
read-only or replacing command (``version``, ``list-*``, ``load-*`` ...) that still
fails on a reused connection with a socket error is sent once more on a new one, any
other command never is.

:meth:`ViciGateway.batch` sends several commands on one connection without waiting for
each reply (charon answers one connection's requests strictly in order) and then reads
the replies: one round trip instead of one per command; :meth:`ViciGateway.pipeline`
does the same with the reading left for later. A streamed command (``initiate_command``,
``list_sas_command``) goes out between its event's registration and unregistration in the
same write, and its events come back with its reply. Each command's failure is its own; a
socket error fails the whole batch.

Every failure leaves as a project exception, chained to its cause:

- socket missing, refused, closed or silent -> :class:`~app.domain.errors.GatewayUnreachable`
  naming the socket;
- charon answered ``success = no`` (or does not know the command) ->
  :class:`~app.domain.errors.GatewayRejected` with charon's ``errmsg`` and, for
  ``initiate``/``terminate``, the log lines that say why (``NO_PROPOSAL_CHOSEN`` ...).

A pre-shared key handed to :meth:`ViciGateway.load_shared` is never logged, stored, or
put into an exception message.

Minimum strongSwan versions are noted per method; the lab and the project run 5.9.8.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import vici
import vici.exception

from app.adapters.vici.charon_log import _log_lines, _reasons, _scrub, _unreachable_reason
from app.adapters.vici.commands import (
    _CMD_UNKNOWN,
    _REPEATABLE,
    ENTRIES,
    Command,
    _initiate_message,
    _list_sas_message,
    _terminate_message,
    load_conn_command,
    load_pool_command,
    load_shared_command,
    sas_of,
    unload_command,
)
from app.adapters.vici.models import (
    Algorithms,
    IkeSa,
    Pool,
    Stats,
    VersionInfo,
    decode,
    parse_algorithms,
    parse_pools,
    parse_stats,
    parse_version,
)
from app.adapters.vici.pipeline import StreamFailed, pipelined, receive_replies, send_commands
from app.adapters.vici.session import POOL, Connect, SessionPool, ViciSession, _Held, unix_connect
from app.adapters.vici.slots import CONTROL_COMMANDS, CONTROL_SLOTS
from app.domain.charon_port import CharonCommand
from app.domain.errors import GatewayError, GatewayRejected, GatewayUnreachable
from app.domain.ports import NO_METRICS, Metrics

__all__ = ["Pipeline", "ViciGateway", "read_replies", "wire_form"]

_log = logging.getLogger(__name__)


_T = TypeVar("_T")


class ViciGateway:
    """A charon reached through its VICI UNIX socket (synchronous, thread-safe).

    Args:
        socket_path: the VICI socket, e.g. ``/run/charon.vici``.
        timeout: seconds to wait for connecting and for each reply (``initiate`` and
            ``terminate`` wait their own ``timeout_ms`` on top).
        connect: the I/O seam; opens a session. Defaults to :func:`unix_connect`.
        pool: where idle sessions wait for reuse (default: the process-wide :data:`POOL`);
            None opens a new session for every operation.
        metrics: each command (a batch: once) counted by socket (``qoss_vici_calls_total``),
            each failure by socket and error (``qoss_vici_errors_total``).
    """

    def __init__(self, socket_path: str, timeout: float = 10.0, connect: Connect = unix_connect,
                 pool: SessionPool | None = POOL, metrics: Metrics = NO_METRICS, pipelining: bool = True) -> None:
        self.metrics = metrics
        #: Several commands written to charon's socket in one go (the vici package's transport,
        #: below its public ``Session``: app/adapters/vici/pipeline.py); False: one request at a
        #: time through ``Session`` alone (QOSS_FAST_PATHS=false).
        self.pipelining = pipelining
        self.socket_path = socket_path
        self.timeout = timeout
        self._connect = connect
        self._pool = pool

    def __repr__(self) -> str:
        return f"ViciGateway(socket_path={self.socket_path!r}, timeout={self.timeout!r})"

    # -- plumbing -------------------------------------------------------------

    def _fail(
        self,
        exc: Exception,
        command: str,
        timeout: float,
        *,
        log: Sequence[str] = (),
        secrets: Sequence[str] = (),
    ) -> NoReturn:
        """Raise the project exception for ``exc``, chained unless the cause names a secret."""
        if isinstance(exc, GatewayError):  # made (and counted) by an inner call
            raise exc
        error: GatewayError
        if isinstance(exc, vici.exception.CommandException):
            message = str(exc).removeprefix("Command failed: ").strip() or "command failed"
            reasons = _reasons(log)
            text = f"{command}: {message}"
            if reasons:
                text += " [charon log: " + " | ".join(reasons) + "]"
            error = GatewayRejected(_scrub(text, secrets))
        elif isinstance(exc, vici.exception.EventUnknownException):
            error = GatewayRejected(f"{command}: charon does not know the event stream it needs ({exc})")
        elif isinstance(exc, vici.exception.SessionException) and f"type {_CMD_UNKNOWN}," in str(exc):
            error = GatewayRejected(f"{command}: charon does not know this VICI command (too old a strongSwan?)")
        elif isinstance(exc, vici.exception.SessionException | vici.exception.DeserializationException):
            error = GatewayUnreachable(self.socket_path, _scrub(f"VICI protocol error in {command}: {exc}", secrets))
        elif isinstance(exc, OSError):
            error = GatewayUnreachable(self.socket_path, _unreachable_reason(exc, timeout))
        else:
            error = GatewayUnreachable(
                self.socket_path, _scrub(f"unexpected {type(exc).__name__} in {command}: {exc}", secrets)
            )
        _log.debug("vici %s on %s failed: %s", command, self.socket_path, error.message)
        self.metrics.count("qoss_vici_errors_total", gateway=self.socket_path, error=type(error).__name__)
        if any(s and s in str(exc) for s in secrets):
            raise error from None
        raise error from exc

    def _run(self, command: str, wait: float, call: Callable[[ViciSession], _T]) -> _T:
        """``call`` on a pooled session (or a new one), which goes back to the pool only if the
        command ended cleanly. A repeatable command that hit a socket error on a reused session
        is run once more on a new one."""
        self.metrics.count("qoss_vici_calls_total", gateway=self.socket_path)
        key = (self._connect, self.socket_path, wait)
        held = self._pool.take(key) if self._pool is not None else None
        if held is None:
            return self._attempt(key, _Held(self._connect, self.socket_path, wait), call)
        try:
            return self._attempt(key, held, call)
        except OSError as exc:
            if command not in _REPEATABLE or isinstance(exc, TimeoutError):
                raise
            _log.debug("vici %s on %s: reused session failed (%s), once more on a new one",
                       command, self.socket_path, type(exc).__name__)
            return self._attempt(key, _Held(self._connect, self.socket_path, wait), call)

    def _attempt(self, key: Hashable, held: _Held, call: Callable[[ViciSession], _T]) -> _T:
        """``call`` on ``held``; the session goes back to the pool after a reply or charon's own
        ``success = no`` (it is in step, events unregistered), and is closed after anything else."""
        try:
            result = call(held.session)
        except vici.exception.CommandException:
            self._give(key, held)
            raise
        except BaseException:
            held.close()
            raise
        self._give(key, held)
        return result

    def _give(self, key: Hashable, held: _Held) -> None:
        if self._pool is None:
            held.close()
        else:
            self._pool.give(key, held)

    def _request(
        self,
        command: str,
        message: Mapping[str, Any] | None = None,
        secrets: Sequence[str] = (),
    ) -> dict[str, Any]:
        _log.debug("vici %s on %s", command, self.socket_path)
        try:
            reply = self._run(command, self.timeout, lambda session: session.request(command, message))
        except Exception as exc:
            self._fail(exc, command, self.timeout, secrets=secrets)
        decoded: dict[str, Any] = decode(reply)
        return decoded

    def _one(self, command: Command) -> dict[str, Any]:
        """One unstreamed :class:`Command` on its own."""
        return self._request(command.name, command.message, command.secrets)

    def batch(self, commands: Sequence[CharonCommand | Command]) -> list[Any]:
        """Run ``commands`` in order on one connection, pipelined (see the module's docstring):
        the charon port's values (:data:`app.domain.charon_port.CharonCommand`) or wire commands.

        Returns:
            per command, its reply (a port value's as its entry reads it: a ``ListSas``'s is
            its IKE_SAs; a wire command's decoded) or the :class:`GatewayRejected` charon's
            refusal makes of it (the others still ran).

        Raises:
            GatewayUnreachable: the socket failed; which commands took effect is unknown (a
                batch of only repeatable commands was sent once more on a new connection if a
                reused one failed).
        """
        if not commands:
            return []
        wire = wire_form(commands)
        names = ",".join(c.name for c in wire)
        secrets = tuple(s for c in wire for s in c.secrets)
        _log.debug("vici %s on %s", names, self.socket_path)
        repeatable = all(c.name in _REPEATABLE for c in wire)
        control = any(c.name in CONTROL_COMMANDS for c in wire)
        release = self._control_slot(names, self.timeout) if control else None
        try:
            replies = self._run(wire[0].name if repeatable else names, self.timeout,
                                lambda session: pipelined(session, wire, wire=self.pipelining))
        except Exception as exc:
            self._fail(exc, names, self.timeout, secrets=secrets)
        finally:
            if release is not None:
                release()
        return read_replies(commands, self._decoded(wire, replies))

    def pipeline(self) -> Pipeline:
        """A :class:`Pipeline` on one connection of this charon's (use it as a context manager)."""
        return Pipeline(self)

    def _decoded(self, commands: Sequence[Command], replies: Sequence[Mapping[str, Any] | Exception],
                 secrets: Sequence[str] = ()) -> list[dict[str, Any] | GatewayRejected]:
        """Replies decoded, refusals as :class:`GatewayRejected` (scrubbed of every secret sent
        with them, not just the command's own: one connection's commands share a fate)."""
        hidden = (*secrets, *(s for c in commands for s in c.secrets))
        out: list[dict[str, Any] | GatewayRejected] = []
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                streamed = decode(reply.events) if isinstance(reply, StreamFailed) else []
                log = _log_lines(streamed) if command.stream == "control-log" else []
                try:
                    self._fail(reply, command.name, self.timeout, log=log, secrets=hidden)
                except GatewayRejected as rejected:
                    out.append(rejected)
            else:
                out.append(decode(reply))
        return out

    def _streamed(
        self,
        command: str,
        event: str,
        message: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Run a streamed command, consuming every event; returns the decoded events. The event's
        registration, the command and the unregistration go out in one write and the replies are
        read afterwards (:func:`~app.adapters.vici.pipeline.pipelined`)."""
        wait = self.timeout if timeout is None else timeout
        _log.debug("vici %s on %s", command, self.socket_path)
        streamed = Command(command, message, stream=event)
        try:
            reply = self._run(command, wait, lambda session: pipelined(session, [streamed], wire=self.pipelining))[0]
        except Exception as exc:
            self._fail(exc, command, wait)
        if isinstance(reply, Exception):
            log = _log_lines(decode(reply.events)) if isinstance(reply, StreamFailed) and event == "control-log" else []
            self._fail(reply, command, wait, log=log)
        events: list[dict[str, Any]] = decode(reply)["events"]
        return events

    def _control(self, command: str, message: Mapping[str, Any], timeout_ms: int) -> list[str]:
        """A control call, one of this charon's few at a time (:mod:`app.adapters.vici.slots`)."""
        wait = self.timeout + max(timeout_ms, 0) / 1000.0
        release = self._control_slot(command, wait)
        try:
            events = self._streamed(command, "control-log", message, timeout=wait)
        finally:
            release()
        return _log_lines(events)

    def _control_slot(self, command: str, wait: float) -> Callable[[], None]:
        """One of this charon's control slots (:mod:`app.adapters.vici.slots`): the function that
        gives it back.

        Raises:
            GatewayUnreachable: none came free within ``wait`` seconds (charon is busy).
        """
        release = CONTROL_SLOTS.take(self.socket_path, wait)
        if release is None:
            self.metrics.count("qoss_vici_errors_total", gateway=self.socket_path, error="GatewayUnreachable")
            raise GatewayUnreachable(self.socket_path, f"{command}: busy ({CONTROL_SLOTS.per_socket} control calls "
                                     f"were waiting in this charon for all of {wait:g} s)")
        return release

    # -- information ----------------------------------------------------------

    def version(self) -> VersionInfo:
        """Daemon and system version (VICI ``version``, strongSwan >= 5.2.0)."""
        return parse_version(self._request("version"))

    def stats(self) -> Stats:
        """Load, plugins and IPsec back end (VICI ``stats``, strongSwan >= 5.2.0)."""
        return parse_stats(self._request("stats"))

    def get_algorithms(self) -> Algorithms:
        """Algorithms the loaded plugins provide (VICI ``get-algorithms``, strongSwan >= 5.4.0).

        The key-exchange section (``dh`` in 5.9, ``ke`` in 6.0) is returned as ``ke``.
        """
        return parse_algorithms(self._request("get-algorithms"))

    def list_sas(self, *, ike: str | None = None, ike_id: int | None = None) -> list[IkeSa]:
        """The IKE_SAs and their CHILD_SAs (VICI ``list-sas``, streamed, strongSwan >= 5.2.0).

        Args:
            ike: only IKE_SAs of this connection.
            ike_id: only the IKE_SA with this unique id.
        """
        return sas_of(self._streamed("list-sas", "list-sa", _list_sas_message(ike, ike_id)))

    def list_conns(self) -> list[str]:
        """Names of the loaded connections (VICI ``list-conns``, streamed, strongSwan >= 5.2.0)."""
        names: list[str] = []
        for event in self._streamed("list-conns", "list-conn"):
            names.extend(name for name, body in event.items() if isinstance(body, Mapping))
        return names

    def get_shared(self) -> list[str]:
        """Ids of the shared secrets loaded with an id (VICI ``get-shared``, strongSwan >= 5.5.2)."""
        reply = self._request("get-shared")
        keys = reply.get("keys", [])
        return [str(k) for k in keys] if isinstance(keys, list) else []

    def get_pools(self, leases: bool = True, name: str | None = None) -> list[Pool]:
        """Virtual IP pools (VICI ``get-pools``, strongSwan >= 5.2.0; ``leases`` >= 5.4.0, ``name`` >= 5.6.3)."""
        message: dict[str, Any] = {"leases": "yes" if leases else "no"}
        if name is not None:
            message["name"] = name
        return parse_pools(self._request("get-pools", message))

    # -- configuration ---------------------------------------------------------

    def load_conn(self, name: str, conn: Mapping[str, Any]) -> None:
        """Load or replace connection ``name`` (VICI ``load-conn``, strongSwan >= 5.2.0).

        Args:
            name: the connection name.
            conn: its settings as in swanctl.conf (``local_addrs``, ``proposals``,
                ``local``, ``remote``, ``children`` ...).
        """
        self._one(load_conn_command(name, conn))

    def unload_conn(self, name: str) -> None:
        """Unload connection ``name`` (VICI ``unload-conn``, strongSwan >= 5.2.0)."""
        self._one(unload_command("conn", name))

    def load_shared(self, id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> None:
        """Load a shared secret under a unique id (VICI ``load-shared`` with ``id``, strongSwan >= 5.5.2).

        The secret is neither logged nor kept, and never appears in an exception.

        Args:
            id: unique id of the secret, for :meth:`unload_shared` and :meth:`get_shared`.
            secret: the secret itself.
            owners: the identities that share it.
            type: ``IKE``, ``EAP``, ``XAUTH``, ``NTLM`` or ``PPK``.
        """
        self._one(load_shared_command(id, secret, owners, type))

    def unload_shared(self, id: str) -> None:
        """Unload the shared secret with this id (VICI ``unload-shared``, strongSwan >= 5.5.2)."""
        self._one(unload_command("shared", id))

    def load_pool(self, name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> None:
        """Load or replace a virtual IP pool (VICI ``load-pool``, strongSwan >= 5.2.0).

        Args:
            name: the pool name.
            addrs: a subnet (``10.3.0.0/28``) or a range (``10.3.0.1-10.3.0.9``).
            attributes: extra attributes such as ``dns``.
        """
        self._one(load_pool_command(name, addrs, attributes))

    def unload_pool(self, name: str) -> None:
        """Unload a virtual IP pool (VICI ``unload-pool``, strongSwan >= 5.2.0)."""
        self._one(unload_command("pool", name))

    # -- control ----------------------------------------------------------------

    def initiate(self, child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                 loglevel: int = 1) -> list[str]:
        """Bring up a CHILD_SA (and its IKE_SA) and wait (VICI ``initiate``, streamed, strongSwan >= 5.2.0).

        Args:
            child: the CHILD_SA config to initiate.
            ike: the connection it belongs to (needed if the child name is ambiguous).
            timeout_ms: how long charon waits for the result; 0 waits without limit.
            loglevel: verbosity of the ``control-log`` lines collected.

        Returns:
            charon's log lines for the operation.

        Raises:
            GatewayRejected: charon failed; the message carries its reason from the log.
            GatewayUnreachable: the socket cannot be reached.
        """
        return self._control("initiate", _initiate_message(child, ike, timeout_ms, loglevel), timeout_ms)

    def terminate(self, *, ike: str | None = None, child: str | None = None, ike_id: int | None = None,
                  child_id: int | None = None, timeout_ms: int = 5_000, force: bool = False,
                  loglevel: int = 1) -> list[str]:
        """Close IKE_SAs or CHILD_SAs and wait (VICI ``terminate``, streamed, strongSwan >= 5.2.0).

        ``force`` needs strongSwan >= 5.5.0. Name at least one of the selectors.

        Returns:
            charon's log lines for the operation.

        Raises:
            GatewayRejected: nothing matched, or charon failed.
            GatewayUnreachable: the socket cannot be reached.
        """
        message = _terminate_message(ike=ike, child=child, ike_id=ike_id, child_id=child_id,
                                    timeout_ms=timeout_ms, force=force, loglevel=loglevel)
        return self._control("terminate", message, timeout_ms)


class Pipeline:
    """Commands written now, their replies read later, on one connection (from
    :meth:`ViciGateway.pipeline`): charon works on them while the caller does something else.

    :meth:`send` may be called several times; :meth:`finish` reads every reply not read yet and
    returns all of them in the order sent (a reply, or charon's refusal as
    :class:`GatewayRejected`). Closing returns the connection to the pool only if every reply
    was read; otherwise it is closed, and charon still runs what it received.
    """

    def __init__(self, gateway: ViciGateway) -> None:
        self._gateway = gateway
        self._key = (gateway._connect, gateway.socket_path, gateway.timeout)
        self._held: _Held | None = None
        self._sent: list[CharonCommand | Command] = []
        self._unread: list[Command] = []
        self._replies: list[dict[str, Any] | GatewayRejected] = []
        self._secrets: tuple[str, ...] = ()
        self._broken = False
        self._release: Callable[[], None] | None = None  # a control slot, held until close

    def send(self, commands: Sequence[CharonCommand | Command]) -> None:
        """Write ``commands`` (the charon port's values or wire commands) without waiting for charon.

        Raises:
            GatewayUnreachable: the socket failed (which commands charon got is unknown). A
                reused connection that fails as the first commands go out, all of them
                repeatable, is replaced once.
        """
        if not commands:
            return
        self._sent.extend(commands)
        commands = wire_form(commands)
        g = self._gateway
        g.metrics.count("qoss_vici_calls_total", gateway=g.socket_path)  # a batch written at once: once
        names = ",".join(c.name for c in commands)
        self._secrets += tuple(s for c in commands for s in c.secrets)
        _log.debug("vici %s on %s (pipelined)", names, g.socket_path)
        if self._release is None and any(c.name in CONTROL_COMMANDS for c in commands):
            self._release = g._control_slot(names, g.timeout)
        try:
            if self._held is None:
                pool = g._pool
                held = pool.take(self._key) if pool is not None else None
                if held is not None:
                    try:
                        self._early(send_commands(held.session, commands, wire=g.pipelining), commands)
                        self._held = held
                        return
                    except OSError as exc:
                        held.close()
                        if isinstance(exc, TimeoutError) or not all(c.name in _REPEATABLE for c in commands):
                            raise
                        _log.debug("vici %s on %s: reused session failed (%s), once more on a new one",
                                   names, g.socket_path, type(exc).__name__)
                self._held = _Held(g._connect, g.socket_path, g.timeout)
            self._early(send_commands(self._held.session, commands, wire=g.pipelining), commands)
        except Exception as exc:
            self._broken = True
            g._fail(exc, names, g.timeout, secrets=self._secrets)

    def _early(self, replies: list[Mapping[str, Any] | Exception] | None, commands: Sequence[Command]) -> None:
        if replies is None:
            self._unread.extend(commands)
        else:
            self._replies.extend(self._gateway._decoded(commands, replies, self._secrets))

    def finish(self) -> list[Any]:
        """Every reply so far, in the order sent (reading those not read yet).

        Raises:
            GatewayUnreachable: the socket failed before every reply was read.
        """
        if self._unread:
            assert self._held is not None
            unread, self._unread = self._unread, []
            try:
                raw = receive_replies(self._held.session, unread)
            except Exception as exc:
                self._broken = True
                self._gateway._fail(exc, ",".join(c.name for c in unread), self._gateway.timeout,
                                    secrets=self._secrets)
            self._replies.extend(self._gateway._decoded(unread, raw, self._secrets))
        return read_replies(self._sent[:len(self._replies)], self._replies)

    def close(self) -> None:
        """Give the connection back (every reply read) or close it; give back a control slot."""
        release, self._release = self._release, None
        if release is not None:
            release()
        held, self._held = self._held, None
        if held is None:
            return
        if self._broken or self._unread:
            held.close()
        else:
            self._gateway._give(self._key, held)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wire_form(commands: Sequence[CharonCommand | Command]) -> list[Command]:
    """Each command as it goes on the wire (a port value through its entry)."""
    return [c if isinstance(c, Command) else ENTRIES[type(c)].command(c) for c in commands]


def read_replies(commands: Sequence[CharonCommand | Command], replies: Sequence[Any]) -> list[Any]:
    """Each reply as its command's entry reads it (a refusal and a wire command's reply as they are)."""
    return [r if isinstance(c, Command) or isinstance(r, GatewayError) else ENTRIES[type(c)].reply(r)
            for c, r in zip(commands, replies, strict=True)]

