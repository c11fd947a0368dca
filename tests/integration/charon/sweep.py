"""Negotiate every catalogue algorithm usable in ESP (and every PRF / key exchange via IKE).

Used by ``test_catalogue_names.py``; also runnable on its own as a lab report::

    .venv/bin/python -m tests.integration.charon.sweep
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol
from app.domain.errors import GatewayError

# Importing from conftest keeps the helpers in one place.
from tests.integration.charon.conftest import Pair, clean_up, load_both, ping, sas

#: Algorithms whose ``encr-keysize`` charon reports (variable key length).
VARIABLE_KEY = ("AES_", "CAMELLIA_", "BLOWFISH_", "NULL_AES_GMAC")


@dataclass
class Outcome:
    keyword: str
    kind: str
    ike: str
    esp: str
    expected: str
    reported: str | None = None
    keysize: int | None = None
    expected_keysize: int | None = None
    traffic: bool = False
    error: str | None = None

    @property
    def negotiated(self) -> bool:
        return self.error is None and self.reported is not None


def cases() -> list[tuple[Algorithm, str, str]]:
    """(algorithm, IKE proposal, ESP proposal) for each algorithm to check."""
    out = []
    for alg in CATALOGUE.values():
        ike, esp = "aes128-sha256-modp2048", "aes128-sha256"
        if alg.kind is Kind.PRF:
            ike = f"aes128gcm16-{alg.keyword}-modp2048"
        elif alg.kind is Kind.KEY_EXCHANGE:
            ike = f"aes128-sha256-{alg.keyword}"
        elif Protocol.ESP not in alg.protocols:
            continue
        elif alg.kind is Kind.AEAD:
            esp = alg.keyword
        elif alg.kind is Kind.ENCRYPTION:
            esp = f"{alg.keyword}-sha256"
        elif alg.kind is Kind.INTEGRITY:
            esp = f"aes128-{alg.keyword}"
        out.append((alg, ike, esp))
    return out


def check(pair: Pair, alg: Algorithm, ike: str, esp: str, name: str) -> Outcome:
    outcome = Outcome(alg.keyword, alg.kind.value, ike, esp, alg.sa_name)
    if alg.kind in (Kind.ENCRYPTION, Kind.AEAD) and alg.sa_name.startswith(VARIABLE_KEY):
        outcome.expected_keysize = alg.key_size
    try:
        load_both(pair, name, ike, esp)
        pair.left.gateway.initiate(child=name, ike=name, timeout_ms=5000)
        left, right = sas(pair.left, name), sas(pair.right, name)
        if not left or not right or not left[0].children or not right[0].children:
            outcome.error = "no CHILD_SA on both ends"
            return outcome
        ike_sa, child = left[0], left[0].children[0]
        reported_by_kind = {
            Kind.ENCRYPTION: (child.encr_alg, child.encr_keysize),
            Kind.AEAD: (child.encr_alg, child.encr_keysize),
            Kind.INTEGRITY: (child.integ_alg, None),
            Kind.PRF: (ike_sa.prf_alg, None),
            Kind.KEY_EXCHANGE: (ike_sa.dh_group, None),
        }
        outcome.reported, outcome.keysize = reported_by_kind[alg.kind]
        other = right[0].children[0]
        if (other.encr_alg, other.integ_alg) != (child.encr_alg, child.integ_alg):
            outcome.error = f"ends disagree: {other.encr_alg}/{other.integ_alg} vs {child.encr_alg}/{child.integ_alg}"
        outcome.traffic = ping(pair, count=1).returncode == 0
    except GatewayError as exc:
        outcome.error = exc.message
    finally:
        clean_up(pair, name)
    return outcome


def sweep(pair: Pair) -> list[Outcome]:
    return [check(pair, alg, ike, esp, f"sw{i}") for i, (alg, ike, esp) in enumerate(cases())]


if __name__ == "__main__":
    from tests.integration.charon.conftest import Peer, temporary_lab

    with temporary_lab("qsw") as lab:
        left, right = lab.host("left"), lab.host("right")
        found = sweep(Pair(lab, Peer(left, left.gateway()), Peer(right, right.gateway())))
    print(json.dumps([asdict(o) for o in found], indent=1))
