"""The MODP primes are the published ones: re-derived from pi, and checked as groups."""

from __future__ import annotations

import pytest

from app.domain.algorithms import CATALOGUE
from app.measure.domain.modp_groups import MODP_GROUPS

#: RFC 2409 §6 and RFC 3526: the k in p = 2^N - 2^(N-64) - 1 + 2^64 * (floor(2^(N-130) pi) + k).
RFC_K = {768: 149686, 1024: 129093, 1536: 741804, 2048: 124476, 3072: 1690314, 4096: 240904,
         6144: 929484, 8192: 4743158}


def _pi_times_2_to(bits: int) -> int:
    """floor(pi * 2^bits), Machin's formula in integers with guard bits."""
    guard = 64
    one = 1 << (bits + guard)

    def arctan_inv(x: int) -> int:
        total = term = one // x
        n, sign = 1, -1
        while term:
            term //= x * x
            total += sign * (term // (2 * n + 1))
            sign, n = -sign, n + 1
        return total

    return (4 * (4 * arctan_inv(5) - arctan_inv(239))) >> guard


def _probably_prime(n: int, bases: tuple[int, ...] = (2, 3, 5)) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


@pytest.mark.parametrize("bits", sorted(RFC_K))
def test_oakley_and_rfc3526_primes_follow_from_pi(bits: int) -> None:
    group = MODP_GROUPS[f"modp{bits}"]
    expected = 2**bits - 2 ** (bits - 64) - 1 + 2**64 * (_pi_times_2_to(bits - 130) + RFC_K[bits])
    assert group.p == expected
    assert (group.g, group.q, group.bits) == (2, None, bits)


@pytest.mark.parametrize("keyword", ["modp768", "modp1024", "modp1536", "modp2048"])
def test_small_safe_primes_are_safe(keyword: str) -> None:
    p = MODP_GROUPS[keyword].p
    assert _probably_prime(p)
    assert _probably_prime((p - 1) // 2)


@pytest.mark.parametrize(("keyword", "bits", "qbits"),
                         [("modp1024s160", 1024, 160), ("modp2048s224", 2048, 224), ("modp2048s256", 2048, 256)])
def test_rfc5114_groups_have_their_prime_order_subgroup(keyword: str, bits: int, qbits: int) -> None:
    group = MODP_GROUPS[keyword]
    assert group.q is not None
    assert (group.bits, group.q.bit_length()) == (bits, qbits)
    assert (group.p - 1) % group.q == 0
    assert _probably_prime(group.p)
    assert _probably_prime(group.q)
    assert 1 < group.g < group.p
    assert pow(group.g, group.q, group.p) == 1


def test_every_catalogue_modp_group_is_here() -> None:
    assert {k for k in CATALOGUE if k.startswith("modp")} == set(MODP_GROUPS)
