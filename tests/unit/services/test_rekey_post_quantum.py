"""Re-keying judges a running suite with its post-quantum mechanism: a PPK tunnel is not moved by every
edit, and one without a mechanism under a minimum that now asks for one is noncompliant."""

from __future__ import annotations

from collections.abc import Sequence

from app.adapters.files import load_rating_table
from app.domain.algorithms import CATALOGUE, Kind
from app.domain.negotiation import Backend, NegotiationRequest, NegotiationResult, Peer, negotiate
from app.domain.policies import Policy
from app.services.rekey import judge, suite_keywords
from app.settings import SHIPPED_RATINGS_DIR

STD = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
CHARON = frozenset(k for k, a in CATALOGUE.items() if a.kind is not Kind.POST_QUANTUM) | {"ppk"}


def negotiator(post_quantum: int):  # type: ignore[no-untyped-def]
    def run(pinned: Sequence[str] | None) -> NegotiationResult:
        peers = [Peer("gw", Policy(), STD, supports=CHARON),
                 Peer("request", Policy.from_dict({"min_levels": {"confidentiality": 8, "integrity": 8,
                                                                  "post_quantum": post_quantum}}), STD)]
        if pinned is not None:
            peers.append(Peer("current-suite", Policy(), STD, supports=frozenset(pinned)))
        return negotiate(NegotiationRequest(peers=peers, table=STD, default_table=STD,
                                            backend=Backend(name="kernel-libipsec", ah=False, transport=False)))
    return run


def test_a_running_ppk_suite_stays_while_its_minimum_holds() -> None:
    running = negotiator(5)(None)
    assert running.suite.post_quantum == "ppk"
    assert judge(running.proposals, negotiator(5), post_quantum="ppk").kind == "stays"


def test_a_suite_without_a_mechanism_is_noncompliant_once_the_minimum_asks_for_one() -> None:
    running = negotiator(0)(None)
    verdict = judge(running.proposals, negotiator(5))
    assert verdict.kind == "noncompliant"
    assert verdict.result is not None
    assert verdict.result.suite.post_quantum == "ppk"


def test_suite_keywords_read_an_additional_exchange_and_the_mechanism() -> None:
    proposals = {"esp": "aes128gcm16", "ah": None, "ike": "aes128gcm16-prfsha256-x25519-ke1_mlkem768"}
    assert "mlkem768" in suite_keywords(proposals)
    assert "ppk" in suite_keywords({"esp": "aes128gcm16", "ah": None, "ike": None}, "ppk")
