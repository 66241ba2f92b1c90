"""junit.xml: one testcase per cascade pair so CI systems show regressions as failing tests."""

from __future__ import annotations

from cascade_repro.judge import outcome
from cascade_repro.judge.result import PairResult
from cascade_repro.report import power, verdict_table, view
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.junit_xml import JunitDocument, element
from cascade_repro.report.load import RunData
from cascade_repro.report.text import (
    fmt_ci,
    fmt_int,
    fmt_p_eq,
    fmt_ratio,
    one_line,
    text_of,
    text_or_missing,
)
from cascade_repro.rundir import layout
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.twin import TwinAxis

SUITE = "cascade-repro"


def _details(res: PairResult, axis: TwinAxis = TWIN) -> str:
    r, c = res.row, res.counts
    return "\n".join(
        [
            f"drift ratio {verdict_table.fmt_drift(r)} vs threshold {verdict_table.fmt_drift_rule(r)} "
            f"(control {text_or_missing(r.get('control_pair_id'))})",
            f"diverged {fmt_ratio(c.n_diverged, c.n)} vs noise "
            f"{fmt_ratio(c.noise_n_diverged, c.noise_n)} ({fmt_p_eq(res.piece('divergence').value)})",
            f"top-k violations {fmt_int(c.topk_violations)} vs noise "
            f"{fmt_int(c.noise_topk_violations)} ({fmt_p_eq(res.piece('top-k').value)})",
            f"delta seq-rep-4 {fmt_ci(r.get('d_seq_rep_4_mean'), r.get('d_seq_rep_4_lo'), r.get('d_seq_rep_4_hi'))}",
            f"{axis.effect_label} {fmt_ratio(c.cascade_steps, c.total_steps)}"
            + (
                f", decode steps {fmt_int(r.get('cascade_decode_steps'))}, depth {text_or_missing(r.get('depth'))}"
                if view.shows_depth(axis)
                else ""
            ),
            f"decided by {text_or_missing(r.get('decided_by'))}",
            f"test cell {text_of(r.get('test_cell'))}, ref cell {text_of(r.get('ref_cell'))}",
        ]
    )


class JunitFormatter(ReportFormatter):
    """Render junit.xml."""

    name = "junit"
    filename = layout.JUNIT_XML

    def render(self, data: RunData) -> str:
        """Return the JUnit XML document."""
        cell_status = {r["cell_id"]: r for r in view.cells(data)}
        # The Ant JUnit schema requires timestamp (no zone) and hostname; the host is not recorded on
        # purpose (reports are pasted into public issues), which the schema spells "localhost".
        created = str(data.manifest.created_at or "")[:19]
        stamp = {"timestamp": created or "1970-01-01T00:00:00", "hostname": "localhost"}
        doc = JunitDocument(SUITE, **stamp)
        if not data.manifest.several:
            _suite(doc, data, cell_status)
            return doc.render(suite_seconds(data))
        # A run of several twins: one testsuite per twin (cascade-repro/<twin>), its pairs' testcases.
        doc.drop_first_suite()
        for tw in data.twins:
            doc.add_suite(f"{SUITE}/{tw.name}", **stamp)
            _suite(doc, data.for_twin(tw), cell_status)
        return doc.render(suite_seconds(data))


def _suite(doc: JunitDocument, data: RunData, cell_status: dict[str, dict]) -> None:
    """The current suite's properties and one testcase per twin pair of ``data`` (a run, or one
    twin's view of a run of several)."""
    for k, v in (
        ("run_id", data.manifest.run_id),
        ("engine", view.spec_field(data, "engine")),
        ("model", view.spec_field(data, "model")),
        ("inject", view.spec_field(data, "inject")),
    ):
        if v:
            doc.add_property(k, str(v))
    # Calibration pairs are not testcases (an injected error is meant to fail); what they
    # measured is one property.
    statements = [e["statement"] for e in power.detection_power(data)]
    doc.add_property("detection_power", " ".join(statements) or power.not_calibrated(data, str))
    axis = data.twin
    # A run that ran cascade on no decode step passes no test of decode: its pairs are skipped.
    prefill_only = {text_of(r.get("pair_id")) for r in outcome.prefill_only_pairs(data)}
    for res in view.cascade_results(data):
        r = res.row
        test_cell = cell_status.get(r.get("test_cell"), {})
        wall = test_cell.get("wall_s")
        case = doc.testcase(
            # The pair's kind names its twin (cascade, prefix-caching, ...).
            classname=f"{text_of(r.get('kind')) or TWIN.pair_kind}.tp{fmt_int(r.get('tp'))}",
            name=f"batch{fmt_int(r.get('batch'))}-{text_of(r.get('pair_id'))}",
            # the cascade cell's generation time (its flat twin's is in its own cell row)
            time=f"{float(wall):.3f}" if isinstance(wall, int | float) and wall == wall else "0.000",
        )
        verdict = text_of(r.get("verdict"))
        failed = [
            cell_status[k]
            for k in (r.get("test_cell"), r.get("ref_cell"))
            if k in cell_status and cell_status[k].get("status") == "error"
        ]
        if verdict == outcome.ERROR or failed:
            msg = "; ".join(f"cell {f['cell_id']} failed: {text_of(f.get('error'))}" for f in failed)
            doc.outcome(
                case,
                "error",
                _details(res, axis),
                message=one_line(msg or text_of(r.get("reasons"))),
                type="error",
            )
        elif verdict == outcome.REGRESSION:
            doc.outcome(
                case,
                "failure",
                _details(res, axis),
                message=one_line(text_of(r.get("reasons"))),
                type="regression",
            )
        elif verdict == outcome.NOT_EXERCISED:
            doc.outcome(
                case,
                "skipped",
                message="cascade never fired" if axis is TWIN else f"{axis.name} never took effect",
            )
        elif text_of(r.get("pair_id")) in prefill_only:
            doc.outcome(
                case,
                "skipped",
                message=one_line(
                    f"not tested in decode: cascade ran on prefill steps only ({verdict} there)"
                ),
            )
        elif verdict == outcome.INCONCLUSIVE:
            doc.outcome(case, "skipped", message=one_line(f"inconclusive: {text_of(r.get('reasons'))}"))
        # Every pair's evidence, passing ones too: a CI page shows why a pair passed.
        element(case, "system-out", f"verdict {verdict}\n{_details(res, axis)}")


def suite_seconds(data: RunData) -> float | None:
    """The run's wall time over all its invocations (a resumed run's is their sum; runs written
    before the runner summed them recorded the last invocation's in ``timings``)."""
    times = [i.total_s for i in view.invocations(data) if isinstance(i.total_s, int | float)]
    if times:
        return round(sum(float(t) for t in times), 3)
    total = data.manifest.timings.total_s
    return float(total) if isinstance(total, int | float) else None
