"""Fakes that speak the real protocols (VICI) for tests of the adapters and the API."""

from tests.fakes.fake_charon import FakeCharon, Reply, child_sa_message, ike_sa_message

__all__ = ["FakeCharon", "Reply", "child_sa_message", "ike_sa_message"]
