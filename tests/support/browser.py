"""Debian's headless Chromium for the tests and scripts that look at report.html as a browser lays
it out: offline, a throwaway profile, and no GPU.

``layout`` loads a copy of a page with a measuring script added (the report's own Content Security
Policy forbids every script, so the copy's policy allows inline ones) and reads back what the script
wrote into the DOM: the viewport and page widths, the summary table's box and, per pair row, the
right edges of its verdict and deciding-evidence cells; per plot, the texts its own edge cuts off
(``clipped``) and the pairs of its texts drawn over each other (``overlaps``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def chromium(*args: str, profile: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run Debian's chromium headless, offline and with a throwaway profile."""
    if CHROMIUM is None:
        raise RuntimeError("no chromium")
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
        "--hide-scrollbars", f"--user-data-dir={profile}", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


MEASURE = """<script>
(() => {
  const de = document.documentElement, box = e => e.getBoundingClientRect();
  const table = document.querySelector("div.summary table");
  const m = {viewport: de.clientWidth, page: de.scrollWidth, h1: box(document.querySelector("h1")).right};
  if (table) {
    const holder = table.parentElement;
    m.table = {right: box(table).right, overflow: holder.scrollWidth - holder.clientWidth};
    m.rows = [...table.tBodies[0].rows].map(tr => ({
      pair: tr.cells[0].textContent, verdict: tr.cells[1].textContent,
      verdict_right: box(tr.cells[1]).right, evidence_right: box(tr.cells[2]).right,
    }));
  }
  // Every plot's text: cut off by its own svg's edge, or drawn over another text of the same plot.
  m.clipped = []; m.overlaps = [];
  for (const plot of document.querySelectorAll("svg")) {
    const edge = box(plot), texts = [...plot.querySelectorAll("text")].map(t => [t.textContent, box(t)]);
    for (const [t, b] of texts) {
      if (b.left < edge.left - 0.5 || b.right > edge.right + 0.5 || b.top < edge.top - 0.5) m.clipped.push(t);
    }
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const [a, ab] = texts[i], [c, cb] = texts[j];
      const w = Math.min(ab.right, cb.right) - Math.max(ab.left, cb.left);
      const h = Math.min(ab.bottom, cb.bottom) - Math.max(ab.top, cb.top);
      if (w > 1 && h > 1) m.overlaps.push([a, c]);
    }
  }
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify(m);
  document.body.appendChild(out);
})();
</script>"""

_CSP = re.compile(r'<meta http-equiv="Content-Security-Policy" content="[^"]*">')
_OUT = re.compile(r'<pre id="layout">(.*?)</pre>', re.S)


def layout(page: str, width: int, workdir: Path, extra_css: str = "") -> dict:
    """The layout facts of ``page`` (report.html's text) in a ``width``-pixel-wide window."""
    measured = _CSP.sub(
        '<meta http-equiv="Content-Security-Policy" content="script-src \'unsafe-inline\'">', page
    )
    if extra_css:
        measured = measured.replace("</style>", f"{extra_css}\n</style>", 1)
    measured = measured.replace("</body>", MEASURE + "</body>", 1)
    path = workdir / f"layout-{width}.html"
    path.write_text(measured, encoding="utf-8")
    res = chromium(
        "--dump-dom", f"--window-size={width},1200", path.as_uri(), profile=workdir / f"profile-{width}"
    )
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    found = _OUT.search(res.stdout)
    if found is None:
        raise RuntimeError("the measuring script wrote nothing")
    return json.loads(html.unescape(found.group(1)))
