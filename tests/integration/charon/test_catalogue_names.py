"""The catalogue's ``sa_name`` of every algorithm is what a real charon reports in ``list-sas``.

Algorithms charon 5.9.8 with kernel-libipsec cannot negotiate here are listed, not failed.
"""

from __future__ import annotations

import pytest

from app.domain.negotiation import LIBIPSEC_NO_ESP
from tests.integration.charon.conftest import Pair
from tests.integration.charon.sweep import sweep

pytestmark = pytest.mark.charon


def test_every_negotiable_algorithm_reports_its_catalogue_name(pair: Pair) -> None:
    outcomes = sweep(pair)
    negotiated = [o for o in outcomes if o.negotiated]
    unusable = [o for o in outcomes if not o.negotiated]
    print("\nnot negotiable with kernel-libipsec here:")
    for o in unusable:
        print(f"  {o.keyword} ({o.esp if o.kind not in ('prf', 'key_exchange') else o.ike}): {o.error}")
    assert len(negotiated) > len(outcomes) // 2
    # The engine keeps these out of ESP suites on kernel-libipsec: the list must stay true.
    assert {o.keyword for o in unusable if o.kind not in ("prf", "key_exchange")} == LIBIPSEC_NO_ESP
    wrong = [(o.keyword, o.expected, o.reported) for o in negotiated if o.reported != o.expected]
    assert wrong == []
    sizes = [(o.keyword, o.expected_keysize, o.keysize) for o in negotiated
             if o.expected_keysize is not None and o.keysize != o.expected_keysize]
    assert sizes == []
    silent = [o.keyword for o in negotiated if not o.traffic]
    assert silent == []
