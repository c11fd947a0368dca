"""One record per device platform: what it names (its table, its writer, its profile's media type and
files, what the page offers) is what the platform's profile, Host and the device page actually use."""

from __future__ import annotations

import dataclasses

import pytest

from app.adapters.agent.profiles import write_profile
from app.domain.agent.platforms import PLATFORMS, DevicePlatform
from app.services.agent.host import HANDOFF_TYPES
from app.services.agent.target_edits import platform_policy
from tests import REPO_ROOT
from tests.unit.agent.test_device_profiles import Credentials, creds, make_input

__all__ = ["creds"]  # the module-scoped fixture, shared with the profile tests


def test_every_platform_has_one_record_under_its_own_name() -> None:
    assert list(PLATFORMS) == ["android", "apple", "windows", "networkmanager", "swanctl"]
    assert all(isinstance(p, DevicePlatform) and p.name == name for name, p in PLATFORMS.items())
    assert len({p.writer for p in PLATFORMS.values()}) == len(PLATFORMS)


def test_a_record_cannot_be_changed() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLATFORMS["android"].media_type = "text/plain"  # type: ignore[misc]
    with pytest.raises(TypeError):
        PLATFORMS["android"] = PLATFORMS["apple"]  # type: ignore[index]


@pytest.mark.parametrize("name", list(PLATFORMS))
def test_the_profile_is_named_and_typed_as_its_record_says(creds: Credentials, name: str) -> None:
    record = PLATFORMS[name]
    profile = write_profile(make_input(creds, name))
    assert profile.filename == f"qoss-target-1{record.suffix}"
    assert profile.media_type == record.media_type
    assert bool(profile.files) == bool(record.beside) == (not record.linkable)
    if record.ca_suffix:
        assert f"qoss-target-1-ca.{record.ca_suffix}" in (*profile.files, *_embedded_names(profile.content))


def _embedded_names(content: bytes) -> tuple[str, ...]:
    """The CA's file name where a profile embeds it by name (Apple's PayloadCertificateFileName)."""
    return ("qoss-target-1-ca.cer",) if b"<string>qoss-target-1-ca.cer</string>" in content else ()


@pytest.mark.parametrize("name", list(PLATFORMS))
def test_the_capability_table_is_a_shipped_policy(name: str) -> None:
    record = PLATFORMS[name]
    assert platform_policy(name) == record.policy
    assert (REPO_ROOT / "policies" / f"{record.policy}.yaml").is_file()


def test_a_one_time_link_carries_exactly_the_profiles_that_hold_everything() -> None:
    linkable = {p.media_type: p.suffix for p in PLATFORMS.values() if not p.beside}
    assert linkable == HANDOFF_TYPES
    assert linkable == {"application/vnd.strongswan.profile": ".sswan",
                        "application/x-apple-aspen-config": ".mobileconfig"}
