"""The report page as a browser shows it, for the tests of both suites: headless Chromium
(Debian's, scripts/install-deps) driven by Playwright; and whether a PNG has anything drawn."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from PIL import Image, ImageStat

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def open_page(page_path: Path) -> dict[str, Any]:
    """What the browser saw: console errors, each image's load, each section's title and tables."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is missing: scripts/install-deps installs it"
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_path.as_uri(), wait_until="load")
            images = page.eval_on_selector_all(
                "img", "all => all.map(i => ({src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth}))")
            sections = page.eval_on_selector_all("section", """all => all.map(s => ({
                title: s.querySelector('h2').textContent, images: s.querySelectorAll('img').length,
                tables: Array.from(s.querySelectorAll('table')).map(t => Array.from(t.rows).map(
                    r => Array.from(r.cells).map(c => c.textContent)))}))""")
        finally:
            browser.close()
    return {"errors": errors, "images": images, "sections": {section["title"]: section for section in sections}}


def not_blank(png: Path) -> bool:
    """A plot, not an empty canvas: many colours and some contrast."""
    image = Image.open(png).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 16)
    spread = ImageStat.Stat(image.convert("L")).stddev[0]
    return image.width > 100 and image.height > 50 and (colours is None or len(colours) > 20) and spread > 5


def every_image_loaded(seen: dict[str, Any], folder: Path) -> bool:
    return bool(seen["images"]) and all(image["complete"] and image["width"] > 0 and not_blank(folder / image["src"])
                                        for image in seen["images"])
