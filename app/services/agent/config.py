"""The tunnel agent's configuration: which roles this process plays and whom it trusts.

A server (``qoss serve``) reads it from ``QOSS_AGENT_CONFIG``; the client (``qoss agent
connect``) from ``--config``. Both are YAML. Public keys are given inline (unpadded
base64url) or as a ``<name>.pub.json`` file made by ``qoss agent keygen``; private keys
are only ever read from the key directory.

Server::

    id: host-1                  # this server's agent identity (its key files' name)
    key_dir: /etc/qoss/agent
    host:                       # present: this process plays Host
      targets:
        target-1: {url: "http://10.99.0.3:8000", public_key_file: /etc/qoss/agent/target-1.pub.json}
        # url "local": the Target role of this same process
    target:                     # present: this process plays Target
      hosts:
        host-1: {public_key_file: /etc/qoss/agent/host-1.pub.json}
      vici_socket: /run/charon.vici
      ike_address: 10.99.0.3
      protected: [10.3.0.1/32]  # what a client reaches through its tunnel
      pool: 10.3.8.0/24         # virtual IPs handed to clients (IPv4 or IPv6)
      pool6: fd08::/120         # optional, beside an IPv4 pool: each client also gets the IPv6
                                # address at the same offset (10.3.8.5 -> fd08::5)
      policy: mobile-default    # optional stored policy Target adds to every negotiation

Client::

    user: alice
    key_dir: ~/.qoss/agent
    host: {id: host-1, url: "http://10.99.0.2:8000"}
    targets:
      target-1: {public_key_file: target-1.pub.json}
    vici_socket: /run/charon.vici
    state_dir: ~/.qoss/agent/state
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.domain.agent.ports import AgentCrypto, PeerKeys
from app.domain.errors import InvalidInput

__all__ = ["AgentConfig", "ClientConfig", "Party", "TargetRole", "load_client_config", "load_server_config"]

Ident = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
#: A DNS domain a device's VPN client connects on demand for (``corp.example``).
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
Domain = Annotated[str, Field(max_length=253, pattern=rf"^({_LABEL}\.)*{_LABEL}$")]


class _Config(BaseModel):
    """A part of the agent's YAML config: unknown keys refused, read-only once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Party(_Config):
    """Another party's public keys (inline or from its ``.pub.json``), and where to reach it."""

    url: Annotated[str, Field(pattern=r"^(local|https?://[A-Za-z0-9.:\[\]_-]+(/[A-Za-z0-9._/-]*)?)$")] | None = None
    public_key_file: Path | None = None
    sign_public_key: str | None = None
    kem_public_key: str | None = None
    #: Its ML-KEM-768 key (inline; a key file carries its own): messages to it are sealed hybrid.
    mlkem_public_key: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Party:
        inline = self.sign_public_key is not None or self.kem_public_key is not None
        if inline == (self.public_key_file is not None):
            raise ValueError("give either public_key_file or sign_public_key + kem_public_key")
        if self.mlkem_public_key is not None and not inline:
            raise ValueError("mlkem_public_key goes with sign_public_key + kem_public_key (a key file carries its own)")
        return self

    def keys(self, base: Path, crypto: AgentCrypto) -> PeerKeys:
        """The party's public keys, read with ``crypto`` (``InvalidInput``: unreadable or malformed)."""
        if self.public_key_file is not None:
            path = self.public_key_file if self.public_key_file.is_absolute() else base / self.public_key_file
            return crypto.read_public(path)
        return crypto.public_keys(self.sign_public_key or "", self.kem_public_key or "", self.mlkem_public_key)


class HostRole(_Config):
    targets: Annotated[dict[Ident, Party], Field(min_length=1, max_length=64)]


class TargetRole(_Config):
    hosts: Annotated[dict[Ident, Party], Field(min_length=1, max_length=64)]
    vici_socket: Annotated[str, Field(pattern=r"^/[A-Za-z0-9_./-]{1,106}$")]
    ike_address: str
    identity: Ident | None = None
    protected: Annotated[list[str], Field(min_length=1, max_length=16)]
    pool: str
    #: An IPv6 pool beside an IPv4 ``pool``: a client also gets the address at the same offset in it.
    pool6: str | None = None
    policy: Ident | None = None
    rating_table: Ident | None = None
    max_lifetime: Annotated[int, Field(ge=30, le=86_400)] = 3600
    sweep_interval: Annotated[float, Field(ge=0.05, le=60)] = 1.0
    #: How long a device's certificate (and its enrolment) lasts, in seconds: 1 hour to 90 days.
    device_lifetime: Annotated[int, Field(ge=3600, le=90 * 86_400)] = 7 * 86_400
    #: How many devices one user of one Host may have enrolled here at once (each holds an address
    #: of ``pool`` for its certificate's life).
    devices_per_user: Annotated[int, Field(ge=1, le=1000)] = 3
    #: How many tunnels one user of one Host may have up here at once (each holds an address of
    #: ``pool`` until it is closed or expires).
    tunnels_per_user: Annotated[int, Field(ge=1, le=1000)] = 16
    #: DNS domains behind this Target: a device's profile connects on demand when they are looked up.
    domains: Annotated[list[Domain], Field(max_length=16)] = []

    @field_validator("ike_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return str(ipaddress.ip_address(value))

    @field_validator("protected")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return [str(ipaddress.ip_network(v, strict=False)) for v in value]

    @field_validator("pool", "pool6")
    @classmethod
    def _pool(cls, value: str | None) -> str | None:
        if value is None:
            return None
        net = ipaddress.ip_network(value, strict=True)
        if net.num_addresses < 4 or net.num_addresses > 65536:
            raise ValueError("a pool is a network of 4 to 65536 addresses")
        return str(net)

    @model_validator(mode="after")
    def _dual_pool(self) -> TargetRole:
        if self.pool6 is not None:
            pool, pool6 = ipaddress.ip_network(self.pool), ipaddress.ip_network(self.pool6)
            if pool.version != 4 or pool6.version != 6:
                raise ValueError("pool6 is an IPv6 pool beside an IPv4 pool")
            if pool6.num_addresses < pool.num_addresses:
                raise ValueError("pool6 needs at least as many addresses as pool")
        return self


class AgentConfig(_Config):
    """A server's agent configuration."""

    id: Ident
    key_dir: Path
    host: HostRole | None = None
    target: TargetRole | None = None
    base_dir: Path = Path()  # where relative public_key_file paths start (the config file's directory)

    @model_validator(mode="after")
    def _some_role(self) -> AgentConfig:
        if self.host is None and self.target is None:
            raise ValueError("configure the host role, the target role, or both")
        if self.host is not None:
            for name, party in self.host.targets.items():
                if party.url is None:
                    raise ValueError(f"target {name} needs a url")
                if party.url == "local" and (self.target is None or name != self.id):
                    raise ValueError(f"target {name} is 'local' but this process is not target {name}")
        return self

    @property
    def target_identity(self) -> str:
        return (self.target.identity if self.target and self.target.identity else f"{self.id}.qoss")


class ClientConfig(_Config):
    """The client's agent configuration."""

    user: Ident
    key_dir: Path
    host: dict[str, Any]
    targets: Annotated[dict[Ident, Party], Field(min_length=1, max_length=64)]
    vici_socket: Annotated[str, Field(pattern=r"^/[A-Za-z0-9_./-]{1,106}$")]
    state_dir: Path
    ike_address: str | None = None
    base_dir: Path = Path()  # where relative public_key_file paths start (the config file's directory)

    @field_validator("host")
    @classmethod
    def _host(cls, value: dict[str, Any]) -> dict[str, Any]:
        _HostRef.model_validate(value)
        return value

    @property
    def host_ref(self) -> _HostRef:
        return _HostRef.model_validate(self.host)


class _HostRef(_Config):
    id: Ident
    url: Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9.:\[\]_-]+(/[A-Za-z0-9._/-]*)?$")]
    public_key_file: Path | None = None
    sign_public_key: str | None = None
    kem_public_key: str | None = None
    mlkem_public_key: str | None = None

    def keys(self, base: Path, crypto: AgentCrypto) -> PeerKeys:
        return Party(public_key_file=self.public_key_file, sign_public_key=self.sign_public_key,
                     kem_public_key=self.kem_public_key, mlkem_public_key=self.mlkem_public_key).keys(base, crypto)


def _load(path: Path) -> tuple[dict[str, Any], Path]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidInput(f"cannot read agent config {path}: {(exc.strerror or type(exc).__name__).lower()}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"agent config {path} is not UTF-8 text") from exc
    except yaml.YAMLError as exc:  # its own text runs over several lines: where it failed, in one
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise InvalidInput(f"agent config {path} is not YAML{where}") from exc
    if not isinstance(raw, dict):
        raise InvalidInput(f"agent config {path} must be a mapping")
    return raw, path.parent


def _errors(path: Path, exc: ValidationError) -> InvalidInput:
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
    return InvalidInput(f"agent config {path}: " + "; ".join(parts))


def load_server_config(path: Path) -> AgentConfig:
    """Read and check a server's agent config (relative paths are relative to the file).

    Raises:
        InvalidInput: unreadable, malformed, or inconsistent.
    """
    raw, base = _load(path)
    try:
        config = AgentConfig.model_validate(raw)
    except ValidationError as exc:
        raise _errors(path, exc) from exc
    key_dir = config.key_dir.expanduser()
    return config.model_copy(update={"key_dir": key_dir if key_dir.is_absolute() else base / key_dir,
                                     "base_dir": base})


def load_client_config(path: Path) -> ClientConfig:
    """Read and check a client's agent config.

    Raises:
        InvalidInput: unreadable or malformed.
    """
    raw, base = _load(path)
    try:
        config = ClientConfig.model_validate(raw)
    except ValidationError as exc:
        raise _errors(path, exc) from exc
    updates: dict[str, Any] = {"base_dir": base}
    for key in ("key_dir", "state_dir"):
        value = getattr(config, key)
        value = value.expanduser()
        updates[key] = value if value.is_absolute() else base / value
    return config.model_copy(update=updates)
