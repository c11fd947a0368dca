"""Typed views of what charon answers over VICI, decoded once from vici's bytes dicts.

Nothing above this module ever sees a ``bytes`` value or an ``OrderedDict`` from the
``vici`` package: every reply is turned into the frozen dataclasses below here.
Field names follow the VICI keys (``encr-alg`` -> ``encr_alg``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Algorithms",
    "ChildSa",
    "Decoded",
    "IkeSa",
    "Lease",
    "Pool",
    "Stats",
    "VersionInfo",
    "backend_from_plugins",
    "decode",
    "parse_algorithms",
    "parse_child_sa",
    "parse_ike_sa",
    "parse_pools",
    "parse_stats",
    "parse_version",
]

#: Plugins that install IPsec SAs into a data plane, most specific first.
_BACKENDS = ("kernel-libipsec", "kernel-netlink", "kernel-pfkey", "kernel-wfp", "kernel-iph")


class Decoded(dict[str, Any]):
    """A message decoded already (:mod:`app.adapters.vici.wire`): :func:`decode` gives it back as it is."""

    __slots__ = ()


def decode(value: Any) -> Any:
    """A vici value with every ``bytes`` turned into ``str`` (UTF-8, undecodable bytes replaced).

    Mappings become plain ``dict``s and lists stay lists, recursively; a :class:`Decoded`
    message is already that.
    """
    if type(value) is Decoded:
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {str(decode(k)): decode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [decode(v) for v in value]
    return value


def _str(msg: Mapping[str, Any], key: str) -> str | None:
    value = msg.get(key)
    if type(value) is str:  # nearly always: the ABC checks below cost more than the rest of a parse
        return value
    if value is None or isinstance(value, Mapping | list):
        return None
    return str(value)


def _req_str(msg: Mapping[str, Any], key: str) -> str:
    return _str(msg, key) or ""


def _int(msg: Mapping[str, Any], key: str) -> int | None:
    value = _str(msg, key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _strs(msg: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = msg.get(key)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


def _section(msg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = msg.get(key)
    return value if type(value) is dict or isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionInfo:
    """VICI ``version``: the daemon and the system it runs on."""

    daemon: str
    version: str
    sysname: str
    release: str
    machine: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """VICI ``stats``: load figures, loaded plugins, and the IPsec back end derived from them.

    Attributes:
        backend: ``"kernel-libipsec"``, ``"kernel-netlink"`` (or another ``kernel-*``
            IPsec plugin) if loaded, else None. kernel-libipsec wins when both are loaded:
            it installs the SAs, kernel-netlink then only serves the network side.
    """

    uptime_running: str
    uptime_since: str
    workers_total: int
    workers_idle: int
    ike_sas_total: int
    ike_sas_half_open: int
    plugins: tuple[str, ...]
    backend: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithms:
    """VICI ``get-algorithms``: algorithm name -> providing plugin, by type.

    The key-exchange section is ``dh`` in strongSwan 5.9 and ``ke`` in 6.0; both end up
    in :attr:`ke`. Other sections (``hasher``, ``rng``, ``nonce-gen``, ...) are in
    :attr:`other`.
    """

    encryption: dict[str, str] = field(default_factory=dict)
    aead: dict[str, str] = field(default_factory=dict)
    integrity: dict[str, str] = field(default_factory=dict)
    prf: dict[str, str] = field(default_factory=dict)
    ke: dict[str, str] = field(default_factory=dict)
    other: dict[str, dict[str, str]] = field(default_factory=dict)

    def as_sections(self) -> dict[str, dict[str, str]]:
        """All sections as plain dicts, key exchange under ``ke`` (for ``keywords_from_charon``)."""
        return {
            "encryption": dict(self.encryption),
            "aead": dict(self.aead),
            "integrity": dict(self.integrity),
            "prf": dict(self.prf),
            "ke": dict(self.ke),
            **{k: dict(v) for k, v in self.other.items()},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sa:
    """What ``list-sas`` reports alike of an IKE_SA and a CHILD_SA: its name, id, state and
    algorithms (:func:`_sa_fields`)."""

    name: str
    uniqueid: int
    state: str
    encr_alg: str | None
    encr_keysize: int | None
    integ_alg: str | None
    dh_group: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSa(_Sa):
    """One CHILD_SA as ``list-sas`` reports it (byte and packet counters as ints)."""

    protocol: str
    mode: str
    bytes_in: int
    bytes_out: int
    packets_in: int
    packets_out: int
    local_ts: tuple[str, ...]
    remote_ts: tuple[str, ...]
    reqid: int | None = None
    spi_in: str | None = None
    spi_out: str | None = None
    #: Seconds until charon rekeys it (None: not reported).
    rekey_time: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IkeSa(_Sa):
    """One IKE_SA as ``list-sas`` reports it, with its CHILD_SAs."""

    local_host: str
    remote_host: str
    prf_alg: str | None
    children: tuple[ChildSa, ...]
    version: int | None = None
    local_id: str | None = None
    remote_id: str | None = None
    initiator: bool = False
    local_vips: tuple[str, ...] = ()
    remote_vips: tuple[str, ...] = ()
    #: whether a post-quantum preshared key was mixed into its keys (RFC 8784; ``ppk`` yes,
    #: strongSwan 5.7 and later; ``swanctl --list-sas`` prints ``/PPK``)
    ppk: bool = False
    #: its first additional key exchange (RFC 9370; ``ake1``, strongSwan 6.0), e.g. ``ML_KEM_768``
    additional_ke: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """One address lease of a pool."""

    address: str
    identity: str
    status: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """VICI ``get-pools``: one virtual IP pool and, if asked for, its leases."""

    name: str
    base: str
    size: int
    online: int
    offline: int
    leases: tuple[Lease, ...] = ()


def parse_version(msg: Mapping[str, Any]) -> VersionInfo:
    """A decoded ``version`` reply."""
    return VersionInfo(
        daemon=_req_str(msg, "daemon"),
        version=_req_str(msg, "version"),
        sysname=_req_str(msg, "sysname"),
        release=_req_str(msg, "release"),
        machine=_req_str(msg, "machine"),
    )


def backend_from_plugins(plugins: Iterable[str]) -> str | None:
    """The IPsec back end a charon with these plugins uses, or None."""
    loaded = set(plugins)
    return next((b for b in _BACKENDS if b in loaded), None)


def parse_stats(msg: Mapping[str, Any]) -> Stats:
    """A decoded ``stats`` reply."""
    uptime = _section(msg, "uptime")
    workers = _section(msg, "workers")
    ikesas = _section(msg, "ikesas")
    plugins = _strs(msg, "plugins")
    return Stats(
        uptime_running=_req_str(uptime, "running"),
        uptime_since=_req_str(uptime, "since"),
        workers_total=_int(workers, "total") or 0,
        workers_idle=_int(workers, "idle") or 0,
        ike_sas_total=_int(ikesas, "total") or 0,
        ike_sas_half_open=_int(ikesas, "half-open") or 0,
        plugins=plugins,
        backend=backend_from_plugins(plugins),
    )


def parse_algorithms(msg: Mapping[str, Any]) -> Algorithms:
    """A decoded ``get-algorithms`` reply; ``dh`` (5.9) and ``ke`` (6.0) both go to ``ke``."""
    sections = {
        str(name): {str(k): str(v) for k, v in body.items()}
        for name, body in msg.items()
        if isinstance(body, Mapping)
    }
    ke = {**sections.pop("dh", {}), **sections.pop("ke", {})}
    return Algorithms(
        encryption=sections.pop("encryption", {}),
        aead=sections.pop("aead", {}),
        integrity=sections.pop("integrity", {}),
        prf=sections.pop("prf", {}),
        ke=ke,
        other=sections,
    )


def _sa_fields(msg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The fields of :class:`_Sa` from a decoded IKE_SA or CHILD_SA section named ``name``."""
    return {
        "name": name,
        "uniqueid": _int(msg, "uniqueid") or 0,
        "state": _req_str(msg, "state"),
        "encr_alg": _str(msg, "encr-alg"),
        "encr_keysize": _int(msg, "encr-keysize"),
        "integ_alg": _str(msg, "integ-alg"),
        "dh_group": _str(msg, "dh-group"),
    }


def parse_child_sa(msg: Mapping[str, Any], key: str = "") -> ChildSa:
    """One decoded CHILD_SA section (``key`` is its section name, used if ``name`` is absent)."""
    return ChildSa(
        **_sa_fields(msg, _str(msg, "name") or key),
        protocol=_req_str(msg, "protocol"),
        mode=_req_str(msg, "mode"),
        bytes_in=_int(msg, "bytes-in") or 0,
        bytes_out=_int(msg, "bytes-out") or 0,
        packets_in=_int(msg, "packets-in") or 0,
        packets_out=_int(msg, "packets-out") or 0,
        local_ts=_strs(msg, "local-ts"),
        remote_ts=_strs(msg, "remote-ts"),
        reqid=_int(msg, "reqid"),
        spi_in=_str(msg, "spi-in"),
        spi_out=_str(msg, "spi-out"),
        rekey_time=_int(msg, "rekey-time"),
    )


def parse_ike_sa(name: str, msg: Mapping[str, Any]) -> IkeSa:
    """One decoded IKE_SA section named ``name``, with its ``child-sas``."""
    children = tuple(
        parse_child_sa(body, key)
        for key, body in _section(msg, "child-sas").items()
        if isinstance(body, Mapping)
    )
    return IkeSa(
        **_sa_fields(msg, name),
        local_host=_req_str(msg, "local-host"),
        remote_host=_req_str(msg, "remote-host"),
        prf_alg=_str(msg, "prf-alg"),
        children=children,
        version=_int(msg, "version"),
        local_id=_str(msg, "local-id"),
        remote_id=_str(msg, "remote-id"),
        initiator=_str(msg, "initiator") == "yes",
        local_vips=_strs(msg, "local-vips"),
        remote_vips=_strs(msg, "remote-vips"),
        ppk=_str(msg, "ppk") == "yes",
        additional_ke=_str(msg, "ake1"),
    )


def parse_pools(msg: Mapping[str, Any]) -> list[Pool]:
    """A decoded ``get-pools`` reply."""
    pools = []
    for name, body in msg.items():
        if not isinstance(body, Mapping):
            continue
        leases = tuple(
            Lease(
                address=_req_str(lease, "address"),
                identity=_req_str(lease, "identity"),
                status=_req_str(lease, "status"),
            )
            for lease in _section(body, "leases").values()
            if isinstance(lease, Mapping)
        )
        pools.append(
            Pool(
                name=str(name),
                base=_req_str(body, "base"),
                size=_int(body, "size") or 0,
                online=_int(body, "online") or 0,
                offline=_int(body, "offline") or 0,
                leases=leases,
            )
        )
    return pools
