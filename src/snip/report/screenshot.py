"""Look at a report the way a reader does: a headless-browser screenshot of ``report.html``.

    python -m snip.report.screenshot runs/NAME/report.html shot.png [--width 1250 --height 4200]

A PNG that matplotlib wrote is not yet a page that renders: CSS, the inlined images, table
widths and wrapping only show in a browser.  This runs Chromium (or Chrome) headless -- on
Debian ``apt-get install chromium`` -- and writes a full-width screenshot; open it and read it
before calling a report change done.  ``tests/report/test_browser.py`` does the same and skips
when no browser is installed.
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


def screenshot(html: str | Path, png: str | Path, *, width: int = 1250,
               height: int = 4200, timeout: float = 120.0) -> Path:
    """Render ``html`` in headless Chromium and save a ``width`` x ``height`` PNG."""
    browser = find_browser()
    if browser is None:
        raise MissingFileError("no Chromium/Chrome on PATH (Debian: apt-get install chromium)")
    png = Path(png).resolve()
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={width},{height}", f"--screenshot={png}",
           Path(html).resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot to {png}")
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("html")
    p.add_argument("png")
    p.add_argument("--width", type=int, default=1250)
    p.add_argument("--height", type=int, default=4200)
    a = p.parse_args(argv)
    print(screenshot(a.html, a.png, width=a.width, height=a.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
