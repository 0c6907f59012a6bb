"""report.html as a person sees it: rendered by a real headless browser (Chromium).

A script injected into a copy of the page opens every <details>, then measures, after the page
has loaded: the page's horizontal overflow, the right edge of every table, whether every image
decoded, and where the ranking table and the verdict sit. The browser prints the resulting DOM
(``--dump-dom``), from which the measurements are read; a screenshot is taken too and must not
be blank. Skipped, with the reason, where no Chromium is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed (Debian: apt-get install chromium)")

_PROBE = """
<script>
window.addEventListener("load", () => {
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  const width = window.innerWidth;
  const tables = [...document.querySelectorAll("table")].map(t => {
    const r = t.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top + window.scrollY, width: r.width};
  });
  const images = [...document.querySelectorAll("img")].map(i => ({complete: i.complete, natural: i.naturalWidth}));
  const verdict = document.querySelector(".verdict").getBoundingClientRect();
  const result = {viewport: width, height: window.innerHeight, scrollWidth: document.documentElement.scrollWidth,
                  tables: tables, images: images, verdictTop: verdict.top + window.scrollY};
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>
"""


def _browser(*args, timeout=90):
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _measure(page, folder, width: int, height: int = 900) -> dict:
    probe = folder / f"probe-{width}.html"  # images are embedded: the copy renders the same
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    proc = _browser(f"--window-size={width},{height}", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the browser printed no measurements (exit {proc.returncode}): {proc.stderr[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.fixture
def report_page(compared_report):
    code, out, _ = compared_report
    assert code == 0
    return out / "report.html"


@needs_browser
@pytest.mark.parametrize("width", [1280, 720])
def test_report_fits_the_viewport_and_every_figure_loads(report_page, width, tmp_path):
    m = _measure(report_page, tmp_path, width)
    assert m["viewport"] == width
    assert m["scrollWidth"] <= width, f"the page scrolls sideways: {m['scrollWidth']} px content in a {width} px window"
    assert m["tables"], "the report has no tables"
    for i, table in enumerate(m["tables"]):
        assert table["left"] >= 0 and table["right"] <= width + 0.5, f"table {i} spans {table['left']}..{table['right']} px"
    assert m["images"] and all(img["complete"] and img["natural"] > 0 for img in m["images"]), m["images"]


@needs_browser
def test_verdict_and_ranking_table_are_on_the_first_screen(report_page, tmp_path):
    m = _measure(report_page, tmp_path, 1280, 900)
    first_table = min(m["tables"], key=lambda t: t["top"])
    assert m["verdictTop"] < m["height"], "the ELBO-vs-held-out verdict is below the first screen"
    assert first_table["top"] < m["height"], "the ranking table starts below the first screen"
    html = report_page.read_text(encoding="utf-8")
    ranking = html[html.index("<h2>Ranking</h2>"):html.index("<h2>Diagnostic: PSIS-LOO</h2>")]
    header = re.search(r"<thead>(.*?)</thead>", ranking, re.S).group(1)
    columns = re.findall(r"<th[^>]*>(.*?)</th>", header)
    assert len(columns) <= 9, columns  # model, ELBO, ΔELBO, held-out Δelpd, accuracy, NLL, ECE, fit time


@needs_browser
def test_screenshot_shows_the_page(report_page, tmp_path):
    from PIL import Image  # noqa: PLC0415 - matplotlib's dependency

    shot = tmp_path / "report.png"
    proc = _browser("--window-size=1280,900", f"--screenshot={shot}", report_page.as_uri())
    assert shot.is_file(), proc.stderr[-500:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (900, 1280)
    assert pixels.std() > 10, "the screenshot is blank"
    assert (pixels < 80).mean() > 0.005, "no dark text on the first screen"
