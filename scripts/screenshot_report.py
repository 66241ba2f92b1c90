"""Render the hostile-content run of tests/report/test_unsafe_content.py and screenshot its report.html.

    python scripts/screenshot_report.py [OUT.png]     # default: docs/unsafe-content.png

Needs Debian's `chromium` (apt-get install chromium). The run directory is built in a temporary
folder exactly as the test builds it (prompts and model outputs full of HTML/JS, Markdown
breakers, control characters, an RTL override and a 100,000-character line), scored by
`runner.finalize`, and loaded headless, offline, with a throwaway profile.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_unsafe_content import build_unsafe_run  # noqa: E402

from cascade_repro.run.runner import finalize  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "unsafe-content.png"
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(browser).exists():
        print("chromium not found: apt-get install chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = build_unsafe_run(Path(tmp))
        finalize(run_dir)
        cmd = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={Path(tmp) / 'profile'}", f"--screenshot={out.resolve()}",
            "--window-size=1200,1600", (run_dir / "report.html").as_uri(),
        ]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0 or not out.exists():
        print(res.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
