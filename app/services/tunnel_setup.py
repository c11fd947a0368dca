"""Making a negotiated suite real in strongSwan, and undoing it: the charon side of a tunnel.

Changing strongSwan follows stage -> verify -> commit or roll back: the responder's
secret and conn are loaded, then the initiator's, the initiator initiates, and both
ends must show exactly the chosen algorithms: in charon's own report of the CHILD_SA
coming up (``child-updown``), or else in their ``list-sas``. Any failure on the way
unloads everything that was loaded, on both ends, before the error reaches the caller.
The PSK is 32 fresh random bytes per tunnel, handed to charon and otherwise forgotten:
never stored, logged or returned. A tunnel whose negotiation chose a post-quantum preshared key
(RFC 8784) gets one the same way, on every load: 32 fresh random bytes under a random PPK id,
loaded into both charons beside the PSK (``load-shared`` of type PPK), the conns naming the id
with ``ppk_required`` (an end without the key is refused), unloaded with the tunnel.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.domain.charon_port import (
    CharonCommand,
    CharonPipeline,
    LoadConn,
    LoadShared,
    Terminate,
    Unload,
    UpReports,
    ViciFactory,
    ViciPort,
)
from app.domain.errors import GatewayError, GatewayRejected, TunnelVerificationFailed, UnsupportedProtection
from app.domain.negotiation import NegotiationResult
from app.domain.tunnels import (
    ExpectedSa,
    Gateway,
    ObservedSa,
    PeerEnd,
    TunnelEnd,
    TunnelRecord,
    conn_name,
    conn_payload,
    expected_sa,
    mismatches,
    ppk_secret_name,
)

__all__ = ["INITIATE_TIMEOUT_MS", "bring_up", "came_up", "close_new_sas", "established", "established_everywhere",
           "load_ppk", "move", "new_ppk", "observed_sa", "old_sas_closer", "sa_ids", "teardown"]

log = logging.getLogger("qoss.tunnels")

#: How long charon may take to bring a tunnel up (an initiate's timeout), in milliseconds.
INITIATE_TIMEOUT_MS = 15_000
#: Seconds a set-up waits, after its ``initiate`` returned, for charon's reports of its ends'
#: CHILD_SAs coming up (both ends together) before it asks an unreported end's ``list-sas``
#: instead (a report is sent as the SA is installed, so it is normally there within milliseconds).
REPORT_WAIT = 1.0
#: Runs the two ends' ``list-sas`` concurrently, when charon's reports did not answer for them:
#: each is a separate UNIX-socket connection to a charon.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="qoss-vici")


def _ends(tunnel_id: str, initiator: Gateway, far: Gateway | PeerEnd, local_ts: tuple[str, ...],
          remote_ts: tuple[str, ...]) -> tuple[TunnelEnd, TunnelEnd]:
    if isinstance(far, PeerEnd):  # identities the peer's administrator configured
        return (TunnelEnd(initiator.ike_address, far.local_identity, local_ts),
                TunnelEnd(far.address, far.identity, remote_ts))
    # Identities are per tunnel, so each tunnel's PSK is the only one matching its pair.
    left = TunnelEnd(initiator.ike_address, f"{tunnel_id}.{initiator.identity}", local_ts)
    right = TunnelEnd(far.ike_address, f"{tunnel_id}.{far.identity}", remote_ts)
    return left, right


def observed_sa(sas: Sequence[Any], name: str, *, besides: frozenset[int] = frozenset()) -> ObservedSa | None:
    """What ``list-sas`` shows of conn ``name``: its IKE_SA and CHILD_SA (with ``besides``, the
    first CHILD_SA whose unique id is not among them: the one a move has just made)."""
    for sa in sas:
        if sa.name != name:
            continue
        child = next((c for c in sa.children if c.name == name and c.uniqueid not in besides), None)
        if besides and child is None:
            continue
        return ObservedSa(
            ike_state=sa.state,
            ike_encr=sa.encr_alg,
            ike_encr_keysize=sa.encr_keysize,
            ike_integ=sa.integ_alg,
            ike_prf=sa.prf_alg,
            ike_dh=sa.dh_group,
            ike_ppk=sa.ppk,
            ike_additional_ke=sa.additional_ke,
            child_state=child.state if child else None,
            child_protocol=child.protocol if child else None,
            child_encr=child.encr_alg if child else None,
            child_encr_keysize=child.encr_keysize if child else None,
            child_integ=child.integ_alg if child else None,
        )
    return None


def _rollback(name: str, initiator: ViciPort, responder: ViciPort | None,
              loaded: list[tuple[str, str, ViciPort]]) -> None:
    """Undo a partial set-up: terminate, then unload every conn and secret that was loaded."""
    for v in (initiator, responder):
        if v is not None:
            with contextlib.suppress(GatewayError, ValueError):
                v.terminate(ike=name, timeout_ms=3000, force=True)
    for what, loaded_id, v in reversed(loaded):
        try:
            if what == "conn":
                v.unload_conn(loaded_id)
            else:
                v.unload_shared(loaded_id)
        except GatewayError as exc:
            log.warning("rollback of %s %s on %s failed: %s", what, loaded_id, v.socket_path, exc.message)


def new_ppk() -> tuple[str, bytes]:
    """A fresh post-quantum preshared key for one tunnel: a random PPK id and 32 random bytes."""
    return f"qoss-ppk-{secrets.token_hex(12)}", secrets.token_bytes(32)


def _new_ppk(result: NegotiationResult, far: Gateway | PeerEnd,
             given: tuple[str, bytes] | None = None) -> tuple[str, bytes] | None:
    """The post-quantum preshared key of a set-up where the negotiation chose one: a fresh one
    between two gateways qoss loads, else the one the far end's qoss sent (``given``).

    Raises:
        UnsupportedProtection: an unmanaged far end (qoss could not hand it the key).
    """
    if result.suite.post_quantum != "ppk":
        return None
    if isinstance(far, PeerEnd):
        if given is not None and far.site is not None:
            return given
        raise UnsupportedProtection(
            "post_quantum: a post-quantum preshared key must reach both ends, and qoss loads only its own "
            "gateways: a tunnel to an unmanaged peer cannot have one")
    return new_ppk()


def load_ppk(v: ViciPort, name: str, ppk: tuple[str, bytes]) -> None:
    """Load (or replace) conn ``name``'s post-quantum preshared key into one charon.

    Raises:
        GatewayError: charon refused it or did not answer.
    """
    reply = v.batch([LoadShared(ppk_secret_name(name), ppk[1], (ppk[0],), "PPK")])[0]
    if isinstance(reply, GatewayError):
        raise reply


def _secret_loads(name: str, psk: bytes, local: TunnelEnd, remote: TunnelEnd,
                  ppk: tuple[str, bytes] | None) -> list[CharonCommand]:
    """One end's secrets: the PSK for the two identities, and the PPK (owned by its id) if any."""
    out: list[CharonCommand] = [LoadShared(name, psk, (local.identity, remote.identity))]
    if ppk is not None:
        out.append(LoadShared(ppk_secret_name(name), ppk[1], (ppk[0],), "PPK"))
    return out


def bring_up(
    *, tunnel_id: str, initiator: Gateway, far: Gateway | PeerEnd, local_ts: tuple[str, ...],
    remote_ts: tuple[str, ...], result: NegotiationResult, vici: ViciFactory, psk: bytes | None = None,
    reports: UpReports | None = None, ppk: tuple[str, bytes] | None = None,
) -> None:
    """Load, initiate, verify; on any failure unload what was loaded (stage -> verify -> commit).

    ``far`` is a managed gateway (both ends loaded and verified, fresh PSK) or an unmanaged
    peer (only the initiator loaded and verified, with the peer's write-only ``psk``), or the far
    end of a tunnel with another qoss (``psk`` and, where the suite has one, the post-quantum
    preshared key ``ppk`` as its id and bytes, both sent by that qoss).

    ``reports``: charon's reports of SAs coming up. An end whose report (within
    :data:`REPORT_WAIT` seconds) shows exactly the expected algorithms is verified by it;
    any other end by its ``list-sas``, as without ``reports``.

    Raises:
        UnsupportedProtection: a post-quantum preshared key was chosen for a tunnel to an
            unmanaged peer (nothing was loaded).
    """
    name = conn_name(tunnel_id)
    ppk = _new_ppk(result, far, ppk)
    v_init = vici(initiator.vici_socket)
    v_resp = None if isinstance(far, PeerEnd) else vici(far.vici_socket)
    left, right = _ends(tunnel_id, initiator, far, local_ts, remote_ts)
    ike_proposal = result.proposals["ike"]
    assert ike_proposal is not None
    if psk is None:
        psk = secrets.token_bytes(32)
    loaded: list[tuple[str, str, ViciPort]] = []
    try:
        # Both ends' secrets and conns are independent of each other and nothing starts
        # before ``initiate`` (start_action none): each end's two loads go out at once on a
        # connection of its own, then both ends' replies are read.
        loads: list[tuple[ViciPort, list[CharonCommand]]] = []
        ends = [(v_init, left, right)] if v_resp is None else [(v_resp, right, left), (v_init, left, right)]
        for v, local, remote in ends:
            conn = conn_payload(
                name=name, local=local, remote=remote, ike_proposal=ike_proposal,
                esp_proposal=result.proposals["esp"], ah_proposal=result.proposals["ah"], mode=result.mode,
                ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"],
                ppk_id=ppk[0] if ppk is not None else None,
            )
            loads.append((v, [*_secret_loads(name, psk, local, remote, ppk), LoadConn(name, conn)]))
        _load_together(loaded, loads)
        sides = [(v_init, initiator.name)]
        if v_resp is not None:
            sides.append((v_resp, str(getattr(far, "name", "responder"))))
        with contextlib.ExitStack() as stack:
            waits = [stack.enter_context(reports.expect(v.socket_path, name)) if reports is not None else None
                     for v, _ in sides]
            # Between two managed charons (here, or a peer qoss's) whose reports arrive, charon is asked
            # to initiate without waiting: none of its worker threads is held and no log is streamed
            # while the IKE_SA is negotiated, and the reports say when the SAs are up. To an unmanaged
            # peer (whose refusals need charon's log to be told), charon waits and answers with the outcome.
            managed = v_resp is not None or (isinstance(far, PeerEnd) and far.site is not None)
            detached = reports is not None and managed and reports.detached(v_init.socket_path)
            until = time.monotonic() + INITIATE_TIMEOUT_MS / 1000
            v_init.initiate(child=name, ike=name, timeout_ms=-1 if detached else INITIATE_TIMEOUT_MS)
            expected = expected_sa(ike=result.ike, protocol=result.suite.protocol,
                                   encryption=result.suite.encryption, integrity=result.suite.integrity,
                                   post_quantum=result.suite.post_quantum)
            # What charon reported as it installed the SAs, if it matches; otherwise (no report
            # in time, or a report that does not match) what list-sas says now decides. One
            # REPORT_WAIT for both ends together, not one after the other.
            deadline = time.monotonic() + REPORT_WAIT
            ask = [i for i, ((_, side_name), wait) in enumerate(zip(sides, waits, strict=True))
                   if not _reported_right(wait, deadline, side_name, name, expected)]
            if detached and 0 in ask:
                came_up(v_init, initiator.name, name, until)
        observed_sas = list(_POOL.map(lambda i: sides[i][0].list_sas(ike=name), ask))
        for i, sas in zip(ask, observed_sas, strict=True):
            _verify(sides[i][1], sas, name, expected)
    except BaseException:
        _rollback(name, v_init, v_resp, loaded)
        raise


def came_up(v: ViciPort, side: str, name: str, until: float) -> None:
    """After an initiate that did not wait, and no report of conn ``name`` in time: wait (until
    the monotonic ``until``) for its SAs to be up, asking ``list-sas`` now and then. An IKE_SA
    that is gone failed, and so did a CHILD_SA missing from an established IKE_SA (its proposal
    refused): charon is then asked again, waiting, and brings it up or says why not.

    Raises:
        GatewayRejected: charon's refusal, or not up by ``until``.
    """
    pause = 0.05
    while True:
        seen = observed_sa(v.list_sas(ike=name), name)
        if seen is not None and seen.ike_state == "ESTABLISHED" and seen.child_state == "INSTALLED":
            return
        if seen is None or (seen.ike_state == "ESTABLISHED" and seen.child_state is None):
            # Charon gave up on it: its reason comes with an initiate that waits.
            log.info("%s: %s is not up after an initiate that did not wait; initiating again, waiting", side, name)
            v.initiate(child=name, ike=name, timeout_ms=max(1000, int((until - time.monotonic()) * 1000)))
            return
        now = time.monotonic()
        if now >= until:
            raise GatewayRejected(f"{side}: {name} was not up within {INITIATE_TIMEOUT_MS // 1000} s")
        time.sleep(min(pause, until - now))
        pause = min(2 * pause, 0.5)


def _reported_right(wait: Callable[[float], Any] | None, deadline: float, side: str, name: str,
                    expected: ExpectedSa) -> bool:
    """Whether charon's report of conn ``name`` coming up (``wait``, until the monotonic
    ``deadline``) shows exactly ``expected``."""
    if wait is None:
        return False
    sa = wait(max(0.0, deadline - time.monotonic()))
    if sa is None:
        return False
    try:
        _verify(side, [sa], name, expected)
    except TunnelVerificationFailed as exc:
        log.info("%s: charon's report of %s does not match (%s); asking list-sas", side, name, exc.message)
        return False
    return True


def _verify(side: str, sas: Sequence[Any], name: str, expected: ExpectedSa, *,
            besides: frozenset[int] = frozenset()) -> None:
    """``list-sas`` of one end shows conn ``name`` (its CHILD_SA not among ``besides``) with
    exactly the ``expected`` algorithms.

    Raises:
        TunnelVerificationFailed: it does not (the message names the end and every difference).
    """
    seen = observed_sa(sas, name, besides=besides)
    if seen is None:
        raise TunnelVerificationFailed(f"{side}: no {'new CHILD_SA' if besides else 'IKE_SA'} {name} after initiate")
    wrong = mismatches(expected, seen)
    if wrong:
        raise TunnelVerificationFailed(f"{side}: " + "; ".join(wrong))


def _load_together(loaded: list[tuple[str, str, ViciPort]], loads: Sequence[tuple[ViciPort, Sequence[CharonCommand]]],
                   ) -> None:
    """Write each charon's loads at once on a pipeline of its own, then read every reply: the
    charons work side by side and no thread waits for either. Each load charon accepted is
    recorded in ``loaded`` (to be undone on failure); the first failure is raised."""
    first: GatewayError | None = None
    with contextlib.ExitStack() as stack:
        sent: list[tuple[ViciPort, Sequence[CharonCommand], CharonPipeline]] = []
        for v, commands in loads:
            pipe = stack.enter_context(v.pipeline())
            try:
                pipe.send(commands)
            except GatewayError as exc:
                first = first or exc
            else:
                sent.append((v, commands, pipe))
        for v, commands, pipe in sent:
            try:
                replies = pipe.finish()
            except GatewayError as exc:
                first = first or exc
                continue
            for command, reply in zip(commands, replies, strict=True):
                if isinstance(reply, GatewayError):
                    first = first or reply
                elif isinstance(command, LoadShared):
                    loaded.append(("shared", command.name, v))
                elif isinstance(command, LoadConn):
                    loaded.append(("conn", command.name, v))
    if first is not None:
        raise first


def teardown(record: TunnelRecord, initiator: Gateway, responder: Gateway | None, vici: ViciFactory,
              *, strict: bool) -> None:
    """Terminate and unload conn and secret on both ends; ``strict`` re-raises the first error
    (an unreachable charon, or one that refused an unload).

    Each end is asked on a pipeline of its own (terminate, unload conn, unload secret, written
    at once; charon runs one connection's commands in order), both ends side by side, and the
    replies are read once every command is out. Unloads directly (no listing first, which would
    make tearing down n tunnels cost O(n^2)): nothing to terminate, or a conn "not found", means
    it is already gone.
    """
    name = record.conn
    commands: list[CharonCommand] = [Terminate(name), Unload("conn", name),
                                     Unload("shared", name)]
    if _uses_ppk(record):
        commands.append(Unload("shared", ppk_secret_name(name)))
    errors: list[GatewayError] = []
    with contextlib.ExitStack() as stack:
        sent: list[CharonPipeline] = []
        for gw in (initiator, responder):
            if gw is None:  # an unmanaged peer: its administrator's to undo
                continue
            pipe = stack.enter_context(vici(gw.vici_socket).pipeline())
            try:
                pipe.send(commands)
            except GatewayError as exc:
                errors.append(exc)
            else:
                sent.append(pipe)
        for pipe in sent:
            try:
                replies = pipe.finish()
            except GatewayError as exc:
                errors.append(exc)
                continue
            _, conn, *shared = replies  # terminate refused ("no matching SAs"): nothing was up
            if isinstance(conn, GatewayRejected) and "not found" in conn.message:
                conn = None
            errors += [r for r in (conn, *shared) if isinstance(r, GatewayRejected)]
    if errors and strict:
        raise errors[0]


def _uses_ppk(record: TunnelRecord) -> bool:
    """Whether a tunnel's recorded negotiation chose a post-quantum preshared key."""
    suite = record.negotiation.get("suite")
    return isinstance(suite, Mapping) and suite.get("post_quantum") == "ppk"


def established_everywhere(vici: ViciFactory, gateways: Sequence[Gateway], name: str) -> bool:
    """Whether conn ``name``'s IKE_SA is ESTABLISHED with its CHILD_SA INSTALLED on every gateway.

    Raises:
        GatewayUnreachable: a charon does not answer (nothing can be said).
    """
    return all(name in established_conns(vici(gateway.vici_socket).list_sas(ike=name)) for gateway in gateways)


def established_conns(sas: Sequence[Any]) -> set[str]:
    """The conns of a ``list-sas`` answer with an IKE_SA ESTABLISHED and, in it, the CHILD_SA of
    the same name INSTALLED."""
    return {sa.name for sa in sas if sa.state == "ESTABLISHED"
            and any(c.name == sa.name and c.state == "INSTALLED" for c in sa.children)}


def established(vici: ViciFactory, gateway: Gateway, name: str) -> bool:
    """As :func:`established_everywhere` on one gateway; an unreachable charon counts as not established."""
    try:
        return established_everywhere(vici, [gateway], name)
    except GatewayError:
        return False


def _conn(name: str, local: TunnelEnd, remote: TunnelEnd, result: NegotiationResult,
          ppk_id: str | None = None) -> dict[str, Any]:
    ike_proposal = result.proposals["ike"]
    assert ike_proposal is not None
    return conn_payload(name=name, local=local, remote=remote, ike_proposal=ike_proposal,
                        esp_proposal=result.proposals["esp"], ah_proposal=result.proposals["ah"], mode=result.mode,
                        ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"],
                        ppk_id=ppk_id)


def sa_ids(sas: Sequence[Any], name: str) -> tuple[frozenset[int], frozenset[int]]:
    """The unique ids of conn ``name``'s IKE_SAs and CHILD_SAs in a ``list-sas`` answer."""
    ikes = frozenset(sa.uniqueid for sa in sas if sa.name == name)
    children = frozenset(c.uniqueid for sa in sas if sa.name == name for c in sa.children if c.name == name)
    return ikes, children


def close_new_sas(v: ViciPort, name: str, old_ikes: frozenset[int], old_children: frozenset[int]) -> None:
    """Undoing a move on one end: close (forced) every SA of conn ``name`` that came up beside the
    old ones (their ids ``old_ikes``, ``old_children``).

    Raises:
        GatewayError: charon refused or did not answer.
    """
    now_ikes, now_children = sa_ids(v.list_sas(ike=name), name)
    for ike_id in sorted(now_ikes - old_ikes):
        v.terminate(ike_id=ike_id, timeout_ms=3000, force=True)
    for child_id in sorted(now_children - old_children):
        v.terminate(child_id=child_id, timeout_ms=3000, force=True)


def old_sas_closer(v: ViciPort, name: str, old: NegotiationResult, new: NegotiationResult,
                   old_ikes: frozenset[int], old_children: frozenset[int],
                   ppk_holders: Sequence[ViciPort]) -> Callable[[], None]:
    """After a move verified on conn ``name``: what closes its old SAs through ``v`` (the old IKE_SAs
    when the new CHILD_SA came up in a new IKE_SA: a new IKE proposal, or a PPK on either suite, as
    a PPK is mixed into an IKE_SA's keys as it is made; else the old CHILD_SAs) and, when the old
    suite had a PPK and the new one has none, unloads that key from ``ppk_holders``. Nothing it
    cannot close stops it."""
    new_ike = new.proposals["ike"] != old.proposals["ike"] or "ppk" in (new.suite.post_quantum,
                                                                        old.suite.post_quantum)

    def close_old() -> None:
        for ike_id in sorted(old_ikes) if new_ike else ():
            with contextlib.suppress(GatewayError):
                v.terminate(ike_id=ike_id, timeout_ms=3000)
        for child_id in () if new_ike else sorted(old_children):
            with contextlib.suppress(GatewayError):
                v.terminate(child_id=child_id, timeout_ms=3000)
        if old.suite.post_quantum == "ppk" and new.suite.post_quantum != "ppk":  # its key goes too
            for holder in ppk_holders:
                with contextlib.suppress(GatewayError):
                    holder.unload_shared(ppk_secret_name(name))
    return close_old


def move(*, record: TunnelRecord, initiator: Gateway, responder: Gateway, old: NegotiationResult,
         new: NegotiationResult, vici: ViciFactory) -> Callable[[], None]:
    """Move a running tunnel to another suite, make-before-break.

    Both ends get the conn with the new proposals (responder first); the initiator then
    initiates the CHILD_SA again: charon negotiates it beside the old one (inside the same
    IKE_SA, or in a new IKE_SA when the IKE proposal changed or either suite has a post-quantum
    preshared key: a PPK is mixed into an IKE_SA's keys as it is made, so a new suite with one
    gets a fresh PPK on both ends and a new IKE_SA), and both ends' ``list-sas``
    must show the new CHILD_SA with exactly the new algorithms. Only then may the old
    CHILD_SAs (or the old IKE_SA) be closed: traffic always has an installed SA. If anything
    fails before that, the old proposals are loaded back and whatever new SA came up is
    closed: the tunnel keeps running on its old suite and the error reaches the caller.

    Returns:
        What closes the old SAs. Call it a little later (packets already sealed with the old
        SA are still on their way), or at once.

    Raises:
        GatewayUnreachable, GatewayRejected, TunnelVerificationFailed: as :func:`bring_up`.
    """
    name = record.conn
    v_init, v_resp = vici(initiator.vici_socket), vici(responder.vici_socket)
    left, right = _ends(record.id, initiator, responder, record.local_ts, record.remote_ts)
    sides = [(v_init, initiator.name), (v_resp, responder.name)]
    before = [sa_ids(v.list_sas(ike=name), name) for v, _ in sides]
    ppk = _new_ppk(new, responder)

    def load(result: NegotiationResult, ppk_id: str | None = None) -> None:
        for v, local, remote in ((v_resp, right, left), (v_init, left, right)):
            v.load_conn(name, _conn(name, local, remote, result, ppk_id))

    try:
        if ppk is not None:  # the same id replaces the old tunnel's PPK, if it had one
            for v in (v_resp, v_init):
                load_ppk(v, name, ppk)
        load(new, ppk[0] if ppk is not None else None)
        v_init.initiate(child=name, ike=name, timeout_ms=INITIATE_TIMEOUT_MS)
        expected = expected_sa(ike=new.ike, protocol=new.suite.protocol, encryption=new.suite.encryption,
                               integrity=new.suite.integrity, post_quantum=new.suite.post_quantum)
        for (v, side_name), (_, old_children) in zip(sides, before, strict=True):
            _verify(side_name, v.list_sas(ike=name), name, expected, besides=old_children)
    except BaseException:
        with contextlib.suppress(GatewayError, ValueError):
            # An old suite with a PPK is loaded back with a fresh one on both ends (its key is
            # never kept, and a new one may have replaced it): the running IKE_SA needs none.
            restore = _new_ppk(old, responder)
            if restore is not None:
                for v in (v_resp, v_init):
                    load_ppk(v, name, restore)
            load(old, restore[0] if restore is not None else None)
        with contextlib.suppress(GatewayError, ValueError):
            close_new_sas(v_init, name, *before[0])
        raise
    return old_sas_closer(v_init, name, old, new, *before[0], ppk_holders=(v_resp, v_init))
