"""Look at a report the way a reader does: a headless-browser screenshot of ``report.html``.

    python -m snip.report.screenshot runs/NAME/report.html shot.png [--width 1280]
                                             # the whole page; --height H cuts it at H px

A PNG that matplotlib wrote is not yet a page that renders: CSS, the inlined images, table
widths and wrapping only show in a browser.  This runs Chromium (or Chrome) headless -- on
Debian ``apt-get install chromium`` -- and writes a full-width screenshot of the whole page
(rendered in a tall window, then cropped below the last row that is not page background);
open it and read it before calling a report change done.  Only this check needs a browser,
never the report itself; without one it says so in one line.  ``tests/report`` does the same
and skips when no browser is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from snip.errors import MissingFileError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The first headless-capable browser on ``PATH``, or ``None``."""
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


FULL_PAGE_LIMIT = 16000  # px: the window a full-page shot renders in (pages are shorter)


def screenshot(html: str | Path, png: str | Path, *, width: int = 1280,
               height: int | None = None, timeout: float = 120.0) -> Path:
    """Render ``html`` in headless Chromium and save a ``width`` px wide PNG: ``height`` px
    tall, or (``None``) the whole page."""
    if not Path(html).is_file():
        raise MissingFileError(f"{html} does not exist")
    browser = find_browser()
    if browser is None:
        raise MissingFileError("no Chromium/Chrome on PATH (Debian: apt-get install chromium)")
    png = Path(png).resolve()
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={width},{height or FULL_PAGE_LIMIT}", f"--screenshot={png}",
           Path(html).resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot to {png}")
    if height is None:
        crop_to_content(png)
    return png


def crop_to_content(png: Path, margin: int = 16) -> Path:
    """Cut the rows below the page's last non-background row (background: the bottom row's
    colour), keeping ``margin`` px."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        img = np.asarray(im.convert("RGB"))
        rows = np.flatnonzero((img != img[-1:, :1]).any(axis=(1, 2)))
        bottom = min(len(img), int(rows[-1]) + 1 + margin) if len(rows) else len(img)
        if bottom < len(img):
            im.crop((0, 0, img.shape[1], bottom)).save(png)
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("html")
    p.add_argument("png")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=None,
                   help="cut the page at this height (default: the whole page)")
    a = p.parse_args(argv)
    try:
        print(screenshot(a.html, a.png, width=a.width, height=a.height))
    except MissingFileError as e:
        print(f"screenshot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
