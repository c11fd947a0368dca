"""Service settings, read from the environment (prefix ``QOSS_``) or a ``.env`` file; and the
files that travel with qoss: the shipped rating tables (``ratings/``) and policies
(``policies/``), and the database migrations (``migrations/``).

In a checkout those stand at the top of the repository. The wheel carries them inside the
package, under ``app/_shipped/`` (the build maps them there, see ``pyproject.toml``), where
:mod:`importlib.resources` finds them wherever the wheel is installed and whatever the working
directory. Either way there is one copy of each.

The settings come in sections, one class each (connections, database, rate limits, re-key,
strongSwan, the agent, the console, OpenID sign-in, peering, tuning), in the order and under
the headings of docs/configuration.md. :class:`Settings` inherits them all, so every field is
``settings.<field>`` and every variable ``QOSS_<FIELD>`` whichever section holds it.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal, Self, TypeVar

from pydantic import BeforeValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = [
    "MIGRATIONS_DIR",
    "SHIPPED_POLICIES_DIR",
    "SHIPPED_RATINGS_DIR",
    "AgentSettings",
    "ConnectionSettings",
    "ConsoleSettings",
    "DatabaseSettings",
    "GatewaySettings",
    "OidcSettings",
    "PeeringSettings",
    "RateLimitSettings",
    "RekeySettings",
    "Settings",
    "TuningSettings",
]

_CHECKOUT = Path(__file__).resolve().parent.parent


def _shipped(name: str) -> Path:
    # A wheel is installed unpacked, so its resources are plain directories on disk
    # (Alembic and the YAML loader both want a real path).
    packaged = Path(str(files("app").joinpath("_shipped", name)))
    return packaged if packaged.is_dir() else _CHECKOUT / name


#: The rating tables qoss ships (``esaf-2006``, ``standards-2026``).
SHIPPED_RATINGS_DIR = _shipped("ratings")
#: The policies qoss ships.
SHIPPED_POLICIES_DIR = _shipped("policies")
#: The Alembic migrations: the only way the schema is made.
MIGRATIONS_DIR = _shipped("migrations")


def _comma_list(value: object, *, spaces: bool = False) -> object:
    """A comma-separated value from the environment (with ``spaces``, separated by white space
    too), as a list of its non-empty parts; a value that is not text, as it is."""
    if not isinstance(value, str):
        return value
    parts = value.replace(",", " ").split() if spaces else value.split(",")
    return [part.strip() for part in parts if part.strip()]


_T = TypeVar("_T")
#: A list that the environment gives as one comma-separated value (not JSON).
_CommaList = Annotated[list[_T], NoDecode, BeforeValidator(_comma_list)]
#: The same, its parts separated by commas or white space.
_WordList = Annotated[list[_T], NoDecode, BeforeValidator(functools.partial(_comma_list, spaces=True))]


class _Section(BaseSettings):
    """What every section shares: the ``QOSS_`` prefix, the ``.env`` file, unknown names ignored."""

    model_config = SettingsConfigDict(env_prefix="QOSS_", env_file=".env", extra="ignore")


class ConnectionSettings(_Section):
    """HTTP and connections: where ``qoss serve`` listens, what one process holds and works
    on at once, and how long a client may take."""

    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    max_body_bytes: int = Field(default=1_048_576, description="request bodies larger than this get 413")
    listen_backlog: int = Field(
        default=4096, ge=16, le=65535,
        description="connections the kernel queues before qoss accepts them (capped by net.core.somaxconn); "
                    "a burst larger than this waits for SYN retransmits")
    max_connections: int | None = Field(
        default=None, ge=0, le=1_000_000,
        description="connections a process holds open at once (idle kept-alive ones included); beyond it, new "
                    "connections wait in the kernel's listen backlog until one closes, and are accepted in turn; "
                    "0: every connection is accepted at once. Above max_in_flight + max_event_streams (default: "
                    "256, or those two and 64 more if that is more)")
    waiting_room: bool = Field(
        default=True,
        description="at max_connections, go on accepting up to listen_backlog more connections and hold each as "
                    "a bare socket (about 100 bytes): GET /healthz, /livez and /metrics on them are answered at "
                    "once, other requests in turn as places free; false: they all wait in the kernel's listen "
                    "backlog, health checks on new connections among them")
    silent_timeout: float = Field(
        default=10.0, gt=0, le=3600,
        description="seconds a new connection may send nothing before it is closed (with max_connections above "
                    "0; one that has sent its request waits its turn however long)")
    header_timeout: float = Field(
        default=10.0, ge=0, le=3600,
        description="seconds a client has to send a request's whole head (request line and headers), in total, "
                    "from its connection's accepting (from the head's first byte on a kept-alive connection); "
                    "beyond it the connection is closed, with 408 if it had begun. A new connection holds no "
                    "place under max_connections until its head is in. 0: no deadline")
    body_timeout: float = Field(
        default=30.0, ge=0, le=86_400,
        description="seconds a request's body has, from the end of its head, to arrive whole (time the service "
                    "itself stops reading does not count); beyond it 408 and the connection is closed. 0: no "
                    "deadline")
    send_timeout: float = Field(
        default=10.0, ge=0, le=3600,
        description="seconds an answer may wait, in a row, for a client that takes none of it (the connection's "
                    "send buffer full); beyond it the connection is dropped and its place freed. 0: no deadline")
    max_connections_per_source: int = Field(
        default=64, ge=0, le=1_000_000,
        description="connections one client address (an IPv6 /64) may hold at once, waiting ones included; the "
                    "next is answered 503 with Retry-After and closed. The address is the socket's peer: "
                    "trusted_proxies and loopback addresses (a proxy on the same host) are not counted. Applies "
                    "with max_connections above 0; 0: no limit")
    trusted_proxies: _CommaList[str] = Field(
        default=[], description="addresses or networks of the reverse proxies whose forwarded header names the "
        "client (comma-separated in the environment); none by default: the peer's address is the client's")
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = Field(
        default="x-forwarded-for", description="the header those proxies write (only that one is read)")
    max_in_flight: int = Field(
        default=64, ge=1, le=100_000,
        description="requests a process works on at once; beyond it, 503 Overloaded with Retry-After at once "
                    "(/healthz, /livez and /metrics are never counted or queued)")
    worker_threads: int = Field(
        default=40, ge=2, le=1000,
        description="threads that run blocking work (database, VICI, files) off the event loop")
    max_writes_in_flight: int | None = Field(
        default=None, ge=1, le=1000,
        description="requests that may hold or wait for a write transaction at once (default: half of "
                    "worker_threads); must be below worker_threads, so that writers waiting on the database's "
                    "lock never hold every worker thread while the one holding it needs one to answer and commit")
    write_wait_timeout: float = Field(
        default=5.0, gt=0, le=60,
        description="seconds a change waits for one of max_writes_in_flight before 503 Overloaded")
    max_event_streams: int = Field(
        default=100, ge=1, le=10_000, description="clients following GET /v1/events at once (beyond: 503)")
    max_event_streams_per_token: int = Field(
        default=5, ge=1, le=10_000, description="event streams (GET /v1/events and the console's /ui/events) one "
        "token may follow at once, within max_event_streams; beyond: 429 TooManyStreams for that token only (a "
        "browser opens about 6 connections to one server, so 5 streams leave it one for pages)")
    event_stream_seconds: float = Field(
        default=3600.0, ge=0.1, le=86_400, description="seconds one GET /v1/events stream lasts; the client then "
                                                      "reconnects with Last-Event-ID and misses nothing")

    @model_validator(mode="after")
    def _writers_leave_a_thread(self) -> Self:
        if self.max_writes_in_flight is not None and self.max_writes_in_flight >= self.worker_threads:
            raise ValueError(f"max_writes_in_flight ({self.max_writes_in_flight}) must be below worker_threads "
                             f"({self.worker_threads})")
        return self

    @model_validator(mode="after")
    def _connections_leave_room(self) -> Self:
        if self.max_connections and self.max_connections <= self.max_in_flight + self.max_event_streams:
            raise ValueError(f"max_connections ({self.max_connections}) must be above max_in_flight + "
                             f"max_event_streams ({self.max_in_flight + self.max_event_streams}), or 0")
        return self

    @property
    def connections_held(self) -> int:
        """``max_connections``, or its default: 256, or ``max_in_flight`` + ``max_event_streams`` + 64
        if that is more (0: no bound)."""
        if self.max_connections is not None:
            return self.max_connections
        return max(256, self.max_in_flight + self.max_event_streams + 64)

    @property
    def writes_in_flight(self) -> int:
        """``max_writes_in_flight``, or its default: half of ``worker_threads`` (at least 1).

        A tunnel's set-up holds its place while strongSwan works, mostly waiting: enough places
        keep the cores busy with many set-ups at once (docs/performance.md, "How many set-ups
        at once")."""
        return self.max_writes_in_flight or max(1, self.worker_threads // 2)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_networks(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError as exc:
                raise ValueError(f"trusted_proxies: {item[:64]!r} is not an address or network") from exc
        return value


class DatabaseSettings(_Section):
    """The database: where it is, its connections, what a new one is given, and how long a read
    of it is trusted."""

    database_url: str = Field(default="sqlite:///./var/qoss.db", description="SQLAlchemy URL")
    db_pool_size: int = Field(default=20, ge=1, le=1000, description="database connections kept open per process")
    db_pool_overflow: int = Field(default=40, ge=0, le=1000, description="extra connections opened under load")
    db_pool_timeout: float = Field(
        default=0.5, gt=0, le=60,
        description="seconds a request waits for a database connection before 503 DatabaseUnavailable")
    write_groups: bool = Field(
        default=True,
        description="SQLite: the records of the tunnel set-ups that wait for the database's writer at the same time "
                    "are committed in one transaction, each with its event and audit entry; false: one "
                    "transaction each. PostgreSQL never groups")
    idempotency_lease: float = Field(
        default=120.0, ge=1, le=86400,
        description="seconds after which a request's Idempotency-Key, claimed and never answered (its process "
                    "died), is taken over by a retry; longer than any request runs (a tunnel set-up is bounded "
                    "by the VICI timeouts)")
    table_cache_ttl: float | None = Field(
        default=None, ge=0, le=60, description="seconds a rating table read is trusted without asking the database "
                                               "its revision (default: 1 on SQLite; 30 on PostgreSQL while the "
                                               "replicas' change notices are followed, else 0); 0: always ask")
    gateway_cache_ttl: float | None = Field(
        default=None, ge=0, le=60, description="seconds a registered gateway or peer read is trusted without reading "
                                               "it again (default: 1 on SQLite; 30 on PostgreSQL while the replicas' "
                                               "change notices are followed, else 0); changes are seen at once")
    token_cache_ttl: float | None = Field(
        default=None, ge=0, le=60, description="seconds an API token read is trusted without reading it again "
                                               "(default: 1 on SQLite; 30 on PostgreSQL while the replicas' change "
                                               "notices are followed, else 0); revocations hold at once, expiry on "
                                               "every use")
    leader_interval: float = Field(
        default=2.0, gt=0, le=60, description="seconds between a replica's tries to take the lead (PostgreSQL: an "
                                             "advisory lock), and the leader's checks that it still holds it")
    events_keep_days: float = Field(default=30.0, gt=0, le=3650, description="days events are kept for resuming")

    default_table: str = Field(default="standards-2026", description="rating table used when none is named")

    ratings_dir: Path = Field(
        default=SHIPPED_RATINGS_DIR, description="rating tables (YAML) loaded into a new database: the shipped ones"
    )
    policies_dir: Path = Field(
        default=SHIPPED_POLICIES_DIR, description="policies (YAML) loaded into a new database: the shipped ones"
    )
    load_shipped: bool = Field(default=True, description="load ratings_dir and policies_dir into an empty database")


class RateLimitSettings(_Section):
    """Rate limits: how fast one token, one client address, or all clients together may ask."""

    tunnel_rate: float = Field(default=20.0, description="tunnel creations per second per token (average)")
    tunnel_burst: int = Field(default=250, description="tunnel creations a token may make at once")
    negotiation_rate: float = Field(
        default=50.0, gt=0, description="anonymous negotiations per second per client address (average)")
    negotiation_burst: int = Field(
        default=200, ge=1, description="anonymous negotiations a client address may make at once")
    negotiation_total_rate: float = Field(
        default=500.0, gt=0, description="anonymous negotiations per second from all clients together (average)")
    negotiation_total_burst: int = Field(
        default=2000, ge=1, description="anonymous negotiations all clients may make at once")
    auth_failure_rate: float = Field(
        default=1.0, gt=0, description="failed token checks per second a client address (an IPv6 /64) may make "
        "on average; past auth_failure_burst, its requests that carry a token are 429 (Retry-After) before the "
        "token is looked up, until its budget refills (counted across replicas on PostgreSQL)")
    auth_failure_burst: int = Field(
        default=20, ge=1, description="failed token checks a client address (an IPv6 /64) may make at once before "
        "auth_failure_rate holds it back")


class RekeySettings(_Section):
    """Re-key: what happens to the running tunnels after a rating, policy or gateway edit."""

    rekey: bool = Field(
        default=True, description="after a rating, policy or gateway edit, negotiate the running tunnels again and "
                                  "move those below their minimums to a compliant suite (make-before-break); "
                                  "a Target closes the agent sessions below their minimums, with the reason")
    rekey_cheaper: Literal["never", "on-next-rekey", "now"] = Field(
        default="never", description="a tunnel still compliant after an edit but with a cheaper or different choice: "
                                     "stays as it is (never), moves a few seconds before its charon would rekey "
                                     "its CHILD_SA anyway (on-next-rekey), or moves at once (now)")
    rekey_concurrency: int = Field(default=8, ge=1, le=256,
                                   description="tunnels moved (and agent sessions closed) at once")
    rekey_watch: float = Field(
        default=0.5, gt=0, le=60, description="seconds between the leader's looks at the event log for edits made "
                                             "by any replica (rating tables, policies, gateway refreshes)")
    rekey_retry: float = Field(
        default=60.0, gt=0, le=86_400, description="seconds before tunnels an edit left noncompliant are tried again")
    rekey_drain: float = Field(
        default=2.0, ge=0, le=60, description="seconds a moved tunnel's old SA stays after its new one is verified, "
                                              "for the packets already sealed with it")
    rekey_teardown_noncompliant: bool = Field(
        default=False, description="take down a tunnel that cannot be brought into compliance (default: keep it "
                                   "running, marked noncompliant with the reason)")


class GatewaySettings(_Section):
    """strongSwan: the charons qoss drives, how it talks to them, and how it watches their tunnels."""

    vici_timeout: float = Field(default=15.0, description="seconds to wait for a charon's answer")
    gateway_probe_timeout: float = Field(
        default=3.0, gt=0, le=60,
        description="seconds a gateway's registration or refresh waits for its charon to answer version, stats "
                    "and get-algorithms, all together (read before the change takes a write slot; beyond it, "
                    "503 GatewayUnreachable)")
    charon_control_calls: int = Field(
        default=4, ge=1, le=256, description="initiate and terminate calls this process keeps waiting in one charon at "
                                             "once (each holds one of charon's worker threads until its SAs are up "
                                             "or down; raise it with charon's `threads`)")
    sa_reports: bool = Field(
        default=True, description="verify a tunnel set-up's ends by charon's child-updown report of the SAs "
                                  "(one event connection per charon), asking list-sas only where a report is "
                                  "missing or differs; false: always list-sas")
    detached_initiate: bool = Field(
        default=True, description="a tunnel between two managed gateways (one of them may be a peer qoss's) is "
                                  "initiated without waiting in charon "
                                  "(none of charon's worker threads held, no log streamed) and known up by charon's "
                                  "report (sa_reports); false: charon answers the initiate once the SAs are up")
    vici_socket_dirs: list[Path] = Field(
        default_factory=lambda: [Path("var").resolve(), Path("/run/qoss"), Path("/run/strongswan")],
        description="a gateway's VICI socket must be a socket under one of these directories once every link "
                    "in its path and theirs is resolved (default: ./var, where `qoss lab` keeps its charons, "
                    "/run/qoss and /run/strongswan; charon's own default /run/charon.vici is not among them: "
                    "set its socket in one of these, or name a directory holding only charon's sockets)",
    )
    gateway_networks: list[str] = Field(
        default=["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "127.0.0.0/8"],
        description="a gateway's IKE address must be inside one of these networks",
    )
    reconcile_on_start: bool = Field(default=True, description="reconcile tunnels with the charons at start-up")
    monitor_tunnels: bool = Field(
        default=True, description="watch every gateway's SA events and keep tunnel records up/down accordingly"
    )
    monitor_interval: float = Field(
        default=5.0, gt=0, description="seconds between the monitor's look at the gateways (new ones, lost listeners)"
    )
    lab_dir: Path = Field(
        default_factory=lambda: Path("var", "lab").resolve(), description="state of `qoss lab` (default ./var/lab)"
    )


class AgentSettings(_Section):
    """The tunnel agent: its roles in ``qoss serve`` and how fast its clients may ask."""

    agent_config: Path | None = Field(
        default=None, description="the tunnel agent's YAML config: enables the Host and/or Target roles"
    )
    agent_rate: float = Field(default=5.0, description="agent requests per second per source address")
    agent_burst: int = Field(default=20, description="agent requests a source address may make at once")
    agent_user_rate: float = Field(
        default=1.0, gt=0, description="Host: agent requests per second per verified user (after the signature check)"
    )
    agent_user_burst: int = Field(default=10, ge=1, description="Host: agent requests a verified user may make at once")


class ConsoleSettings(_Section):
    """Access, the console and the audit trail: who may read, the console's sign-in, and the
    service's own directory with the audit chain's key."""

    reads_require_token: bool = Field(
        default=False, description="catalogue, ratings, policies and negotiations need a token too"
    )
    ui_session_ttl: int = Field(
        default=8 * 3600, ge=60, le=7 * 86400,
        description="seconds a console sign-in lasts (never longer than its token)")
    console_origins: _CommaList[str] = Field(
        default=[], description="origins (scheme://host[:port], comma-separated in the environment) a browser may "
        "post the console's sign-in form from besides the one the request itself names (its scheme and Host "
        "header): the console's public address when a reverse proxy rewrites Host; a sign-in whose Origin is "
        "neither is 403")

    @field_validator("console_origins")
    @classmethod
    def _console_origins(cls, value: list[str]) -> list[str]:
        from urllib.parse import urlsplit  # only this validator parses URLs

        origins = []
        for item in value:
            parts = urlsplit(item)
            try:
                port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
            except ValueError:
                port = None
            if parts.scheme.lower() not in ("http", "https") or not parts.hostname or port is None or (
                    parts.path not in ("", "/") or parts.query or parts.fragment or parts.username):
                raise ValueError(f"console_origins: {item[:64]!r} is not an origin (scheme://host[:port])")
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            origins.append(f"{parts.scheme.lower()}://{host}:{port}")
        return origins

    state_dir: Path = Field(
        default_factory=lambda: Path("var").resolve(),
        description="the service's own directory (made 0700, owned by the service's user; links in it are refused): "
                    "the console's plot cache, the audit chain's key and checkpoints")
    measurements_dir: Path = Field(
        default=Path("var/bench"),
        description="where the console looks for the newest `qoss bench micro --out` document (its "
                    "measurements page, and rating tables made from it)")
    audit_key_file: Path | None = Field(
        default=None,
        description="the audit chain's key (32 or more random bytes; the file itself, not a link; not readable by "
                    "other users): a secret every replica writing the database shares. Unset: "
                    "state_dir/audit/chain.key, made when the chain is empty or unkeyed so far")
    audit_checkpoint_every: int = Field(
        default=100, ge=1, le=1_000_000,
        description="write a checkpoint of the audit chain's end (to state_dir/audit/checkpoints.jsonl and the log) "
                    "each time this many more entries are written, and at shutdown: entries removed from the end "
                    "before the last checkpoint are found by `qoss audit verify`")
    audit_refusal_window: float = Field(
        default=60.0, gt=0, le=86_400, description="seconds over which repeated refusals of one kind (same "
        "source, outcome, method, route and token) make one audit entry: the first is recorded at once, the rest "
        "are counted and recorded as one entry ('N more refusals like request ...') when the window closes")


class OidcSettings(_Section):
    """OpenID sign-in: the console's sign-in with the organisation's OpenID provider."""

    oidc_issuer: str | None = Field(
        default=None, description="the console's sign-in with the organisation's OpenID provider: its issuer URL, "
        "exactly as its discovery document names it (https; http only to a loopback address); unset: no such "
        "sign-in, API tokens only")
    oidc_client_id: str | None = Field(
        default=None, validate_default=True, description="the console's client id at the OpenID provider")
    oidc_client_secret: SecretStr | None = Field(
        default=None, description="the console's client secret at the OpenID provider (never logged or shown; "
        "unset: a public client, PKCE alone)")
    oidc_redirect_url: str | None = Field(
        default=None, validate_default=True, description="the console's redirect URL to register at the "
        "provider, ending in /ui/oidc/callback: its public address, never taken from a request; needed with "
        "oidc_issuer")
    oidc_provider_name: str | None = Field(
        default=None, max_length=40, description="the provider's name on the sign-in button (default: the "
        "issuer's host)")
    oidc_request_scopes: _WordList[str] = Field(
        default=["openid", "email", "profile"], description="the OpenID scopes asked of the provider "
        "(comma-separated in the environment; openid among them)")
    oidc_session_ttl: int | None = Field(
        default=None, ge=60, le=7 * 86400, description="seconds a console session of the provider's user lasts "
        "(default: as long as the ID token; never longer than ui_session_ttl); then the provider is asked again")
    oidc_scopes_by_claim: Annotated[dict[str, dict[str, list[str]]], NoDecode] = Field(
        default={}, validate_default=True, description='which qoss scopes a user of the provider gets, as JSON: '
        '{"claim": {"value": ["scope", ...]}}, the union over every claim value the user has')
    oidc_timeout: float = Field(
        default=3.0, ge=0.5, le=30, description="seconds each request to the OpenID provider may take")
    oidc_calls_in_flight: int = Field(
        default=8, ge=1, le=256, description="requests to the OpenID provider one process makes at once; a "
        "sign-in that would make one more is refused at once (502), so a provider that does not answer holds "
        "this many worker threads at most")

    @field_validator("oidc_issuer", "oidc_redirect_url")
    @classmethod
    def _oidc_urls(cls, value: str | None, info: ValidationInfo) -> str | None:
        from urllib.parse import urlsplit  # only these validators parse URLs

        if value is None:
            if info.field_name == "oidc_redirect_url" and info.data.get("oidc_issuer") is not None:
                raise ValueError("needed with QOSS_OIDC_ISSUER (the console's public address and "
                                 "/ui/oidc/callback, as registered at the provider)")
            return None
        parts = urlsplit(value)
        loopback = parts.hostname in ("localhost", "127.0.0.1", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            raise ValueError("an https URL is needed (http only to a loopback address)")
        if not parts.hostname or parts.query or parts.fragment or parts.username:
            raise ValueError("a URL with a host and no query, fragment or user is needed")
        if info.field_name == "oidc_redirect_url" and not parts.path.endswith("/ui/oidc/callback"):
            raise ValueError("the console's redirect URL ends in /ui/oidc/callback")
        return value

    @field_validator("oidc_client_id")
    @classmethod
    def _oidc_client(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("oidc_issuer") is not None and not value:
            raise ValueError("needed with QOSS_OIDC_ISSUER")
        if info.data.get("oidc_issuer") is None and value and "oidc_issuer" in info.data:
            raise ValueError("QOSS_OIDC_ISSUER is not set")
        return value

    @field_validator("oidc_request_scopes")
    @classmethod
    def _oidc_request_scopes(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("openid must be among them")
        return value

    @field_validator("oidc_scopes_by_claim", mode="before")
    @classmethod
    def _oidc_mapping(cls, value: object, info: ValidationInfo) -> object:
        """Its JSON and its issuer here; its scopes against the domain's vocabulary where it is used
        (``app.domain.oidc.parse_mapping``: at start, and by every command, ``app.cli.db.settings_for``)."""
        mapping = value
        if isinstance(value, str | bytes):
            try:
                mapping = json.loads(value) if value.strip() else {}
            except ValueError as exc:
                raise ValueError(f"not JSON ({exc})") from None
        if "oidc_issuer" not in info.data:
            return {}  # the issuer itself is wrong: that error is said
        if info.data["oidc_issuer"] is not None and not mapping:
            raise ValueError("maps no claim to a scope: no one could sign in with QOSS_OIDC_ISSUER")
        if info.data["oidc_issuer"] is None and mapping:
            raise ValueError("QOSS_OIDC_ISSUER is not set")
        return mapping


class PeeringSettings(_Section):
    """Peering: this service among other qoss services that negotiate tunnels with it."""

    peer_name: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description="this service's name as its peers (other qoss services) know it; set, it answers their "
                    "messages and can ask them for tunnels (GATEWAY@PEER); unset, peering is off")
    peer_timeout: float = Field(
        default=5.0, gt=0, le=60,
        description="seconds a peer has to answer one message of a tunnel's exchange; beyond it the request "
                    "is answered 504 naming the peer, with nothing loaded here")
    peer_confirm_early: bool = Field(
        default=True,
        description="asking a peer for a tunnel, its confirm is sent as this side initiates (the peer answers "
                    "once its own end is up, the tunnel kept only when both ends are); false: sent once this "
                    "side's own end is verified, one exchange after the other (slower)")
    peer_rate: float = Field(
        default=5.0, gt=0, description="messages per second per peer, counted once a message's signature checks "
                                       "out (beside QOSS_AGENT_RATE per source address)")
    peer_burst: int = Field(default=20, ge=1, description="messages a peer may send at once")


class TuningSettings(_Section):
    """Tuning: the fast paths, and the memory a process gives back after a burst."""

    fast_paths: bool = Field(
        default=True, description="the fast paths (the agent's message routes, a peer's messages and a tunnel's create "
        "and delete answered without the framework, database "
        "statements on the DBAPI cursor, agent and peer HTTP on kept sockets); false: each through its library's "
        "public API, "
        "slower (docs/performance.md)")
    memory_release: _CommaList[Literal["threads", "pool", "trim"]] = Field(
        default=["threads", "pool", "trim"], description="what the process gives back after a burst, once no "
        "request has come for memory_release_after seconds (comma-separated in the environment; 'off' or empty: "
        "nothing): the idle worker threads end (threads), the pooled database connections are closed (pool), "
        "glibc returns its free memory to the kernel (trim, glibc only)")
    memory_release_after: float = Field(
        default=15.0, ge=1, le=86_400, description="seconds without a request before the memory release; worker "
        "threads end only once idle for 10 s")

    @field_validator("memory_release", mode="before")
    @classmethod
    def _memory_release_off(cls, value: object) -> object:
        return [] if _comma_list(value) == ["off"] else value  # its word for none


class Settings(
    ConnectionSettings,
    DatabaseSettings,
    RateLimitSettings,
    RekeySettings,
    GatewaySettings,
    AgentSettings,
    ConsoleSettings,
    OidcSettings,
    PeeringSettings,
    TuningSettings,
):
    """Everything configurable, one section per base class. Built once at start-up, never at import.

    A section alone reads the same ``QOSS_*`` variables, so a part that needs only its own
    section may ask for that class; :class:`Settings` is every one of them.
    """
