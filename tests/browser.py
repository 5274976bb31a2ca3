"""TensorBoard's review page in a real browser: a run's logs served by TensorBoard on 127.0.0.1, the CUSTOM SCALARS page
opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium), and what each chart
drew read from the SVG TensorBoard renders: the points of each line inside the chart's plot area.

``python -m tests.browser LOGDIR PNG`` serves LOGDIR (e.g. ``runs``), prints each chart's points drawn and saves the
page as PNG (docs/reporting.md's screenshot). A machine without Chromium that cannot install it (not root, no apt-get)
or without Selenium (the ``dev`` extra) skips the browser test with the reason; ``FASHION_MNIST_REQUIRE_BROWSER=1``
(CI) turns that skip into a failure."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

from benchmarks.launch import free_port
from tests import apt

PACKAGES = ("chromium", "chromium-driver")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
REQUIRE_BROWSER = "FASHION_MNIST_REQUIRE_BROWSER"  # "1": a browser test that cannot start fails instead of skipping
# As root, on a machine whose outside network is closed: no sandbox, no GPU, and none of Chromium's own connections
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")

# Shared by the pages' scripts: ``deep`` finds elements inside shadow roots too; ``reading`` is what one drawn line
# shows: its points, those inside the plot area ``box``, their vertical spread and the box's height. Each point's place
# on the screen is the path's own matrix applied to its coordinates.
_HELPERS_JS = r"""
function deep(root, selector, found) {
  found = found || [];
  root.querySelectorAll(selector).forEach(element => found.push(element));
  root.querySelectorAll('*').forEach(element => { if (element.shadowRoot) deep(element.shadowRoot, selector, found); });
  return found;
}
function reading(path, box) {
  const matrix = path.getScreenCTM();
  const points = [...(path.getAttribute('d') || '').matchAll(/([-\d.e+]+),([-\d.e+]+)/g)]
    .map(m => new DOMPoint(+m[1], +m[2]).matrixTransform(matrix));
  const inside = points.filter(p => p.x >= box.left - 0.5 && p.x <= box.right + 0.5 &&
                                    p.y >= box.top - 0.5 && p.y <= box.bottom + 0.5);
  return {points: points.length, inside: inside.length,
          spread: inside.length ? Math.max(...inside.map(p => p.y)) - Math.min(...inside.map(p => p.y)) : 0,
          height: box.height};
}
"""
# Every chart card of the review page (and, with another selector, of the SCALARS page): its title and its lines
# (the line plot's box: TensorBoard draws the smoothed line there, the raw one beside it as a faint "ghost", and a
# margin chart's band as an area plot; only the line counts).
_CARDS_JS = _HELPERS_JS + r"""
return deep(document, CARDS).map(card => {
  const plots = deep(card.shadowRoot || card, 'div.component.line-plot')
    .filter(plot => !plot.classList.contains('ghost') && !plot.classList.contains('area-plot'));
  const lines = [];
  for (const plot of plots) {
    const box = plot.getBoundingClientRect();
    plot.querySelectorAll('path.line').forEach(path => lines.push(reading(path, box)));
  }
  return {title: card.TITLE, lines: lines};
});
"""
CHARTS_JS = _CARDS_JS.replace("CARDS", "'tf-custom-scalar-multi-line-chart-card, tf-custom-scalar-margin-chart-card'"
                              ).replace("TITLE", "title")
SCALAR_CARDS_JS = _CARDS_JS.replace("CARDS", "'tf-scalar-card'").replace("TITLE", "tag")
# The SCALARS page (Polymer, the same line plots): its tag groups folded by default, opened by their heading button
OPEN_GROUPS_JS = _HELPERS_JS + r"""
for (const pane of deep(document, 'tf-category-paginated-view')) {
  const button = deep(pane.shadowRoot || pane, 'button.heading')[0];
  if (!pane.opened && button && arguments[0].includes(pane.category && pane.category.name)) button.click();
}
"""
# The TIME SERIES page (Angular) drawn as SVG (?forceSVG=true: WebGL's canvas has no points to read; the axis is
# fitted by the same code): each card's smoothed line (the raw one beside it is at opacity 0.25) in its series box.
TIME_SERIES_JS = _HELPERS_JS + r"""
return [...document.querySelectorAll('scalar-card-component')].map(card => {
  const title = (card.querySelector('tb-truncated-path') || {}).textContent || '';
  const lines = [];
  for (const svg of card.querySelectorAll('.series-view svg')) {
    const box = svg.getBoundingClientRect();
    svg.querySelectorAll('path').forEach(path => { if (path.style.opacity === '1') lines.push(reading(path, box)); });
  }
  return {title: title.trim(), lines: lines};
});
"""


def _missing() -> List[str]:
    return [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]


def install_reason() -> Optional[str]:
    """Chromium and its driver installed when missing (tests/apt.py); None when the browser can run now, else why
    not (the skip reason)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "Selenium is not installed: pip install -e '.[dev]'"
    return apt.install_reason(PACKAGES, _missing)


@contextmanager
def tensorboard(logdir: Path, timeout_s: float = 60) -> Iterator[str]:
    """``tensorboard --logdir LOGDIR`` on 127.0.0.1 and a free port, as a user starts it, until its review page's
    layout has loaded; yields its URL and stops it (by its pid) whatever happens."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/data/plugin/custom_scalars/layout", timeout=5) as answer:
                    if b"category" in answer.read():
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"TensorBoard served no layout within {timeout_s:.0f} s (exit {server.poll()}): "
                                   f"{server.stderr.read().decode()[-2000:] if server.poll() is not None else ''}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stderr.close()


@contextmanager
def chromium(width: int = 1600, height: int = 2200):
    """Headless Chromium through the system's chromedriver, in a new empty profile; quit and removed at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def layout_titles(url: str) -> List[str]:
    """The titles of the charts the served layout names (every run's layout merged, as the page shows them)."""
    with urllib.request.urlopen(f"{url}/data/plugin/custom_scalars/layout", timeout=10) as answer:
        return [chart["title"] for category in json.load(answer)["category"] for chart in category["chart"]]


def drawn_charts(driver, url: str, timeout_s: float = 45) -> List[dict]:
    """Open the review page and wait until its every chart has drawn and stopped changing (TensorBoard loads each
    chart's data on its own); each card's title and lines (points, points inside the plot area, their vertical
    spread in pixels, the plot's height)."""
    charts = len(layout_titles(url))
    driver.get(f"{url}/#custom_scalars")
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        time.sleep(1.0)
        found = driver.execute_script(CHARTS_JS)
        if len(found) == charts and all(card["lines"] for card in found) and found == last:
            return found
        last = found
    return last or []


def named_tags(url: str) -> List[str]:
    """The served runs' tags that the served layout's charts name (a line's pattern, a margin chart's three tags)."""
    def strings(value) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, (list, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                yield from strings(item)

    with urllib.request.urlopen(f"{url}/data/plugin/custom_scalars/layout", timeout=10) as answer:
        patterns = [pattern for category in json.load(answer)["category"] for chart in category["chart"]
                    for key, value in chart.items() if key != "title" for pattern in strings(value)]
    with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10) as answer:
        tags = {tag for run in json.load(answer).values() for tag in run}
    return sorted(tag for tag in tags if any(re.fullmatch(pattern, tag) for pattern in patterns))


def _settled(driver, script: str, wanted: int, timeout_s: float, *args) -> List[dict]:
    """``script``'s cards once ``wanted`` of them have lines and two readings a second apart agree."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        time.sleep(1.0)
        found = driver.execute_script(script, *args)
        if len(found) >= wanted and all(card["lines"] for card in found) and found == last:
            return found
        last = found
    return last or []


def scalar_cards(driver, url: str, tags: List[str], timeout_s: float = 45) -> List[dict]:
    """The SCALARS page's cards of ``tags`` (their groups opened), as :func:`drawn_charts` reads a chart."""
    driver.get(f"{url}/#scalars")
    time.sleep(2.0)
    driver.execute_script(OPEN_GROUPS_JS, sorted({tag.split("/")[0] for tag in tags}))
    cards = _settled(driver, SCALAR_CARDS_JS, len(tags), timeout_s)
    return [card for card in cards if card["title"] in tags]


def time_series_cards(driver, url: str, tags: List[str], timeout_s: float = 45) -> List[dict]:
    """The TIME SERIES page's cards of ``tags``, a few at a time (the page draws only the cards in view)."""
    found = []
    for start in range(0, len(tags), 6):
        chunk = tags[start:start + 6]
        pattern = urllib.parse.quote("^(" + "|".join(chunk) + ")$")
        driver.get(f"{url}/?forceSVG=true&tagFilter={pattern}#timeseries")
        found += [card for card in _settled(driver, TIME_SERIES_JS, len(chunk), timeout_s) if card["title"] in chunk]
    return found


def main(argv=None) -> int:
    """Serve LOGDIR, print what each chart of its review page drew, save the page as PNG."""
    logdir, png = (Path(arg) for arg in (argv or sys.argv[1:]))
    reason = install_reason()
    if reason:
        raise SystemExit(reason)
    with tensorboard(logdir) as url, chromium(1400, 1800) as driver:
        for card in drawn_charts(driver, url):
            print(f"{card['title']}: " + "; ".join(f"{line['inside']} of {line['points']} points inside, spread "
                                                   f"{line['spread']:.0f} of {line['height']:.0f} px"
                                                   for line in card["lines"]))
        driver.save_screenshot(str(png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
