"""Render a run directory's report.html with the installed cascade_repro and screenshot its first screen.

    python scripts/screenshot_evidence.py RUN_DIR OUT_PREFIX [WIDTH:HEIGHT ...]

writes OUT_PREFIX-WIDTH.png per size (default 800:1400 and 1400:1000: an issue's column and a
laptop). The run directory is only read; the page is rendered into a temporary folder. Needs Debian's
`chromium`. docs/screenshots/README.md says which runs and code the committed screenshots show.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from browser import CHROMIUM, chromium  # noqa: E402

from cascade_repro.report import load_run  # noqa: E402
from cascade_repro.report.html import HtmlFormatter  # noqa: E402

SIZES = ("800:1400", "1400:1000")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if CHROMIUM is None:
        print("chromium not found: apt-get install chromium", file=sys.stderr)
        return 2
    run_dir, prefix = Path(argv[0]), Path(argv[1])
    page = HtmlFormatter().render(load_run(run_dir))
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        html.write_text(page, encoding="utf-8")
        for size in argv[2:] or SIZES:
            width, height = (int(v) for v in size.split(":"))
            out = prefix.parent / f"{prefix.name}-{width}.png"
            res = chromium(f"--screenshot={out.resolve()}", f"--window-size={width},{height}", html.as_uri(),
                           profile=Path(tmp) / f"profile-{width}")  # fmt: skip
            if res.returncode != 0 or not out.exists():
                print(res.stderr[-2000:], file=sys.stderr)
                return 1
            print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
