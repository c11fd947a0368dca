"""The negotiation engine: the cheapest suite that meets every peer's minimums (ESAF).

Semantics:

- Each peer states minimum levels, judged in *its own* rating table; the requirement
  is met when every peer's minimum is met. Objectives raise the minimums (an ESP
  objective implies confidentiality >= 1, an AH objective integrity >= 1) and pick the
  IPsec option (Liu et al. Table 2-2).
- Candidates are the algorithms every peer supports, every policy allows and no peer
  forbids, rated in the negotiating table (for a family that table does not rate at
  all, the default table is used and the answer says so).
- Cost is judged in the negotiating table only: a suite's cost is the sum of its
  transforms' costs (Niedermayer et al. Table 3), a transform's cost being its measured time per
  byte at the traffic's packet size where every candidate is measured, else
  ``1 / performance``.
- Ties go to the higher security levels, then to the catalogue order.
- The IKE proposal is negotiated too: encryption (or AEAD + PRF) meeting the same
  confidentiality and integrity minimums, a PRF and a key-exchange group meeting the
  key-exchange minimum. A tunnel's key-exchange level is ``min(group, prf)``.

``request`` and ``result`` are the shapes in and out, ``context`` what one negotiation knows
(candidate checks and the explanation of rejections), ``protection`` the IPsec option, protocol
and mode, ``data_plane`` the cost model and search for ESP/AH, ``ike`` the IKE proposal, and
``engine`` puts them together.
"""

from app.domain.negotiation.engine import negotiate
from app.domain.negotiation.request import LIBIPSEC_NO_ESP, Backend, NegotiationRequest, Peer
from app.domain.negotiation.result import NegotiationResult, Rejection, Suite, SuiteOption

__all__ = [
    "LIBIPSEC_NO_ESP",
    "Backend",
    "NegotiationRequest",
    "NegotiationResult",
    "Peer",
    "Rejection",
    "Suite",
    "SuiteOption",
    "negotiate",
]
