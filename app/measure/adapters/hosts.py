"""What a measurement needs of a host: its network namespace, addresses and charon.

The lab's hosts (:class:`app.lab.hosts.LabHost`) are such hosts; the measurement code asks
only for this, so it does not depend on how the lab is built.
"""

from __future__ import annotations

from typing import Protocol

from app.adapters.vici.gateway import ViciGateway

__all__ = ["Host"]


class Host(Protocol):
    """A network namespace with a charon in it."""

    @property
    def netns(self) -> str:
        """The namespace's name (``ip netns``)."""

    @property
    def ike_address(self) -> str:
        """The address its charon speaks IKE on."""

    @property
    def inside_address(self) -> str:
        """The address behind it that a tunnel protects."""

    def gateway(self, timeout: float = 10.0) -> ViciGateway:
        """A VICI connection to the host's charon."""
