"""Headless Debian chromium for the dashboard tests: screenshots and the rendered DOM.

Every call gets a fresh profile folder and flags that keep the browser off the network
except for the page asked for (no sync, updates, QUIC, background fetches)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.netcut import stop_group

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def _run(chromium: str, url: str, extra: list[str], size: tuple[int, int], budget_ms: int,
         timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="graftpool-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
               f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}", *extra, url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise
        finally:
            stop_group(proc)  # any helper process left in the group
        if proc.returncode != 0:
            raise RuntimeError(f"chromium exited with {proc.returncode} on {url}")
        return out


def dump_dom(chromium: str, url: str, size=(1400, 1600), budget_ms: int = 15000, timeout: float = 120) -> str:
    """The page's DOM after its scripts ran (``--dump-dom``)."""
    return _run(chromium, url, ["--dump-dom"], size, budget_ms, timeout)


def screenshot(chromium: str, url: str, out: Path, size=(1400, 1000), budget_ms: int = 15000,
               timeout: float = 120) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    _run(chromium, url, [f"--screenshot={out}"], size, budget_ms, timeout)
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return out


def capture(chromium: str, url: str, out: Path, size=(1400, 1000), budget_ms: int = 15000,
            timeout: float = 120) -> str:
    """One browser run: a screenshot to ``out`` and the rendered DOM (returned)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    dom = _run(chromium, url, [f"--screenshot={out}", "--dump-dom"], size, budget_ms, timeout)
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return dom


def dark_blue_pixels(png: Path) -> int:
    """Pixels near the dark end of matplotlib's ``Blues`` map, rgb(8, 48, 107): the busiest
    cell of a flow heatmap has that colour; the MLflow UI and the report's text do not."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(png))[..., :3]
    if img.dtype != np.float32 and img.max() > 1:
        img = img / 255.0
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return int(((r < 0.12) & (g > 0.1) & (g < 0.3) & (b > 0.3) & (b < 0.55)).sum())
