"""The tunnel agent's messages: layout, canonical encoding and checks. Pure.

The Client / Host / Target set-up (Liu, Lu, Kuo, Pang, Kuo: "The Performance Evaluation of a
Dynamic Configuration Method over IPSEC", section 2.2) lays a request out as ``Request ID ||
User ID || Objective-ID || Request Info || Authentication Tag`` and a response as ``Request
ID || Session Key || Tunneling Info || Authentication Tag``. qoss keeps those fields and
their order and carries them in canonical JSON (UTF-8, sorted keys, no whitespace, integers
only, bytes as unpadded base64url). A decoder re-encodes what it parsed and refuses anything
that does not come out byte-identical, so every message has exactly one encoding: a flipped
bit either breaks the encoding or changes what is signed and sealed.

The cryptography (Ed25519 signatures, HPKE seals) lives in ``app.adapters.agent.crypto``;
this package says what is signed, what the sealed envelope's header is, which checks a
receiver makes and in which order. Every failed check raises :class:`AgentRejected`,
whose public text is the same for all of them (an attacker learns nothing from it);
its ``reason`` is for the audit log only.

``codec`` is the encoding, ``wire`` the sealed message and its header, ``messages`` the
messages themselves, ``conns`` the strongSwan conns of a session.
"""

from app.domain.agent.codec import (
    ENVELOPE_INFO,
    MAX_RESPONSE_WIRE_BYTES,
    MAX_SEALED_BYTES,
    MAX_WIRE_BYTES,
    MLKEM_PUBLIC_BYTES,
    REPLAY_TTL,
    SIGNATURE_CONTEXT,
    WINDOW_BACK,
    WINDOW_SKEW,
    AgentRejected,
    DeviceQuotaExceeded,
    NoPostQuantumKey,
    PoolExhausted,
    TunnelQuotaExceeded,
    b64d,
    b64e,
    canonical,
    decode_canonical,
    valid_id,
)
from app.domain.agent.conns import (
    AGENT_CONN_PREFIX,
    agent_conn_name,
    client_conn,
    device_conn,
    device_identity,
    target_conn,
)
from app.domain.agent.messages import ClientRequest, Endorsement, Handoff, Response, Revocation
from app.domain.agent.parts import (
    AgentSessionState,
    DeviceBundle,
    EnrolledUser,
    RequestInfo,
    SessionStatus,
    TunnelingInfo,
)
from app.domain.agent.wire import (
    Kind,
    Wire,
    check_fresh,
    open_plaintext,
    parse_wire,
    seal_plaintext,
    sealed_hybrid,
    signed_bytes,
)

__all__ = [
    "AGENT_CONN_PREFIX",
    "ENVELOPE_INFO",
    "MAX_RESPONSE_WIRE_BYTES",
    "MAX_SEALED_BYTES",
    "MAX_WIRE_BYTES",
    "MLKEM_PUBLIC_BYTES",
    "REPLAY_TTL",
    "SIGNATURE_CONTEXT",
    "WINDOW_BACK",
    "WINDOW_SKEW",
    "AgentRejected",
    "AgentSessionState",
    "ClientRequest",
    "DeviceBundle",
    "DeviceQuotaExceeded",
    "Endorsement",
    "EnrolledUser",
    "Handoff",
    "Kind",
    "NoPostQuantumKey",
    "PoolExhausted",
    "RequestInfo",
    "Response",
    "Revocation",
    "SessionStatus",
    "TunnelQuotaExceeded",
    "TunnelingInfo",
    "Wire",
    "agent_conn_name",
    "b64d",
    "b64e",
    "canonical",
    "check_fresh",
    "client_conn",
    "decode_canonical",
    "device_conn",
    "device_identity",
    "open_plaintext",
    "parse_wire",
    "seal_plaintext",
    "sealed_hybrid",
    "signed_bytes",
    "target_conn",
    "valid_id",
]
