"""The view links in the header (nav.viewnav), in real headless Chromium: each one lands on its view, with the view's
top just under the sticky header (its scroll-margin-top), or, for a view too near the page's end to get there, with
the page scrolled to its end and the view on screen. The views off screen are laid out only when they come near
(app.css: content-visibility) and grow after a jump: before, "Runs" clicked on a fresh page left the window in the
Glossary table, 4,970 px above the Runs view, and five other links landed 54-220 px off. A link keeps the address's
hash (the lab's link), an address naming a view opens on it, and a reader who scrolls during the landing is left
where they scrolled to. The landing line and the sidebar's sticky top follow the header's height, whatever it
wraps to."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMIUM, Page, browser, page, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

LINKS = "[...document.querySelectorAll('nav.viewnav a')].map((a) => a.getAttribute('href'))"
# where the view's top is, where the page could put it, and whether the page is at its end
WHERE = """(id) => { const view = document.getElementById(id), root = document.documentElement;
  return { top: view.getBoundingClientRect().top, margin: parseFloat(getComputedStyle(view).scrollMarginTop),
           header: document.querySelector('.topbar').getBoundingClientRect().bottom,
           bottom: view.getBoundingClientRect().bottom, height: innerHeight,
           atEnd: Math.abs(scrollY + innerHeight - root.scrollHeight) < 2, scrollY }; }"""


def settled(page: Page, view_id: str) -> dict[str, Any]:
    """The view's place once it has not moved for a second (the views above it laid out, their charts drawn)."""
    deadline = time.monotonic() + 30
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        where = dict(page.page.evaluate(WHERE, view_id))
        if last is None or abs(where["top"] - last["top"]) > 0.5 or where["scrollY"] != last["scrollY"]:
            last, since = where, time.monotonic()
        elif time.monotonic() - since > 1.0:
            return where
        time.sleep(0.05)
    raise TimeoutError(f"#{view_id} still moving after 30 s: {last}")


def landed(where: dict[str, Any]) -> bool:
    """On its line, or at the page's end and on screen; below the sticky header either way (its heading shown)."""
    on_its_line = abs(where["top"] - where["margin"]) < 2
    at_the_end = where["atEnd"] and where["margin"] - 2 < where["top"] < where["height"]
    return (on_its_line or at_the_end) and where["top"] >= where["header"]


def test_each_view_link_on_a_fresh_page_lands_on_its_view(page: Page) -> None:
    page.open()
    links = page.page.evaluate(LINKS)
    assert len(links) >= 12 and "#runs" in links and "#view-glossary" in links
    missed, hashes = {}, set()
    for href in links:
        page.open()
        page.page.click(f'nav.viewnav a[href="{href}"]')
        where = settled(page, href[1:])
        if not landed(where):
            missed[href] = where
        hashes.add(page.page.evaluate("location.hash"))
    assert missed == {}, missed
    assert hashes == {""}, "a view's link leaves the address's hash alone"
    page.check_clean()


def test_links_one_after_another_each_land_and_the_lab_link_in_the_hash_stays(page: Page) -> None:
    page.open()
    page.page.evaluate("history.replaceState(null, '', location.pathname + location.search + '#lab=r1')")
    links = page.page.evaluate(LINKS)
    missed = {}
    for href in [*links, *reversed(links)]:
        page.page.click(f'nav.viewnav a[href="{href}"]')
        where = settled(page, href[1:])
        if not landed(where):
            missed[href] = where
    assert missed == {}, missed
    assert page.page.evaluate("location.hash") == "#lab=r1"
    # the lab looks its linked run up once the page is quiet: this server has no lab run r1 (a 404, said in the lab)
    page.errors = [e for e in page.errors if "404 (Not Found)" not in e]
    page.check_clean()


def test_an_address_naming_a_view_opens_on_it(page: Page) -> None:
    page.open("#view-glossary")
    assert landed(settled(page, "view-glossary"))
    page.check_clean()


def test_a_reader_who_scrolls_during_the_landing_stays_where_they_scrolled(page: Page) -> None:
    page.open()
    page.page.click('nav.viewnav a[href="#view-glossary"]')
    page.page.keyboard.press("Home")  # at once: the page is still growing under the Glossary
    where = settled(page, "view-glossary")
    # up near the top, the Glossary below the window: not brought back to it. (Not exactly at 0: Chromium animates
    # a key's scroll, and the views laid out meanwhile can end the animation a few hundred px short.)
    assert where["top"] > where["height"] and where["scrollY"] < 1000, where
    page.check_clean()


@pytest.mark.parametrize("width", [1000, 1400, 1900])
def test_the_header_wrapped_to_any_height_hides_no_views_heading_and_no_sidebar(page: Page, width: int) -> None:
    """The header wraps to two or three lines as the window narrows (taller than the 110 px the landing line and
    the sidebar's sticky top once assumed: at 1,400 px a view's heading and the sidebar's first lines were under it)."""
    page.page.set_viewport_size({"width": width, "height": 900})
    page.open()
    page.page.click('nav.viewnav a[href="#view-clipping"]')
    where = settled(page, "view-clipping")
    assert landed(where), where
    heading = page.page.evaluate("document.getElementById('clip-heading').getBoundingClientRect().top")
    sidebar = page.page.evaluate("document.querySelector('.sidebar').getBoundingClientRect().top")
    assert heading >= where["header"] and sidebar >= where["header"], (heading, sidebar, where)
    page.check_clean()
