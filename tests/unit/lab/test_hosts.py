"""A lab host's addresses by family: which IKE address a gateway is registered with, which
inside networks it has. Pure: no namespace is made."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import typer

from app.cli.lab import _families
from app.lab.hosts import Lab, LabHost


def _host(families: tuple[int, ...], ipv6: bool = True) -> LabHost:
    return LabHost("left", "v6-left", "/nonexistent", "10.99.0.1", "10.1.0.1", "/nonexistent",
                   ike_address6="fd00:71::1" if ipv6 else None, inside_address6="fd01::1" if ipv6 else None,
                   families=families)


def test_an_ipv4_lab_host_is_as_before() -> None:
    host = LabHost("left", "qoss-left", "/nonexistent", "10.99.0.1", "10.1.0.1", "/nonexistent")
    assert host.families == (4,)
    assert host.gateway_ike_address == "10.99.0.1"
    assert host.inside_networks == ["10.1.0.1/32"]
    assert host.inside_network6 is None


def test_family_6_registers_the_ipv6_ike_address_and_inside_network() -> None:
    host = _host((6,))
    assert host.gateway_ike_address == "fd00:71::1"
    assert host.inside_networks == ["fd01::/64"]


@pytest.mark.parametrize(("families", "ike", "inside"), [
    ((4, 6), "10.99.0.1", ["10.1.0.1/32", "fd01::/64"]),
    ((6, 4), "fd00:71::1", ["fd01::/64", "10.1.0.1/32"]),
])
def test_both_families_ike_over_the_first_inside_networks_of_both(
        families: tuple[int, ...], ike: str, inside: list[str]) -> None:
    host = _host(families)
    assert host.ike_family == families[0]
    assert host.gateway_ike_address == ike
    assert host.inside_networks == inside


def test_a_host_read_back_from_lab_json_is_the_same() -> None:
    host = _host((6, 4))
    again = LabHost(**json.loads(json.dumps(asdict(host))))  # families come back as a list
    assert again.families == (6, 4)
    assert again == host


@pytest.mark.parametrize("families", [(), (5,), (4, 4), (6, 6, 4)])
def test_a_lab_refuses_other_families(tmp_path: Path, families: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="address families"):
        Lab(tmp_path, prefix="v6unit", families=families)


def test_a_lab_keeps_the_families_it_was_given(tmp_path: Path) -> None:
    assert Lab(tmp_path, prefix="v6unit", families=(6, 4)).families == (6, 4)
    assert Lab(tmp_path, prefix="v6unit").families == (4,)


@pytest.mark.parametrize(("text", "families"), [("4", (4,)), ("6", (6,)), ("4,6", (4, 6)), ("6,4", (6, 4))])
def test_family_option(text: str, families: tuple[int, ...]) -> None:
    assert _families(text) == families


@pytest.mark.parametrize("text", ["", "5", "4,4", "ipv6", "4;6"])
def test_family_option_refuses_anything_else(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        _families(text)
