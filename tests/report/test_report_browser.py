"""report.html as a browser lays it out (issue 31): at an issue's width (800 px) and a laptop's
(1400 px) the summary never scrolls sideways and every pair's verdict and deciding evidence are on
screen. Real H200 runs from docs/evidence/ (the vLLM 0.10.2 regression, a clean FA3 run with its
calibration ladder) and the hand-made run of test_report.py, in Debian's headless Chromium; skipped
where it is not installed (CI installs it best-effort)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.browser import CHROMIUM, layout

from cascade_repro.plan.matrix import spec_of
from cascade_repro.report import load_run
from cascade_repro.report.html import HtmlFormatter
from cascade_repro.report.view import cascade_pairs

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless browser: apt-get install chromium (Debian) to run this check"
)

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"
RUNS = {
    "vllm0.10.2-band": EVIDENCE / "2026-12-01-h200-vllm0.10.2" / "band",
    "fa3-ko-cal": EVIDENCE / "2026-12-01-h200" / "fa3-ko-cal",
}
WIDTHS = (800, 1400)


@pytest.fixture(scope="module")
def pages() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    out = {}
    for name, run in RUNS.items():
        data = load_run(run)
        expected = [(str(r["pair_id"]), str(r["verdict"])) for r in cascade_pairs(data)]
        out[name] = (HtmlFormatter().render(data), expected)
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(RUNS))
def test_summary_fits_and_every_verdict_is_on_screen(pages, tmp_path: Path, name: str, width: int) -> None:
    page, expected = pages[name]
    m = layout(page, width, tmp_path)
    assert m["viewport"] == width
    assert m["page"] <= m["viewport"], m  # the page itself never scrolls sideways
    assert m["h1"] <= m["viewport"]
    assert m["table"]["overflow"] == 0 and m["table"]["right"] <= m["viewport"], m["table"]
    assert [(r["pair"], r["verdict"]) for r in m["rows"]] == expected
    for r in m["rows"]:
        assert r["verdict_right"] <= m["viewport"] and r["evidence_right"] <= m["viewport"], r


def test_the_measurement_sees_a_summary_that_overflows(pages, tmp_path: Path) -> None:
    """Positive control: a summary table forced wider than the window is reported as overflowing."""
    page, _ = pages["vllm0.10.2-band"]
    m = layout(page, 800, tmp_path, extra_css="div.summary table{min-width:3000px}")
    assert m["table"]["overflow"] > 0
    assert any(r["evidence_right"] > m["viewport"] for r in m["rows"])


def test_the_regression_run_plots_each_configuration(pages) -> None:
    """The 0.10.2 run's FA2 and FA3 pairs are separate series, the controls beside them, and the
    captions name what is drawn (no calibration rows in this run, so none are mentioned)."""
    page, _ = pages["vllm0.10.2-band"]
    for legend in ("cascade FA2", "control FA2", "cascade FA3", "control FA3"):
        assert f">{legend}</text>" in page, legend
    assert "Prompts diverged, cascade vs control" in page and "Divergences outside top-k" in page
    assert "calibration" not in page.split("<h2>Evidence</h2>")[1].split("<h2>What this run compares</h2>")[0]
    calibrated, _ = pages["fa3-ko-cal"]
    assert "grey italic rows are calibration pairs" in calibrated


# Backend twins (issue 45): the page is the run's twin's, not cascade's.
TWIN_RUNS = {
    "triton": EVIDENCE / "2026-12-03-h200-twins" / "triton",
    "flashinfer": EVIDENCE / "2026-12-03-h200-twins" / "flashinfer",
}


@pytest.mark.parametrize("name", list(TWIN_RUNS))
def test_a_backend_twins_page_is_its_own_and_every_label_is_whole(tmp_path: Path, name: str) -> None:
    from cascade_repro import twin

    data = load_run(TWIN_RUNS[name])
    axis = twin.of(spec_of(data.manifest.spec_json))
    page = HtmlFormatter().render(data)
    evidence = page.split("<h2>Evidence</h2>")[1].split("<h2>What this run compares</h2>")[0]
    # It leads with what decided: each pair's error ratio against the reference, its CI, the minimum effect.
    assert evidence.index("Error against the reference, test over twin") < evidence.index("Prompts diverged")
    assert 'class="threshold"' in evidence.split("</svg>")[0]
    # Legends, titles and captions name the run's arms; nothing promises a control it does not draw.
    assert f">{axis.test}</text>" in evidence and "cascade" not in evidence.lower()
    assert "no data" not in page and "judged against the reference" in evidence
    m = layout(page, 1280, tmp_path)
    assert m["clipped"] == [] and m["overlaps"] == [], m
