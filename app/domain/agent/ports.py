"""What the tunnel agent's roles (``app/services/agent_*.py``) need from the world, as protocols:
their state (users, nonces, sessions, leases, revocations), their keys and the other parties'
public keys, and the message transport between roles. Their charon is the one charon port,
:class:`app.domain.charon_port.ViciPort`, as everywhere else.

The roles are written against these and nothing concrete. The composition roots
(``app/main.py``, ``app/cli/agent.py``) hand them the real adapters: ``SqlAgentStore``
(``adapters/db/agent_store.py``; its request transactions are the raw-SQL hot path of
``adapters/db/hot.py``), ``KeyPair`` and ``CRYPTO`` (``adapters/agent/crypto.py``) and
``post_message`` (``adapters/agent/transport.py``); tests hand them the in-memory store of
``tests/fakes/agent_store.py``. The same contract tests run against the SQL store and its fake
(``tests/contract/test_agent_stores.py``).

A unit of work or a request transaction is one transaction: its stores flush, never commit;
the role that opened it commits it or rolls it back (leaving ``with`` rolls back what was not
committed). Every store raises the domain's errors (``NotFound``, ``AlreadyExists``), never a
database's.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.domain.agent import AgentSessionState, EnrolledUser, Kind
from app.domain.ports import Transaction

__all__ = [
    "AgentCrypto",
    "AgentKeys",
    "AgentRequest",
    "AgentSession",
    "AgentSessionStore",
    "AgentStore",
    "AgentUnitOfWork",
    "AgentUserStore",
    "DeviceGrant",
    "DeviceKit",
    "DeviceProfileRequest",
    "HandoffStore",
    "Invitation",
    "InvitationStore",
    "IssuedDevice",
    "LeaseStore",
    "NonceStore",
    "PeerKeys",
    "PendingRevocation",
    "PendingRevocationStore",
    "Post",
    "RevocationRecord",
    "RevocationStore",
    "UserListing",
    "WaitingHandoff",
]


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class AgentSession:
    """A tunnel Target set up for a client (its ticket), until closed, expired or revoked."""

    ticket: str
    user_id: str
    host_id: str
    request_id: str
    objective_id: int
    protection: str
    conn: str
    pool: str | None
    virtual_ip: str | None
    client_identity: str
    suite: dict[str, Any]
    state: str
    expires_at: datetime
    reason: str = ""
    created_at: datetime = field(default_factory=_now)
    #: None: the same as ``created_at``.
    updated_at: datetime | None = None
    #: What it was negotiated under, to negotiate it again after an edit
    #: (:func:`app.services.agent.target_edits.session_provenance`); None: made before it was kept.
    provenance: dict[str, Any] | None = None
    #: A device enrolment: the platform whose VPN client holds its profile (None: a client's session).
    platform: str | None = None


@dataclass(frozen=True, slots=True)
class WaitingHandoff:
    """A device's profile waiting at Host for its one-time download, and the user who left it."""

    user_id: str
    profile_name: str
    media_type: str
    profile: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class RevocationRecord:
    """Target's record of a revoked user key (``sign_public_key`` in unpadded base64url)."""

    user_id: str
    sign_public_key: str
    host_id: str
    revoked_at: datetime


@dataclass(frozen=True, slots=True)
class PendingRevocation:
    """Host's revocation of a user that a Target has not confirmed yet: how often it was sent in
    vain, when it is sent next and why the last attempt failed."""

    target_id: str
    user_id: str
    sign_public_key: bytes
    attempts: int
    next_attempt_at: datetime
    last_error: str = ""
    created_at: datetime = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class Invitation:
    """A one-time invitation at Host (its secret is never kept: only the secret's SHA-256, ``digest``):
    who it is for, which platform it grants a device enrolment of, who made it and its life. Once
    redeemed, ``sign_public_key`` (unpadded base64url) names the keys the phone registered with it,
    and ``grant_spent_at`` says when the device enrolment it grants was used."""

    id: str
    digest: str = field(repr=False)
    user_id: str
    platform: str
    objectives: tuple[int, ...]
    minimums: dict[str, int]
    created_by: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    revoked_at: datetime | None = None
    sign_public_key: str | None = None
    grant_spent_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """A device enrolment an invitation granted to the keys that redeemed it (``spent_at``: None
    until an enrolment used it)."""

    invitation_id: str
    platform: str
    minimums: dict[str, int]
    granted_at: datetime
    spent_at: datetime | None


#: An enrolled user, when they were enrolled, and when revoked (None: they are not).
UserListing = tuple[EnrolledUser, datetime, datetime | None]


class AgentUserStore(Protocol):
    """The users Host enrolled."""

    def enroll(self, user: EnrolledUser) -> None:
        """Enrol a new user, or re-enrol a revoked one with new keys (``AlreadyExists``: an active
        user of that id exists)."""
        ...

    def find(self, user_id: str) -> EnrolledUser | None: ...

    def all(self) -> builtins.list[UserListing]:
        """Every user, by id."""
        ...

    def revoke(self, user_id: str) -> bool:
        """Mark revoked; False if it was already (``NotFound``: no such user)."""
        ...


class NonceStore(Protocol):
    """The replay cache: one entry per (scope, sender, nonce) until it expires."""

    def claim(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        """Record the nonce; False if it is there already (a replay). Of concurrent claims one wins."""
        ...

    def purge(self, now: datetime) -> int:
        """Forget nonces that expired before ``now``; how many."""
        ...


class AgentSessionStore(Protocol):
    """Target's sessions (tickets, single use)."""

    def add(self, session: AgentSession) -> None:
        """Record a new session (``AlreadyExists``: the ticket exists)."""
        ...

    def get(self, ticket: str) -> AgentSession | None: ...

    def select(self, *, state: AgentSessionState | None = None, user_id: str | None = None,
               limit: int = ...) -> builtins.list[AgentSession]:
        """Sessions newest first, those in ``state`` and of ``user_id`` if given, at most ``limit``."""
        ...

    def expired(self, now: datetime) -> builtins.list[AgentSession]:
        """Active sessions whose expiry is not after ``now``."""
        ...

    def finish(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        """Move an active session to ``state`` (``reason``: at most 200 characters kept); False if
        it was not active (single use)."""
        ...


class LeaseStore(Protocol):
    """The virtual IPs Target handed to its sessions' clients (an address to one ticket at most)."""

    def taken(self) -> set[str]: ...

    def take(self, address: str, ticket: str) -> bool:
        """Lease ``address`` to ``ticket``; False if someone else has it."""
        ...

    def release(self, ticket: str) -> None: ...


class RevocationStore(Protocol):
    """Target's own revocation list: the (Host, user, signing key) it no longer accepts. A user is
    one Host's: another Host's user of the same id is another user."""

    def add(self, *, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        """Record ``host_id``'s revocation; False if it was recorded already."""
        ...

    def revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        """Whether ``host_id`` revoked this user's key."""
        ...

    def all(self, limit: int | None = None) -> builtins.list[RevocationRecord]:
        """Newest first (at most ``limit``)."""
        ...


class PendingRevocationStore(Protocol):
    """Host's revocations a Target has not confirmed yet: one per (target, user)."""

    def add(self, *, target_id: str, user_id: str, sign_public_key: bytes, now: datetime) -> None:
        """Keep it, due at ``now`` (one kept already for that target and user is replaced)."""
        ...

    def due(self, now: datetime, limit: int = ...) -> builtins.list[PendingRevocation]:
        """Those due at ``now``, the most overdue first, at most ``limit``."""
        ...

    def of_user(self, user_id: str) -> builtins.list[PendingRevocation]:
        """Those of ``user_id``, by target."""
        ...

    def confirm(self, target_id: str, user_id: str, sign_public_key: bytes) -> bool:
        """Forget it: the target confirmed the revocation of that key (False: none kept for it)."""
        ...

    def postpone(self, target_id: str, user_id: str, *, attempts: int, next_attempt_at: datetime,
                 error: str) -> None:
        """``attempts`` made (the last one failing with ``error``), the next one due at
        ``next_attempt_at``."""
        ...

    def forget(self, target_id: str, user_id: str) -> None:
        """Give up on it (its target is no longer configured)."""
        ...


class HandoffStore(Protocol):
    """Profiles waiting to be fetched once from a link, by the SHA-256 of the link's secret."""

    def add(self, *, digest: str, user_id: str, profile_name: str, media_type: str, profile: bytes,
            expires_at: datetime) -> None: ...

    def take(self, digest: str, now: datetime) -> WaitingHandoff | None:
        """Remove and return it if it is there and not expired."""
        ...

    def forget_user(self, user_id: str) -> int:
        """Forget every profile this user left (they were revoked); how many."""
        ...

    def purge(self, now: datetime) -> int:
        """Forget the expired ones; how many."""
        ...


class InvitationStore(Protocol):
    """Host's one-time invitations, found by the SHA-256 of their secret."""

    def add(self, invitation: Invitation) -> None: ...

    def by_digest(self, digest: str) -> Invitation | None: ...

    def get(self, invitation_id: str) -> Invitation | None: ...

    def select(self, *, user_id: str | None = None, limit: int = 100) -> builtins.list[Invitation]:
        """Newest first."""
        ...

    def redeem(self, invitation_id: str, *, sign_public_key: str, now: datetime) -> bool:
        """Spend it for these keys if it is neither used, revoked nor expired; False otherwise
        (one statement: two redemptions of one invitation never both succeed)."""
        ...

    def revoke(self, invitation_id: str, now: datetime) -> bool:
        """Revoke it if it is neither used nor revoked yet; False otherwise."""
        ...

    def invited(self, user_id: str, sign_public_key: str) -> bool:
        """Whether these are keys an invitation registered for this user."""
        ...

    def withdraw_user(self, user_id: str, now: datetime) -> int:
        """Revoke every invitation of this user nobody has used yet (the user was revoked); how many."""
        ...

    def restore_grant(self, invitation_id: str) -> None:
        """Give back a device enrolment whose enrolment failed."""
        ...


class AgentUnitOfWork(Transaction, Protocol):
    """One transaction over the agent's state, for what is not on a message's path (enrolment,
    listings, ending sessions, sweeps)."""

    @property
    def users(self) -> AgentUserStore: ...

    @property
    def nonces(self) -> NonceStore: ...

    @property
    def sessions(self) -> AgentSessionStore: ...

    @property
    def leases(self) -> LeaseStore: ...

    @property
    def revocations(self) -> RevocationStore: ...

    @property
    def handoffs(self) -> HandoffStore: ...

    @property
    def pending_revocations(self) -> PendingRevocationStore: ...

    @property
    def invitations(self) -> InvitationStore: ...

    def __enter__(self) -> AgentUnitOfWork: ...


class AgentRequest(Protocol):
    """The write transaction of one agent message: its checks and records, begun at once (it
    holds the database's write lock on SQLite). The real one runs each call as one precompiled
    statement on the database driver's cursor (``adapters/db/hot.py``)."""

    def find_user(self, user_id: str) -> EnrolledUser | None: ...

    def claim_nonce(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        """:meth:`NonceStore.claim` in this transaction."""
        ...

    def is_revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        """Whether Target's revocation list has this user's signing key, revoked by ``host_id``."""
        ...

    def held_sessions(self, host_id: str, user_id: str) -> tuple[int, int]:
        """What ``host_id``'s user ``user_id`` holds addresses for: (devices enrolled and not
        revoked, tunnels up). Another transaction asking for the same pair waits until this one
        ends (a quota holds under concurrency)."""
        ...

    def revocation_pending(self, user_id: str, target_id: str) -> bool:
        """Whether Host still waits for ``target_id`` to confirm its revocation of ``user_id``."""
        ...

    def leased_addresses(self) -> set[str]: ...

    def take_lease(self, address: str, ticket: str) -> bool:
        """:meth:`LeaseStore.take` in this transaction."""
        ...

    def add_session(self, session: AgentSession) -> None:
        """:meth:`AgentSessionStore.add` in this transaction (a clash fails the transaction)."""
        ...

    def session(self, ticket: str) -> AgentSession | None:
        """:meth:`AgentSessionStore.get` in this transaction."""
        ...

    def finish_session(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        """:meth:`AgentSessionStore.finish` in this transaction."""
        ...

    def release_lease(self, ticket: str) -> None:
        """:meth:`LeaseStore.release` in this transaction."""
        ...

    def device_grants(self, user_id: str, sign_public_key: bytes) -> builtins.list[DeviceGrant]:
        """The device enrolments invitations granted to this user's keys, spent or not (empty:
        keys of the user's own, not registered from an invitation)."""
        ...

    def spend_grant(self, invitation_id: str, now: datetime) -> bool:
        """Use the device enrolment this invitation granted; False if it was used already."""
        ...

    def commit(self) -> None:
        """Commit (after a failed commit the transaction is rolled back)."""
        ...

    def rollback(self) -> None: ...

    def __enter__(self) -> AgentRequest: ...

    def __exit__(self, *exc: object) -> None:
        """Roll back what was not committed, and let go of the connection."""
        ...


class AgentStore(Protocol):
    """Where the agent keeps its state: opens transactions over it."""

    def unit(self) -> AgentUnitOfWork:
        """A unit of work (a read-only one is simply never committed)."""
        ...

    def request(self) -> AgentRequest:
        """The write transaction of one message, begun now."""
        ...


# --------------------------------------------------------------------------- keys and transport


class PeerKeys(Protocol):
    """Another party's public keys: Ed25519 to verify and X25519 to seal to (32 bytes each), and
    ML-KEM-768 (1,184 bytes; None for keys made without one), sealed to beside X25519."""

    @property
    def sign(self) -> bytes: ...

    @property
    def kem(self) -> bytes: ...

    @property
    def mlkem(self) -> bytes | None: ...


class AgentKeys(Protocol):
    """One party's own private keys and what only they can do (the crypto adapter's ``KeyPair``)."""

    @property
    def name(self) -> str: ...

    @property
    def public(self) -> PeerKeys:
        """The public halves, which others verify with and seal to."""
        ...

    def seal(self, *, kind: Kind, to: str, body: bytes, recipient: bytes, recipient_mlkem: bytes | None = None,
             post_quantum: bool = False) -> bytes:
        """Sign ``body`` with these keys and seal it to the recipient: hybrid to its ML-KEM-768
        (``recipient_mlkem``) and X25519 (``recipient``) keys, or to its X25519 key alone when it has
        no ML-KEM-768 key; the wire bytes. ``post_quantum``: the message carries a post-quantum
        preshared key, and is refused (``NoPostQuantumKey``) unless sealed hybrid."""
        ...

    def open_sealed(self, data: bytes, *, kinds: Sequence[Kind], hybrid_only: bool = False
                    ) -> tuple[Kind, bytes, bytes]:
        """Check the header and open a message sealed to these keys: (kind, signed body, tag), not
        yet verified (``AgentRejected``: malformed, not for these keys, the seal does not open, or
        sealed with X25519 alone where ``hybrid_only``)."""
        ...


class AgentCrypto(Protocol):
    """What needs no private key: signatures checked, public keys read
    (the crypto adapter's ``CRYPTO``)."""

    def verify(self, public_sign_key: bytes, kind: Kind, body: bytes, tag: bytes) -> None:
        """``AgentRejected`` unless ``tag`` is ``public_sign_key``'s signature of ``body`` as ``kind``."""
        ...

    def public_keys(self, sign: str, kem: str, mlkem: str | None = None) -> PeerKeys:
        """From unpadded base64url text (``InvalidInput``: not 32-byte keys, or ``mlkem`` not an
        ML-KEM-768 key)."""
        ...

    def read_public(self, path: Path) -> PeerKeys:
        """From a ``<name>.pub.json`` file (``InvalidInput``: unreadable or malformed)."""
        ...


#: Sends one message to another role: (url, wire) -> the answer's wire. Raises ``AgentRejected``,
#: ``RemoteRefused`` (the other role answered with an error) or ``PeerUnreachable``.
Post = Callable[[str, bytes], bytes]



@dataclass(frozen=True, slots=True)
class DeviceProfileRequest:
    """What a device's profile says: where and whom it connects to, as whom, with which suite."""

    platform: str
    name: str
    remote_address: str
    remote_id: str
    local_id: str
    ike_proposal: str
    esp_proposal: str
    ike_lifetime: int
    child_lifetime: int
    remote_ts: tuple[str, ...]
    domains: tuple[str, ...]
    #: A post-quantum preshared key (RFC 8784) the profile makes mandatory, and its PPK id.
    ppk: bytes | None = field(default=None, repr=False)
    ppk_id: str | None = None


@dataclass(frozen=True, slots=True)
class IssuedDevice:
    """A device's credential and profile, made by :class:`DeviceKit`: the profile (file name, media
    type, bytes), the files it names beside it, the one-time passphrase of the PKCS#12 inside, and
    when the certificate expires. Target keeps none of it."""

    profile_name: str
    media_type: str
    profile: bytes = field(repr=False)
    files: dict[str, bytes] = field(repr=False)
    passphrase: str = field(repr=False)
    not_after: datetime


class DeviceKit(Protocol):
    """Target's certificate authority for devices and its profile writers.

    ``express`` raises ``ValueError`` (the domain's ``Inexpressible``) when the platform cannot say
    the suite in its own names: no credential is issued then.
    """

    def ca_cert(self) -> bytes:
        """The CA certificate (DER) that signs the gateway's and the devices' certificates."""
        ...

    def gateway(self, identity: str, addresses: Sequence[str]) -> tuple[bytes, bytes]:
        """The gateway's certificate and private key (DER, PKCS#8), made once and kept."""
        ...

    def ike_identity(self, identity: str, platform: str) -> str:
        """The IKE identity ``platform``'s client sends with the certificate issued for ``identity``
        (its subject DN, or the name in its subjectAltName)."""
        ...

    def issue(self, identity: str, lifetime: int, profile: DeviceProfileRequest) -> IssuedDevice:
        """A new key and certificate for one device, its PKCS#12 under a fresh passphrase, and its
        profile."""
        ...

    def seal_ppk(self, ppk: bytes, *, context: str) -> str:
        """A device's PPK sealed under a key that only this Target holds and bound to ``context``
        (its session): all a session keeps of it, to load it into charon again after a restart."""
        ...

    def open_ppk(self, sealed: str, *, context: str) -> bytes:
        """A PPK :meth:`seal_ppk` sealed for ``context`` (``ValueError``: it was not, or was changed)."""
        ...
