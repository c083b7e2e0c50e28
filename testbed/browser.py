"""A headless Chromium for the web page's end-to-end test, found or installed with no
manual step, as ``make bins`` builds the Go binaries.

Debian's ``chromium`` package is the browser (``LOCKSTEP_CHROMIUM`` names another); it is
driven by Playwright from PyPI through ``executable_path``, so Playwright's own browser
download is never needed. When no Chromium is on the machine it is installed with
``apt-get`` (through ``sudo`` when not root); when that is impossible the error says what to
install, and the test fails rather than skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["BrowserMissing", "chromium_path", "ensure_chromium"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserMissing(RuntimeError):
    pass


def chromium_path() -> Path | None:
    """The Chromium to drive, or None when the machine has none."""
    given = os.environ.get("LOCKSTEP_CHROMIUM")
    if given:
        return Path(given) if Path(given).exists() else None
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def ensure_chromium() -> Path:
    """The Chromium path, installing Debian's package first when none is there."""
    found = chromium_path()
    if found is not None:
        return found
    apt = shutil.which("apt-get")
    sudo: list[str] = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo")
                                                     else [])
    if apt is None or (os.geteuid() != 0 and not sudo):
        raise BrowserMissing("no Chromium found and no apt-get (as root or through sudo) to "
                             "install it: install Chromium, or set LOCKSTEP_CHROMIUM to one")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([*sudo, apt, "update"], [*sudo, apt, "install", "-y", "--no-install-recommends",
                                          "chromium"]):
        r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                           timeout=900)
        if r.returncode != 0:
            raise BrowserMissing(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    found = chromium_path()
    if found is None:
        raise BrowserMissing("apt-get installed chromium but no chromium is on PATH")
    return found
