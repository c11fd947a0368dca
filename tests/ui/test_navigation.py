"""The console's navigation bar is the list pages register their links in: each link leads to a
page of a registered area, and a page shows the link of its own section as current."""

from __future__ import annotations

from fastapi.routing import APIRoute

from app.ui.pages import navigation, routers
from app.ui.render import page
from app.ui.routing import NavLink


class _Everyone:
    """A signed-in console that may see every page."""

    csrf = "csrf"
    name = "admin"
    scopes = frozenset({"admin"})

    def may_any(self, scopes: tuple[str, ...]) -> bool:
        return True


def test_every_link_leads_to_a_get_route_of_a_registered_area() -> None:
    pages = {r.path for router in routers for r in router.routes if isinstance(r, APIRoute) and "GET" in r.methods}
    assert [link.href for link in navigation if link.href not in pages] == []
    assert len({link.key for link in navigation}) == len(navigation)


def test_the_bar_shows_the_links_in_order_and_marks_the_current_section() -> None:
    context = {"console": _Everyone(), "section": "tunnels", "title": "t", "message": "m"}
    html = bytes(page("error.html", context).body).decode()
    hrefs = [link.href for link in navigation]
    assert [html.index(f'href="{href}"') for href in hrefs] == sorted(html.index(f'href="{h}"') for h in hrefs)
    assert '<a href="/ui/tunnels" aria-current="page">Tunnels</a>' in html
    assert isinstance(navigation[0], NavLink)
