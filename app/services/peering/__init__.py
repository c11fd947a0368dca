"""Tunnels negotiated with another qoss (a peer): see :mod:`app.services.peering.service`."""

from app.services.peering.config import PeeringConfig
from app.services.peering.messages import PeerLink
from app.services.peering.service import Peering

__all__ = ["PeerLink", "Peering", "PeeringConfig"]
