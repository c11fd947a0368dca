"""Hypothesis properties of the negotiation engine .

Soundness (every minimum met, only supported and allowed algorithms), optimality against
a brute-force oracle, monotonicity (raising a minimum never lowers the level reached),
determinism (same input, same answer and byte-identical VICI payload), and well-formed
proposal strings.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.algorithms import CATALOGUE, Protocol
from app.domain.errors import NoFeasibleSuite
from app.domain.negotiation import NegotiationRequest, NegotiationResult, Peer, negotiate
from app.domain.policies import Levels, Policy
from app.domain.proposals import parse
from app.domain.ratings import Rating, RatingTable
from app.domain.tunnels import TunnelEnd, conn_payload

ENC = ["aes128", "aes256", "3des", "null", "camellia128"]
AEAD = ["aes128gcm16", "chacha20poly1305"]
INTEG = ["sha1", "sha256", "sha512", "md5"]
PRF = ["prfsha1", "prfsha256", "prfsha512", "prfmd5"]
KE = ["modp2048", "x25519", "ecp384"]
ALL = ENC + AEAD + INTEG + PRF + KE
DIMS = ("confidentiality", "integrity", "key_exchange")

level = st.integers(0, 10)
perf = st.floats(0.5, 10, allow_nan=False).map(lambda x: round(x, 2))


@st.composite
def tables(draw: st.DrawFn, name: str = "t") -> RatingTable:
    rows = []
    for kw in ALL:
        if kw not in ("null", "sha1", "prfsha1", "modp2048", "aes128") and not draw(st.booleans()):
            continue  # always keep a base so most draws are feasible
        kind = CATALOGUE[kw].kind.value
        levels: dict[str, Any] = {}
        if kind in ("encryption", "aead"):
            levels["confidentiality"] = 0 if kw == "null" else draw(level)
        if kind in ("integrity", "aead"):
            levels["integrity"] = draw(level)
        if kind in ("prf", "key_exchange"):
            levels["key_exchange"] = draw(level)
        rows.append(Rating(kw, performance=draw(perf), **levels))
    return RatingTable.of(name, rows)


mins = st.fixed_dictionaries({d: st.integers(0, 10) | st.just(0) for d in DIMS})


@st.composite
def peers(draw: st.DrawFn, table: RatingTable) -> list[Peer]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        supports = draw(st.none() | st.sets(st.sampled_from(ALL), min_size=4).map(frozenset))
        forbids = draw(st.sets(st.sampled_from(ALL), max_size=3).map(frozenset))
        policy = Policy(name=f"p{i}", min_levels=Levels(**draw(mins)))
        out.append(Peer(f"peer{i}", policy, table, supports=supports, forbids=forbids))
    return out


@st.composite
def requests(draw: st.DrawFn) -> NegotiationRequest:
    table = draw(tables())
    return NegotiationRequest(peers=draw(peers(table)), table=table, default_table=table)


def _ok(req: NegotiationRequest, kw: str, dims: tuple[str, ...]) -> bool:
    rating = req.table.get(kw)
    if rating is None or rating.performance <= 0:
        return False
    for p in req.peers:
        implied_prf = CATALOGUE[kw].kind.value == "prf" and any(CATALOGUE[s].prf == kw for s in p.supports or ())
        if p.supports is not None and kw not in p.supports and not implied_prf:
            return False
        if kw in p.forbids:
            return False
        for d in dims:
            need = p.policy.min_levels.get(d)
            got = rating.level(d)
            if need > 0 and (got is None or got < need):
                return False
    return True


def oracle_esp(req: NegotiationRequest) -> list[tuple[float, str | None, str | None]]:
    """Every feasible ESP suite with its cost, by brute force."""
    out = []
    for e in ENC:
        for i in INTEG:
            if _ok(req, e, ("confidentiality",)) and _ok(req, i, ("integrity",)):
                out.append((req.table.ratings[e].cost(None) + req.table.ratings[i].cost(None), e, i))
    for a in AEAD:
        if _ok(req, a, ("confidentiality", "integrity")):
            out.append((req.table.ratings[a].cost(None), a, None))
    return out


def oracle_ike_feasible(req: NegotiationRequest) -> bool:
    prfs = [p for p in PRF if _ok(req, p, ("key_exchange",))]
    groups = [g for g in KE if _ok(req, g, ("key_exchange",))]
    if not prfs or not groups:
        return False
    encs = [e for e in ENC if e != "null" and _ok(req, e, ("confidentiality",))]
    integs = [i for i in INTEG if CATALOGUE[i].prf in prfs and _ok(req, i, ("integrity",))]
    aeads = [a for a in AEAD if _ok(req, a, ("confidentiality", "integrity"))]
    return bool((encs and integs) or aeads)


def run(req: NegotiationRequest) -> NegotiationResult | None:
    try:
        return negotiate(req)
    except NoFeasibleSuite:
        return None


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(requests())
def test_answer_exists_iff_the_oracle_finds_a_feasible_suite(req: NegotiationRequest) -> None:
    result = run(req)
    feasible = bool(oracle_esp(req)) and oracle_ike_feasible(req)
    assert (result is not None) == feasible


@FAST
@given(requests())
def test_every_minimum_is_met_with_supported_allowed_algorithms(req: NegotiationRequest) -> None:
    result = run(req)
    if result is None:
        return
    used = [k for k in (result.suite.encryption, result.suite.integrity) if k]
    used += [k for k in (result.ike["encryption"], result.ike["integrity"], result.ike["prf"],
                         result.ike["key_exchange"]) if k]
    for p in req.peers:
        for kw in used:
            assert kw not in p.forbids
            if p.supports is not None and CATALOGUE[kw].kind.value != "prf":
                assert kw in p.supports
        for d in DIMS:
            assert result.levels.get(d) >= p.policy.min_levels.get(d)


@FAST
@given(requests())
def test_no_cheaper_feasible_suite_exists(req: NegotiationRequest) -> None:
    result = run(req)
    if result is None:
        return
    best = min(cost for cost, _, _ in oracle_esp(req))
    assert math.isclose(result.cost, round(best, 6), abs_tol=1e-6)


@FAST
@given(requests(), st.integers(0, 2), st.sampled_from(DIMS), st.integers(1, 10))
def test_raising_a_minimum_never_lowers_the_level(req: NegotiationRequest, who: int, dim: str, bump: int) -> None:
    before = run(req)
    if before is None:
        return
    peers_ = list(req.peers)
    target = peers_[who % len(peers_)]
    old = target.policy.min_levels
    raised = replace(old, **{dim: min(10, old.get(dim) + bump)})
    peers_[who % len(peers_)] = replace(target, policy=replace(target.policy, min_levels=raised))
    after = run(replace(req, peers=peers_))
    if after is not None:
        assert after.levels.get(dim) >= before.levels.get(dim)
        assert after.levels.get(dim) >= raised.get(dim)


@FAST
@given(requests())
def test_same_input_same_answer_and_identical_vici_payload(req: NegotiationRequest) -> None:
    first, second = run(req), run(req)
    if first is None:
        assert second is None
        return
    assert second is not None
    assert first.as_dict() == second.as_dict()
    ends = (TunnelEnd("10.99.0.1", "a.left", ("10.1.0.1/32",)), TunnelEnd("10.99.0.2", "a.right", ("10.2.0.1/32",)))

    def payload(r: NegotiationResult) -> dict[str, Any]:
        assert r.proposals["ike"] is not None
        return conn_payload(name="qoss-a", local=ends[0], remote=ends[1], ike_proposal=r.proposals["ike"],
                            esp_proposal=r.proposals["esp"], ah_proposal=r.proposals["ah"], mode=r.mode,
                            ike_lifetime=r.lifetimes["ike"], child_lifetime=r.lifetimes["child"])

    assert repr(payload(first)) == repr(payload(second))


@FAST
@given(requests())
def test_every_emitted_proposal_parses_for_its_protocol(req: NegotiationRequest) -> None:
    result = run(req)
    if result is None:
        return
    assert result.proposals["ike"] is not None
    parse(result.proposals["ike"], Protocol.IKE)
    if result.proposals["esp"] is not None:
        parse(result.proposals["esp"], Protocol.ESP)
    for alt in result.alternatives:
        parse(alt["proposals"]["esp"], Protocol.ESP)
