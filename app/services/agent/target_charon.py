"""Target's charon, as the agent's Target role uses it: the algorithms and back end it offers
(asked at most every 30 s), the replies of a session's pipelined loads (pool, secret, conn)
with everything unloaded again if one failed, and the teardown of a session's config."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from app.domain.agent.conns import pool6_name, ppk_name
from app.domain.charon_port import CharonCommand, CharonPipeline, Terminate, Unload, ViciFactory, ViciPort
from app.domain.errors import GatewayError
from app.domain.tunnels import keywords_from_charon

__all__ = ["TargetCharon", "host_prefix"]

log = logging.getLogger("qoss.agent.target")

_CAPS_TTL = 30.0
#: Seconds a torn-down session's pool is tried again while charon still counts its lease (the
#: IKE_SA a forced terminate ended is destroyed a moment later), and the pause between tries.
_SETTLE, _SETTLE_STEP = 2.0, 0.05


def host_prefix(address: str) -> str:
    """A one-address pool: ``address/32`` (IPv4) or ``address/128`` (IPv6)."""
    return f"{address}/{32 if ':' not in address else 128}"


class TargetCharon:
    """Target's charon at ``socket``, reached through ``vici``; with ``dual_pool`` each session
    also has an IPv6 pool (:func:`~app.domain.agent.conns.pool6_name`, ``pool6`` in what is loaded)."""

    def __init__(self, *, vici: ViciFactory, socket: str, dual_pool: bool = False) -> None:
        self._vici = vici
        self._socket = socket
        self._dual_pool = dual_pool
        self._caps: tuple[float, frozenset[str], str | None] | None = None
        self._caps_lock = threading.Lock()

    def gateway(self) -> ViciPort:
        """A gateway to Target's charon."""
        return self._vici(self._socket)

    def capabilities(self) -> tuple[frozenset[str], str | None]:
        """The algorithm keywords charon offers (a PPK, ``ppk``, from its version) and its back end
        (``kernel-libipsec``, ...)."""
        with self._caps_lock:
            now = time.monotonic()
            if self._caps is None or now - self._caps[0] > _CAPS_TTL:
                v = self.gateway()
                keywords = keywords_from_charon(v.get_algorithms().as_sections(), version=v.version().version)
                self._caps = (now, keywords, v.stats().backend)
            return self._caps[1], self._caps[2]

    def finish_load(self, v: ViciPort, conn: str, loads: CharonPipeline, sent: Sequence[str], *,
                    undo: bool = False) -> None:
        """Read the loads' replies (``sent`` names what was sent, in order); if any load failed (or
        ``undo``), unload what may be loaded and raise the first error (with ``undo`` the caller
        has an error of its own to raise: a failed load is only logged). After a socket error
        any of the loads may have taken effect: all of them are unloaded."""
        try:
            replies = loads.finish()
        except GatewayError as exc:
            loaded, errors = list(sent), [exc]
        else:
            loaded = [w for w, reply in zip(sent, replies, strict=False) if not isinstance(reply, GatewayError)]
            errors = [reply for reply in replies if isinstance(reply, GatewayError)]
        loads.close()
        if errors or undo:
            self.unload(v, conn, loaded)
        if errors and undo:
            log.warning("loading %s failed while it was being undone: %s", conn,
                        getattr(errors[0], "message", type(errors[0]).__name__))
        elif errors:
            raise errors[0]

    @staticmethod
    def unload(v: ViciPort, conn: str, loaded: Sequence[str], *, settle: float = 0.0, terminate: bool = False,
               maybe: Sequence[str] = ()) -> None:
        """Unload (one pipelined batch) what of conn, secret, PPK, pool and pool6 is in ``loaded``;
        with ``terminate``, the conn's SAs are terminated first in the same batch (nothing up is
        no error). A pool charon still counts a lease in (its IKE_SA being torn down) is tried
        again for up to ``settle`` seconds; any other refusal is logged, except for what is in
        ``maybe`` (what may never have been loaded)."""
        what = [w for w in ("conn", "shared", "ppk", "pool", "pool6") if w in loaded]
        first: list[CharonCommand] = [Terminate(conn)] if terminate else []
        deadline = time.monotonic() + settle
        while what:
            try:
                replies = v.batch([*first, *(_unload(w, conn) for w in what)])
            except GatewayError as exc:
                log.warning("could not unload %s: %s", conn, exc.message)
                return
            refused = [(w, r) for w, r in zip(what, replies[len(first):], strict=True) if isinstance(r, GatewayError)]
            again = ([w for w, r in refused if w in ("pool", "pool6") and "online leases" in r.message]
                     if time.monotonic() < deadline else [])
            for w, reply in refused:
                if w not in again and w not in maybe:
                    log.warning("could not unload %s %s: %s", w, conn, reply.message)
            if not again:
                return
            what, first = again, []
            time.sleep(_SETTLE_STEP)


    def teardown(self, conn: str, *, ppk: bool | None = None) -> None:
        """Terminate ``conn``'s SAs and unload its conn, secret, pool and (``ppk``: a client's session
        has one; None: it may have one) its PPK in one pipelined batch (:meth:`unload`); charon
        gone: logged only (reconcile cleans up if it comes back)."""
        self.unload(self.gateway(), conn, ["conn", "shared", *(["ppk"] if ppk is not False else []), "pool",
                                           *(["pool6"] if self._dual_pool else [])],
                    settle=_SETTLE, terminate=True, maybe=("ppk",) if ppk is None else ())


def _unload(what: str, conn: str) -> Unload:
    """The unload of one of ``conn``'s parts: its conn, secret, pool, or its IPv6 pool and PPK
    (:func:`~app.domain.agent.conns.pool6_name`, :func:`~app.domain.agent.conns.ppk_name`)."""
    if what == "pool6":
        return Unload("pool", pool6_name(conn))
    if what == "ppk":
        return Unload("shared", ppk_name(conn))
    return Unload(what, conn)
