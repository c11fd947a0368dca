"""Admitting a message at Target (Liu et al. §2.2 step 3): whether Target may act on it at all.

Target accepts only what a Host it trusts endorsed: the envelope is signed by that Host and
embeds the client's own signed request unchanged. The endorsement must be addressed to this
Target and fresh, the request signed by the user Host vouches for, addressed to that Host and
this Target, fresh, and for an objective the user may ask for. Then, in the request's own
transaction, Target's own revocation list (what this user's Host revoked) and both nonces: each
is single use, a unique row per nonce in the database (atomic across workers, kept across
restarts).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.agent import REPLAY_TTL, AgentRejected, ClientRequest, Endorsement, Kind, check_fresh
from app.domain.agent.ports import AgentCrypto, AgentRequest, PeerKeys
from app.services.agent.target_sessions import at
from app.services.agent.timing import Steps

__all__ = ["TargetAdmission"]


class TargetAdmission:
    """The checks every endorsed request passes before Target acts on it.

    Args:
        name: Target's own id (what an endorsement and a request must be addressed to).
        hosts: the Hosts this Target trusts, by id.
        crypto: checks signatures.
    """

    def __init__(self, *, name: str, hosts: Mapping[str, PeerKeys], crypto: AgentCrypto) -> None:
        self._name = name
        self._hosts = hosts
        self._crypto = crypto

    def host_keys(self, host: str) -> PeerKeys:
        """The keys of a Host this Target trusts.

        Raises:
            AgentRejected: ``host`` is not one.
        """
        host_keys = self._hosts.get(host)
        if host_keys is None:
            raise AgentRejected(f"unknown host {host}")
        return host_keys

    def open_endorsement(self, kind: Kind, body: bytes, tag: bytes) -> Endorsement:
        """Parse an opened endorsement and check its Host's signature (the Host must be trusted)."""
        if kind is not Kind.ENDORSE:
            raise AgentRejected("not an endorsement")
        endorsement = Endorsement.parse(body)
        self._crypto.verify(self.host_keys(endorsement.host).sign, Kind.ENDORSE, body, tag)
        return endorsement

    def check(self, endorsement: Endorsement, now: float, steps: Steps) -> ClientRequest:
        """Everything but the envelope: addressed here, fresh, the client's own signed request,
        consistent with Host's word, an objective the user may ask for."""
        if endorsement.target != self._name:
            raise AgentRejected("endorsement for another target")
        check_fresh(endorsement.timestamp, now)
        user = endorsement.user
        self._crypto.verify(user.sign_public_key, endorsement.client_kind, endorsement.client_body,
                            endorsement.client_tag)
        request = ClientRequest.parse(endorsement.client_body, kind=endorsement.client_kind)
        if request.host != endorsement.host:
            raise AgentRejected("the client addressed another host")
        if request.user_id != user.user_id:
            raise AgentRejected("the endorsed user is not the requesting user")
        if request.request_info.target != self._name:
            raise AgentRejected("the client asked for another target")
        check_fresh(request.timestamp, now)
        # A list of the user's own devices asks for no protection: any Objective-ID names it.
        if request.kind is not Kind.DEVICES and request.objective_id not in user.objectives:
            raise AgentRejected(f"objective {request.objective_id} not allowed for {user.user_id}")
        steps.mark("verify")
        return request

    @staticmethod
    def admit(transaction: AgentRequest, endorsement: Endorsement, request: ClientRequest, now: float) -> None:
        """In the caller's transaction: Target's own revocation list (what this user's own Host
        revoked), then both nonces (single use).

        Raises:
            AgentRejected: the user's key was revoked here, or a nonce was seen before.
        """
        if transaction.is_revoked(request.user_id, endorsement.user.sign_public_key, endorsement.host):
            raise AgentRejected(f"user {request.user_id} was revoked (Target's own list)")
        expires = at(now + REPLAY_TTL)
        if not transaction.claim_nonce("target", f"host:{endorsement.host}", endorsement.nonce, expires):
            raise AgentRejected("replayed endorsement")
        if not transaction.claim_nonce("target", f"user:{request.user_id}", request.request_id, expires):
            raise AgentRejected("replayed request")
