"""Close the loop: when a rating, a policy or a gateway's algorithms change, the running
tunnels that relied on them are negotiated again under the inputs they were made with.

:func:`assess` says what an edit does to each tunnel — ``noncompliant`` (its suite no longer
meets its minimums), ``cheaper`` or ``different`` (it still does, but the engine would now
choose another suite), ``stays`` — and is what ``?dry_run=true`` answers before an edit is
committed. :class:`Rekeyer` acts after a commit, in the background: a noncompliant tunnel is
moved to its new suite make-before-break (:func:`app.services.tunnel_setup.move`); a merely
cheaper or different choice follows the ``cheaper`` policy (``never`` by default, ``now``).
A tunnel that cannot be brought into compliance is marked ``noncompliant`` with the reason
(and torn down if so configured). Each move is audited and has its event; one tunnel's failure
never holds up the others.

A tunnel with another qoss (a peer) is judged by this side's own requirement alone (its gateway,
its policy for the peer, the request as this side has it) and, when below it, moved with the
peer's agreement (:meth:`app.services.peering.Peering.move_tunnel`): this side offers what it
accepts now, the peer chooses, both charons take the new SA before the old one goes. A cheaper
or different choice alone never moves it (the running suite is the two sides' joint choice).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.domain.algorithms import CATALOGUE
from app.domain.charon_port import ViciFactory
from app.domain.errors import GatewayError, GatewayUnreachable, NegotiationError, NotFound, QossError
from app.domain.negotiation import NegotiationResult
from app.domain.negotiation.post_quantum import PEERED_POST_QUANTUM, peer_without_mlkem
from app.domain.ports import NO_METRICS, Metrics, UnitOfWork, UnitOfWorkFactory
from app.domain.tunnels import TunnelRecord, TunnelState
from app.services.background import Worker
from app.services.events import kinds_after
from app.services.peering.choice import negotiate_peered
from app.services.tunnel_setup import move, teardown
from app.services.tunnels import negotiate_tunnel, provenance, result_from

__all__ = ["Cheaper", "Impact", "ImpactKind", "PeeredMover", "Rekeyer", "Verdict", "assess", "assess_one", "judge",
           "suite_keywords"]

log = logging.getLogger("qoss.rekey")

ImpactKind = Literal["noncompliant", "cheaper", "different", "stays", "unassessed"]
#: What a tunnel with a cheaper or otherwise different choice does: stay as it is, or move now.
Cheaper = Literal["never", "on-next-rekey", "now"]
#: Seconds before charon's own rekey of a CHILD_SA that an ``on-next-rekey`` move is made.
_BEFORE_REKEY = 5.0

#: The events that are edits a running tunnel may depend on.
_EDITS = frozenset({"rating_table.revision", "rating_table.deleted", "policy.revision", "policy.deleted",
                    "gateway.refreshed"})

#: Tries of a move whose charon could not be reached (a busy charon refuses connections for a moment).
_ATTEMPTS = 3

#: Tunnel states whose suite is running (the others belong to a request or to reconcile).
_RUNNING = (TunnelState.UP, TunnelState.NONCOMPLIANT)


@dataclass(frozen=True)
class Impact:
    """What an edit does to one tunnel."""

    tunnel: str
    kind: ImpactKind
    old: Mapping[str, Any]
    new: Mapping[str, Any] | None
    reason: str
    #: The new negotiation (when there is one), to move the tunnel to.
    result: NegotiationResult | None = None
    #: A tunnel with a peer: moved only when noncompliant, and to what both sides agree on.
    peered: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"tunnel": self.tunnel, "kind": self.kind, "old": dict(self.old),
                "new": dict(self.new) if self.new is not None else None, "reason": self.reason}


def _suite(document: Mapping[str, Any]) -> dict[str, Any]:
    return {"suite": document.get("suite"), "proposals": document.get("proposals"), "cost": document.get("cost")}


def _shown(result: NegotiationResult) -> str:
    """A suite as a move's detail names it: its ESP (or AH) proposal, and its post-quantum mechanism."""
    shown = result.proposals["esp"] or result.proposals["ah"] or "?"
    return f"{shown} with {result.suite.post_quantum}" if result.suite.post_quantum else shown


def suite_keywords(proposals: Mapping[str, str | None], post_quantum: str | None = None) -> list[str]:
    """The algorithm keywords of a suite's proposals (``aes128gcm16-prfsha1-x25519`` -> three; an
    additional exchange ``ke1_mlkem768`` -> ``mlkem768``) and its post-quantum mechanism, if any
    (a preshared key is in no proposal)."""
    found = {part.removeprefix("ke1_") for proposal in proposals.values() if proposal for part in proposal.split("-")}
    if post_quantum is not None:
        found.add(post_quantum)
    return sorted(k for k in found if k in CATALOGUE)


@dataclass(frozen=True)
class Verdict:
    """What negotiating a running suite again says: its kind of impact, the new negotiation (if
    any), why, and the running suite's algorithms the new negotiation rejects."""

    kind: ImpactKind
    result: NegotiationResult | None
    reason: str
    rejected: tuple[str, ...] = ()

    @property
    def new(self) -> dict[str, Any] | None:
        """The new suite (suite, proposals, cost), if there is one."""
        return _suite(self.result.as_dict()) if self.result is not None else None


def judge(current: Mapping[str, str | None], negotiate: Callable[[Sequence[str] | None], NegotiationResult],
          *, post_quantum: str | None = None) -> Verdict:
    """Whether the suite whose proposals are ``current`` (and post-quantum mechanism
    ``post_quantum``) is still what ``negotiate`` (the same inputs as it was made with, the tables
    and policies as they are now) gives: ``negotiate(None)`` chooses freely, ``negotiate(keywords)``
    only among the running suite's algorithms. A suite without a post-quantum mechanism under a
    minimum that now asks for one is noncompliant."""
    keywords = suite_keywords(current, post_quantum)
    try:
        pinned: NegotiationResult | None = negotiate(keywords)
    except NegotiationError as exc:
        pinned = None
        why = exc.message
    except QossError as exc:
        return Verdict("unassessed", None, exc.message)
    try:
        chosen = negotiate(None)
    except NegotiationError as exc:
        return Verdict("noncompliant", None, f"nothing meets its minimums any more: {exc.message}")
    if pinned is None:
        rejected = tuple(sorted({r.algorithm for r in chosen.rejected if r.algorithm in keywords}))
        return Verdict("noncompliant", chosen, f"its suite no longer meets its minimums: {why}", rejected)
    if chosen.proposals == dict(current):
        return Verdict("stays", None, "its suite is still the choice")
    if chosen.cost < pinned.cost:
        return Verdict("cheaper", chosen, f"still compliant; the choice now costs {chosen.cost:.4g} "
                                          f"against {pinned.cost:.4g} {chosen.cost_unit}")
    return Verdict("different", chosen, "still compliant; the engine now chooses another suite")


def assess_one(uow: UnitOfWork, record: TunnelRecord, *, default_table: str) -> Impact:
    """Negotiate ``record`` again under its recorded request, with the tables, policies and
    gateways as ``uow`` sees them now (an uncommitted edit included)."""
    old = _suite(record.negotiation)
    if record.provenance is None:
        return Impact(record.id, "unassessed", old, None, "made before qoss recorded what tunnels are negotiated "
                                                          "under: create it again to have it follow edits")
    if record.peer is not None and record.peer.site is not None:
        peered = result_from(record)
        verdict = judge(peered.proposals, lambda pinned: negotiate_peered(
            uow=uow, record=record, default_table=default_table, pinned=pinned),
            post_quantum=peered.suite.post_quantum)
        wanted = verdict.result.suite.post_quantum if verdict.result is not None else None
        # A tunnel with a peer moves onto a PPK the other side makes and sends sealed hybrid (to a
        # peer registered with its ML-KEM-768 key), never onto ML-KEM.
        why = (PEERED_POST_QUANTUM if wanted != "ppk" else _without_mlkem(uow, record.peer.site)) \
            if verdict.kind == "noncompliant" and wanted is not None else None
        if why is not None:
            return Impact(record.id, "noncompliant", old, None, f"it cannot follow: {why}", peered=True)
        return Impact(record.id, verdict.kind, old, verdict.new, verdict.reason, verdict.result, peered=True)
    inputs = record.provenance["request"]
    try:
        initiator = uow.gateways.get(record.initiator)
        responder = uow.gateways.get(record.responder) if record.responder is not None else None
    except NotFound as exc:
        return Impact(record.id, "unassessed", old, None, exc.message)
    running = result_from(record)
    verdict = judge(running.proposals, lambda pinned: negotiate_tunnel(
        uow=uow, inputs=inputs, initiator=initiator, responder=responder, default_table=default_table, check=True,
        pinned=pinned), post_quantum=running.suite.post_quantum)
    return Impact(record.id, verdict.kind, old, verdict.new, verdict.reason, verdict.result)


def _without_mlkem(uow: UnitOfWork, site: str) -> str | None:
    """Why a post-quantum preshared key cannot reach peer ``site`` (it registered no ML-KEM-768 key), or None."""
    try:
        peer = uow.peers.get(site)
    except NotFound:
        return None
    return peer_without_mlkem(site) if peer.mlkem_key is None else None


def assess(uow: UnitOfWork, *, default_table: str, tunnels: Iterable[TunnelRecord] | None = None) -> list[Impact]:
    """:func:`assess_one` for every running tunnel (or ``tunnels``), in one unit of work."""
    records = list(tunnels) if tunnels is not None else [t for t in uow.tunnels.list() if t.state in _RUNNING]
    return [assess_one(uow, r, default_table=default_table) for r in records]


class PeeredMover(Protocol):
    """What moves a tunnel with a peer (:class:`app.services.peering.Peering`)."""

    def move_tunnel(self, *, tunnel_id: str) -> tuple[NegotiationResult, Callable[[], None]]: ...


class Rekeyer:
    """Moves the tunnels an edit concerns, in the background (see the module's description).

    Args:
        units: units of work on the service's database (each move commits its own).
        reads: units of work that only read (default: ``units``); on SQLite they never take
            the write lock, so assessing a thousand tunnels holds up no edit.
        vici: socket path -> charon.
        default_table: the service's default rating table.
        cheaper: what a still-compliant tunnel with another choice does: ``never`` (default)
            stay; ``now`` move at once; ``on-next-rekey`` move when its charon would rekey its
            CHILD_SA anyway (``rekey-time`` in ``list-sas``), assessed again then.
        concurrency: tunnels moved at once.
        drain: seconds between a moved tunnel's new SA being verified and its old one being
            closed, for the packets already sealed with the old SA.
        retry: seconds after a run that left tunnels noncompliant before they are tried again
            (a charon that was busy or unreachable may take them then).
        attempts: tries of one move whose charon cannot be reached, within a run.
        watch: seconds between looks at the event log for edits (rating tables, policies,
            gateway refreshes) made by any replica; None: only :meth:`schedule` starts a run.
        teardown_noncompliant: take down a tunnel that cannot be brought into compliance
            (default: keep it running, marked ``noncompliant``).
        metrics: moves counted (``qoss_rekey_moves_total``: moved, refused) and timed
            (``qoss_rekey_move_seconds``).
        peering: what moves the tunnels with a peer (None: peering is off here, and such a
            tunnel below its minimums is marked ``noncompliant``).
    """

    def __init__(self, *, units: UnitOfWorkFactory, vici: ViciFactory, default_table: str,
                 cheaper: Cheaper = "never", concurrency: int = 8, teardown_noncompliant: bool = False,
                 reads: UnitOfWorkFactory | None = None, drain: float = 2.0, retry: float = 60.0,
                 attempts: int = _ATTEMPTS, watch: float | None = None, metrics: Metrics = NO_METRICS,
                 peering: PeeredMover | None = None) -> None:
        self._peering = peering
        self._metrics = metrics
        self._attempts = attempts
        self._watch = watch
        self._retry_at = 0.0
        self._retry = retry
        self._left_noncompliant = False
        self._reads = reads or units
        self._drain = drain
        self._closing: list[tuple[float, int, Callable[[], None]]] = []  # a heap: (when, order, close)
        self._at_rekey: dict[str, tuple[float, str]] = {}  # tunnel -> (when, cause): moves at its next rekey
        self._order = 0
        self._units, self._vici, self._default_table = units, vici, default_table
        self._cheaper, self._teardown = cheaper, teardown_noncompliant
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="qoss-rekey")
        self._worker = Worker("rekeyer")
        self._wake = self._worker.wake
        self._causes: list[str] = []
        self._busy = False
        #: Moves made and refused since start (for tests and logs).
        self.moved = 0
        self.refused = 0

    def start(self) -> None:
        self._worker.start(("qoss-rekeyer", self._run), ("qoss-rekey-close", self._close_loop))

    def stop(self, timeout: float = 10.0) -> None:
        self._worker.stop(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def schedule(self, cause: str) -> None:
        """Assess every running tunnel again (soon, in the background) because of ``cause``."""
        with self._wake:
            self._causes.append(cause)
            self._wake.notify_all()

    def idle(self, timeout: float) -> bool:
        """Wait until nothing is scheduled, running or waiting to be closed (True), or ``timeout`` seconds (False)."""
        with self._wake:
            return self._wake.wait_for(lambda: not self._causes and not self._busy and not self._closing, timeout)

    def _due(self, everything: bool = False) -> list[Callable[[], None]]:
        """The old SAs to close now (called with the lock held)."""
        now, due = time.monotonic(), []
        while self._closing and (everything or self._closing[0][0] <= now):
            due.append(heapq.heappop(self._closing)[2])
        return due

    def _edits_after(self, last: int) -> tuple[list[str], int]:
        """The edits in the event log after event ``last`` (any replica's), and the id to look after
        next time (:func:`~app.services.events.kinds_after`)."""
        with self._reads() as uow:
            events, last = kinds_after(uow, last, _EDITS)
        causes = [f"{e['kind'].replace('_', ' ')} {e['subject']}" + (f" revision {e['data']['revision']}"
                                                                    if e["data"].get("revision") else "")
                  for e in events]
        return causes, last

    def _newest_event(self) -> int | None:
        """The newest event's id (edits after it are this rekeyer's), None if the database is away."""
        try:
            with self._reads() as uow:
                return uow.events.last_id()
        except Exception:  # a pool timeout or a restarting database: asked again on the next look
            log.exception("rekey: reading the event log failed")
            return None

    def _run(self) -> None:
        last = self._newest_event() if self._watch is not None else 0
        while True:
            with self._wake:
                timeout = self._watch if self._watch is not None else (
                    self._retry if self._left_noncompliant else None)
                if self._at_rekey:
                    soonest = max(0.0, min(when for when, _ in self._at_rekey.values()) - time.monotonic())
                    timeout = soonest if timeout is None else min(timeout, soonest)
                self._wake.wait_for(lambda: self._worker.stopping or bool(self._causes), timeout)
                if self._worker.stopping:
                    return
                causes, self._causes = self._causes, []
                now = time.monotonic()
                rekeying = {t: c for t, (when, c) in self._at_rekey.items() if when <= now}
                for tunnel in rekeying:
                    del self._at_rekey[tunnel]
            if rekeying:
                self._move_at_rekey(rekeying)
            if self._watch is not None and last is None:
                last = self._newest_event()
            elif self._watch is not None and last is not None:
                try:
                    found, last = self._edits_after(last)
                except Exception as exc:  # the database is away or busy for a moment: look again next time
                    log.warning("rekey: reading the event log failed (%s: %s); looking again in %g s",
                                type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "", self._watch)
                    found = []
                causes += found
            if not causes and self._left_noncompliant and time.monotonic() >= self._retry_at:
                causes = ["another try for the tunnels left noncompliant"]
            if not causes:
                continue
            with self._wake:
                self._busy = True
            try:
                self.run_once("; ".join(dict.fromkeys(causes)))
            except Exception:  # the loop must outlive any one failure; the next edit retries
                log.exception("rekey: assessing the tunnels failed")
            finally:
                self._retry_at = time.monotonic() + self._retry
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def run_once(self, cause: str) -> list[Impact]:
        """Assess every running tunnel and act on each (in the pool); returns the impacts."""
        with self._reads() as uow:
            impacts = assess(uow, default_table=self._default_table)
        todo = [i for i in impacts if i.kind == "noncompliant" or (i.kind in ("cheaper", "different")
                                                                     and self._cheaper == "now" and not i.peered)]
        if self._cheaper == "on-next-rekey" and self._worker.started:  # the command line cannot wait
            later = [i.tunnel for i in impacts if i.kind in ("cheaper", "different") and not i.peered]
            list(self._pool.map(lambda tunnel: self._when_it_rekeys(tunnel, cause), later))  # each asks its charon
        refused = self.refused
        for future in [self._pool.submit(self._act, impact, cause) for impact in todo]:
            future.result()
        self._left_noncompliant = self.refused > refused
        if not self._worker.started:  # one run, not in the background (the command line): close the old SAs here
            with self._wake:
                last = max((when for when, _, _ in self._closing), default=0.0)
            time.sleep(max(0.0, last - time.monotonic()))
            with self._wake:
                due = self._due(everything=True)
            for close in due:
                close()
        return impacts

    def _when_it_rekeys(self, tunnel: str, cause: str) -> None:
        """Move ``tunnel`` a few seconds before its charon would rekey its CHILD_SA (in
        ``retry`` seconds if that cannot be known now)."""
        seconds: float = self._retry
        try:
            with self._reads() as uow:
                record = uow.tunnels.get(tunnel)
                socket = uow.gateways.get(record.initiator).vici_socket
            times = [child.rekey_time for sa in self._vici(socket).list_sas(ike=record.conn)
                     for child in getattr(sa, "children", ()) if getattr(child, "rekey_time", None) is not None]
            if times:
                seconds = max(0.0, min(times) - _BEFORE_REKEY)
        except (QossError, OSError) as exc:
            log.info("tunnel %s: its rekey time is unknown (%s): looked at again in %g s", tunnel, exc, seconds)
        with self._wake:
            self._at_rekey[tunnel] = (time.monotonic() + seconds, cause)
            self._wake.notify_all()

    def _move_at_rekey(self, due: dict[str, str]) -> None:
        """Assess each tunnel whose rekey came and move those that still have another choice."""
        try:
            with self._reads() as uow:
                running = [r for r in uow.tunnels.list() if r.id in due and r.state in _RUNNING]
                impacts = assess(uow, default_table=self._default_table, tunnels=running)
        except Exception:  # the database is away: they are tried again at the next run
            log.exception("rekey: assessing the tunnels due at their rekey failed")
            return
        todo = [i for i in impacts if i.kind == "noncompliant" or (i.kind in ("cheaper", "different") and not i.peered)]
        for future in [self._pool.submit(self._act, i, f"{due[i.tunnel]} (at its rekey)") for i in todo]:
            future.result()

    def pending_at_rekey(self) -> dict[str, float]:
        """The tunnels waiting for their rekey to move, and the seconds left (for tests and logs)."""
        with self._wake:
            now = time.monotonic()
            return {t: max(0.0, when - now) for t, (when, _) in self._at_rekey.items()}

    def _act(self, impact: Impact, cause: str) -> None:
        for attempt in range(self._attempts):
            try:
                self._move(impact, cause)
                return
            except GatewayUnreachable as exc:  # a charon too busy to accept: worth another try
                if attempt + 1 < self._attempts:
                    log.info("tunnel %s: %s; trying again", impact.tunnel, exc.message)
                    time.sleep(0.5 * 2**attempt)
                    continue
                self._refuse(impact, cause, exc.message)
            except Exception as exc:  # one tunnel's failure never stops the others
                why = exc.message if isinstance(exc, QossError) else f"{type(exc).__name__}: {exc}"
                self._refuse(impact, cause, why)
            return

    def _move(self, impact: Impact, cause: str) -> None:
        if impact.peered:
            self._move_peered(impact, cause)
            return
        started = time.monotonic()
        # Three steps, so that no transaction (on SQLite: the database's one write lock) is
        # open while charon works: read what the move needs, move, record the move.
        with self._reads() as uow:
            record = uow.tunnels.get(impact.tunnel)
            if impact.result is None:
                raise NegotiationError(impact.reason)
            if record.responder is None:
                raise GatewayError("its far end is an unmanaged peer: its administrator must configure the new "
                                   f"proposals ({impact.result.proposals}); create the tunnel again then")
            initiator, responder = uow.gateways.get(record.initiator), uow.gateways.get(record.responder)
            origin = provenance(uow=uow, inputs=record.provenance["request"] if record.provenance else {},
                                result=impact.result, initiator=initiator, responder=responder)
        old = result_from(record)
        close_old = move(record=record, initiator=initiator, responder=responder, old=old, new=impact.result,
                         vici=self._vici)
        detail = f"moved from {_shown(old)} to {_shown(impact.result)} ({impact.kind}: {cause})"
        self._moved(impact, cause, record=record, negotiation=impact.result.as_dict(), origin=origin,
                    new=dict(impact.new or {}), detail=detail, close_old=close_old, started=started)

    def _move_peered(self, impact: Impact, cause: str) -> None:
        """Move a tunnel with a peer to what both sides now accept (the peer agrees or nothing changes)."""
        started = time.monotonic()
        if self._peering is None:
            raise GatewayError("its far end is another qoss: the running service (with QOSS_PEER_NAME) moves it "
                               "with its peer")
        new, close_old = self._peering.move_tunnel(tunnel_id=impact.tunnel)
        with self._reads() as uow:
            record = uow.tunnels.get(impact.tunnel)
        old = result_from(record)
        site = record.peer.site if record.peer is not None else None
        detail = f"moved from {old.proposals['esp']} to {new.proposals['esp']} with {site} ({impact.kind}: {cause})"
        origin = {k: v for k, v in (record.provenance or {}).items() if k not in ("moving", "moving_out")}
        self._moved(impact, cause, record=record, negotiation=new.as_dict(), origin=origin,
                    new=_suite(new.as_dict()), detail=detail, close_old=close_old, started=started)

    def _moved(self, impact: Impact, cause: str, *, record: TunnelRecord, negotiation: Mapping[str, Any],
               origin: Mapping[str, Any] | None, new: Mapping[str, Any], detail: str,
               close_old: Callable[[], None], started: float) -> None:
        """Record a tunnel moved to ``negotiation`` (its record, the ``tunnel.moved`` event with
        the ``new`` suite, the audit entry), close its old SAs after the drain time, and count it."""
        with self._units() as uow:
            uow.tunnels.set_negotiation(record.id, negotiation, origin, detail[:500])
            uow.events.append("tunnel.moved", record.id, {"kind": impact.kind, "cause": cause, "old": dict(impact.old),
                                                          "new": new}, scope="tunnels:read")
            uow.audit.append(request_id=f"rekey-{secrets.token_hex(6)}", token_id=None, token_name=None, scopes=[],
                             source="local", action="POST", object=f"/v1/tunnels/{record.id}", outcome=200,
                             detail=detail[:200])
            uow.commit()
        self._close_later(close_old)
        self.moved += 1
        self._metrics.count("qoss_rekey_moves_total", outcome="moved")
        self._metrics.observe("qoss_rekey_move_seconds", time.monotonic() - started)
        log.info("tunnel %s %s", impact.tunnel, detail)

    def _close_loop(self) -> None:
        """Close each moved tunnel's old SAs once their drain time is over (all of them at stop)."""
        while True:
            with self._wake:
                while not self._worker.stopping and not (self._closing and self._closing[0][0] <= time.monotonic()):
                    self._wake.wait(self._closing[0][0] - time.monotonic() if self._closing else None)
                stopping = self._worker.stopping
                due = self._due(everything=stopping)
            for close in due:
                try:
                    close()
                except Exception:
                    log.exception("rekey: closing an old SA failed")
            with self._wake:
                self._wake.notify_all()
            if stopping:
                return

    def _close_later(self, close: Callable[[], None]) -> None:
        with self._wake:
            self._order += 1
            heapq.heappush(self._closing, (time.monotonic() + self._drain, self._order, close))
            self._wake.notify_all()

    def _refuse(self, impact: Impact, cause: str, reason: str) -> None:
        self.refused += 1
        self._metrics.count("qoss_rekey_moves_total", outcome="refused")
        log.warning("tunnel %s not moved (%s): %s", impact.tunnel, impact.kind, reason)
        if impact.kind != "noncompliant":
            return  # still compliant: it keeps running as it is
        detail = f"noncompliant since {cause}: {impact.reason}; not moved: {reason}"[:500]
        with self._reads() as uow:
            try:
                record = uow.tunnels.get(impact.tunnel)
                ends = (uow.gateways.get(record.initiator),
                        uow.gateways.get(record.responder) if record.responder is not None else None)
            except NotFound:
                return  # deleted meanwhile
        torn_down = self._teardown and ends[1] is not None
        if torn_down:
            with contextlib.suppress(GatewayError):
                teardown(record, ends[0], ends[1], self._vici, strict=False)
            detail = f"torn down: {detail}"[:500]
        with self._units() as uow:
            with contextlib.suppress(NotFound):
                if torn_down:
                    uow.tunnels.delete(record.id)
                    uow.events.append("tunnel.deleted", record.id, {"detail": detail}, scope="tunnels:read")
                else:
                    uow.tunnels.set_state(record.id, TunnelState.NONCOMPLIANT, detail)
                    uow.events.append("tunnel.state", record.id, {"state": TunnelState.NONCOMPLIANT.value,
                                                                  "detail": detail}, scope="tunnels:read")
            uow.audit.append(request_id=f"rekey-{secrets.token_hex(6)}", token_id=None, token_name=None, scopes=[],
                             source="local", action="POST", object=f"/v1/tunnels/{record.id}", outcome=409,
                             detail=detail[:200])
            uow.commit()
