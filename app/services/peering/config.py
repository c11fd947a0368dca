"""What peering needs of the settings: this side's name, how long a peer may take to answer, the
rating table of last resort, and when the initiator confirms."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PeeringConfig"]


@dataclass(frozen=True)
class PeeringConfig:
    """What peering needs of the settings.

    Attributes:
        name: this service's name as its peers know it (``QOSS_PEER_NAME``).
        timeout: seconds one message may take to be answered (``QOSS_PEER_TIMEOUT``).
        default_table: the rating table of last resort.
        confirm_early: the initiator sends its confirm as it initiates (the responder answers it once
            its own end is up) rather than after its own end is verified (``QOSS_PEER_CONFIRM_EARLY``).
    """

    name: str
    timeout: float
    default_table: str
    confirm_early: bool = True
