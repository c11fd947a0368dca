"""Pieces of a VICI ``load-conn`` body that every conn qoss loads shares: the tunnels
service's (:func:`app.domain.tunnels.conn_payload`) and the tunnel agent's
(:mod:`app.domain.agent.conns`)."""

from __future__ import annotations

__all__ = ["child_timers", "psk_ends"]


def psk_ends(local_id: str, remote_id: str) -> dict[str, dict[str, str]]:
    """The ``local`` and ``remote`` sections of a conn whose two ends authenticate with a PSK."""
    return {"local": {"auth": "psk", "id": local_id}, "remote": {"auth": "psk", "id": remote_id}}


def child_timers(child_lifetime: int) -> dict[str, str]:
    """A CHILD_SA started and closed only on request, cleared when the peer is dead, rekeyed
    after ``child_lifetime`` seconds and expired a tenth of that later."""
    return {
        "start_action": "none",
        "close_action": "none",
        "dpd_action": "clear",
        "rekey_time": f"{child_lifetime}s",
        "life_time": f"{child_lifetime + child_lifetime // 10}s",
    }
