"""Which protection the objectives ask for and the back end can give: the IPsec option, the
protocol it maps onto, and the mode, with the documented fallbacks (refused where a peer's
policy is strict, noted otherwise)."""

from __future__ import annotations

from app.domain.errors import UnsupportedProtection
from app.domain.negotiation.context import Context
from app.domain.negotiation.request import Backend
from app.domain.policies import IpsecOption, Levels, Mode

__all__ = ["choose_mode", "choose_option", "effective_protocol"]


def choose_option(ctx: Context) -> IpsecOption:
    """The IPsec option the objectives and minimums ask for (Liu et al. Table 2-2); ESP by default."""
    peers = ctx.req.peers
    if ctx.need_ah and ctx.need_esp:
        return IpsecOption.AH_ESP
    if ctx.need_ah:
        return IpsecOption.AH
    if ctx.need_esp:
        return IpsecOption.ESP
    if all(p.policy.wants_native for p in peers) and all(
        ctx.mins[p.name] == Levels() for p in peers
    ):
        return IpsecOption.NATIVE
    ctx.notes.append("no objective names a protocol: ESP (the default)")
    return IpsecOption.ESP


def _fall_back(ctx: Context, refusal: str, note: str) -> None:
    """A fallback the back end forces: refused where a peer's policy is strict, noted otherwise.

    Raises:
        UnsupportedProtection: ``refusal``, naming the strict peers.
    """
    strict = [p.name for p in ctx.req.peers if p.policy.strict]
    if strict:
        raise UnsupportedProtection(f"{refusal} and the policy of {', '.join(strict)} is strict")
    ctx.notes.append(note)


def effective_protocol(ctx: Context, option: IpsecOption, backend: Backend) -> str:
    """Map the IPsec option onto what the back end can do, with the documented fallbacks."""
    if option is IpsecOption.AH:
        if backend.ah:
            return "ah"
        _fall_back(ctx, f"the objectives ask for AH, which the {backend.name} back end cannot do,",
                   f"AH unavailable on the {backend.name} back end: ESP with NULL encryption instead")
        return "esp-null"
    if option is IpsecOption.AH_ESP:
        if backend.ah and backend.ah_esp_bundle:
            return "ah+esp"
        _fall_back(ctx, f"the objectives ask for AH+ESP, which the {backend.name} back end cannot bundle,",
                   f"AH+ESP bundles unavailable on the {backend.name} back end: ESP with integrity instead")
        return "esp"
    return "esp"


def choose_mode(ctx: Context) -> str:
    """Transport mode where every peer asks for it and the back end has it, else tunnel mode."""
    wants_transport = all(p.policy.mode is Mode.TRANSPORT for p in ctx.req.peers)
    if not wants_transport:
        return Mode.TUNNEL.value
    if ctx.req.backend.transport:
        return Mode.TRANSPORT.value
    _fall_back(ctx, f"transport mode is unavailable on the {ctx.req.backend.name} back end",
               f"transport mode unavailable on the {ctx.req.backend.name} back end: tunnel mode instead")
    return Mode.TUNNEL.value
