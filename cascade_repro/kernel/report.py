"""Reports of `cascade-repro kernel`: summary.json, report.md, junit.xml and the terminal tables.

Every formatter renders from the summary dictionary alone (what :func:`summary` builds and
summary.json holds), so a report can be rebuilt from summary.json. The formatters are
:mod:`cascade_repro.report`'s (its formatter interface, its Markdown table and JUnit document
writers, its escaping and number formats), as are the matrix reports.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from cascade_repro.report.base import Formatter
from cascade_repro.report.junit_xml import JunitDocument
from cascade_repro.report.text import (
    Strong,
    fence_for,
    fmt_float,
    json_text,
    md_cell,
    md_table_rows,
    one_line,
    plain,
    plural,
    text_of,
)
from cascade_repro.rundir import layout

SUITE = "cascade-repro-kernel"
FILES = ("report.md", "summary.json", "junit.xml")


# --------------------------------------------------------------------------------------------
# The summary
# --------------------------------------------------------------------------------------------


def counts_of(cases: list[dict]) -> dict[str, int]:
    out = {k: 0 for k in ("ok", "mismatch", "error", "skipped")}
    for c in cases:
        out[c.get("status", "error")] = out.get(c.get("status", "error"), 0) + 1
    return out


def exit_status(cases: list[dict]) -> tuple[int, str]:
    """1 on any mismatch or error, or when no case ran; else 0."""
    n = counts_of(cases)
    if n["mismatch"] or n["error"]:
        parts = [plural(n[k], k) for k in ("mismatch", "error") if n[k]]
        return 1, ", ".join(parts)
    if n["ok"] == 0:
        return 1, "no case ran"
    return 0, "no mismatch"


def headline(data: dict) -> str:
    cases = data.get("cases", [])
    n = counts_of(cases)
    shown = [plural(n[k], k) for k in ("mismatch", "error") if n[k]]
    if n["skipped"]:
        shown.append(f"{n['skipped']} skipped")  # an adjective: "6 skipped", not "6 skippeds"
    inject = (data.get("settings") or {}).get("inject")
    tail = f" (injected: {inject})" if inject else ""
    partial = data.get("partial")
    if partial:
        tail += f" (in progress: {partial['done']} of {partial['total']} cases done)"
    return f"cascade-repro kernel: {', '.join(shown) or 'no mismatch'} in {plural(len(cases), 'case')}{tail}"


def positive_control(cases: list[dict]) -> dict:
    """With an injection: how many decode-GQA cases turned into mismatches (all of them should)."""
    ran = [
        c
        for c in cases
        if c.get("kind") == "decode" and c.get("gqa") and c.get("status") in ("ok", "mismatch")
    ]
    hit = [c for c in ran if c["status"] == "mismatch"]
    return {
        "decode_gqa_cases": len(ran),
        "decode_gqa_mismatches": len(hit),
        "all_caught": bool(ran) and len(hit) == len(ran),
    }


def group_table(cases: list[dict]) -> list[dict]:
    """Per (FA version, splits, dtype, kind): how far cascade's error is from flat's."""
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        if c.get("status") in ("ok", "mismatch") and c.get("ratio") is not None:
            groups.setdefault((c["fa_version"], c["max_num_splits"], c["dtype"], c["kind"]), []).append(c)
    rows = []
    for (fa, sp, dt, kind), cs in sorted(groups.items()):
        ratios = [c["ratio"] for c in cs]
        rows.append(
            {
                "fa_version": fa,
                "max_num_splits": sp,
                "dtype": dt,
                "kind": kind,
                "n": len(cs),
                "mismatches": sum(c["status"] == "mismatch" for c in cs),
                "ratio_median": statistics.median(ratios),
                "ratio_max": max(ratios),
                "cascade_rel_max": max(c["cascade"]["rel"] for c in cs),
                "flat_rel_max": max(c["flat"]["rel"] for c in cs),
            }
        )
    return rows


def summary(
    results: list[Any],
    settings: dict,
    env: dict,
    started_at: str,
    wall_s: float,
    command: str | None = None,
    total: int | None = None,
) -> dict:
    """The summary dictionary every report renders from (CaseResult objects or their dicts).

    ``total``: the number of cases of the run, when ``results`` holds only those finished so far (the
    reports written while the run goes on); the summary then says ``partial``.
    """
    cases = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in results]
    code, reason = exit_status(cases)
    if total is not None and len(cases) < total:
        code, reason = 1, f"run not finished ({len(cases)} of {total} cases done)"
    data: dict[str, Any] = {
        "tool": "cascade-repro kernel",
        "settings": settings,
        "counts": counts_of(cases),
        "exit_code": code,
        "exit_reason": reason,
        "groups": group_table(cases),
        "env": env,
        "started_at": started_at,
        "wall_s": round(wall_s, 2),
        "command": command,
        "cases": cases,
    }
    if total is not None and len(cases) < total:
        data["partial"] = {"done": len(cases), "total": total}
    if settings.get("inject"):
        data["positive_control"] = positive_control(cases)
    data["headline"] = headline(data)
    return plain(data)


# --------------------------------------------------------------------------------------------
# Formatters
# --------------------------------------------------------------------------------------------


def fmt_sci(v: Any) -> str:
    return fmt_float(v, ".2e")


def fmt_error_ratio(v: Any) -> str:
    """Cascade's error over the flat path's (``ratio``, ``seq_ratio``), two decimals."""
    return fmt_float(v, ".2f")


CASE_COLUMNS = (
    "case", "kind", "seqs", "prefix", "heads q/kv", "head dim", "dtype", "FA", "splits",
    "cascade rel", "flat rel", "ratio", "cascade max abs", "flat max abs", "vLLM picks cascade", "verdict",
)  # fmt: skip


def fmt_yes(v: Any) -> str:
    return "—" if v is None else ("yes" if v else "no")


def case_row(c: dict) -> list[str]:
    casc, flat = c.get("cascade") or {}, c.get("flat") or {}
    return [
        text_of(c.get("case_id")),
        text_of(c.get("kind")),
        text_of(c.get("num_seqs")),
        text_of(c.get("prefix_len")),
        f"{c.get('num_q_heads')}/{c.get('num_kv_heads')}",
        text_of(c.get("head_dim")),
        text_of(c.get("dtype")),
        text_of(c.get("fa_version")),
        text_of(c.get("max_num_splits")),
        fmt_sci(casc.get("rel")),
        fmt_sci(flat.get("rel")),
        fmt_error_ratio(c.get("ratio")),
        fmt_sci(casc.get("max_abs")),
        fmt_sci(flat.get("max_abs")),
        fmt_yes(c.get("vllm_would_cascade")),
        text_of(c.get("status")),
    ]


GROUP_COLUMNS = ("FA", "splits", "dtype", "kind", "cases", "mismatches", "ratio median", "ratio max",
                 "cascade rel max", "flat rel max")  # fmt: skip


def group_row(g: dict) -> list[str]:
    return [
        str(g["fa_version"]), str(g["max_num_splits"]), str(g["dtype"]), str(g["kind"]), str(g["n"]),
        str(g["mismatches"]), fmt_error_ratio(g["ratio_median"]), fmt_error_ratio(g["ratio_max"]),
        fmt_sci(g["cascade_rel_max"]), fmt_sci(g["flat_rel_max"]),
    ]  # fmt: skip


def env_lines(data: dict) -> list[str]:
    env = data.get("env") or {}
    return [f"{k}: {one_line(text_of(v))}" for k, v in sorted(env.items())]


def intro(data: dict) -> str:
    s = data.get("settings") or {}
    text = (
        "Each case builds paged KV caches (block size 16) with a shared prefix, runs vLLM's "
        "`cascade_attention` and the flat path (one `flash_attn_varlen_func` call over the full paged KV, "
        "as vLLM's non-cascade forward does) on the same inputs, and compares both with exact attention "
        f"in float64. Verdict `ok` when cascade's relative error is at most {fmt_float(s.get('factor'), 'g')} "
        "times the flat path's."
    )
    if s.get("inject"):
        text += f" Fault injected into the cascade merge: `{one_line(str(s['inject']))}`."
    return text


class KernelFormatter(Formatter[dict]):
    """Render one file from the summary dictionary."""


class JsonKernel(KernelFormatter):
    name = "json"
    filename = "summary.json"

    def render(self, data: dict) -> str:
        return json_text(data)


def md_table(headers: tuple[str, ...], rows: list[list[str]], empty: str) -> list[str]:
    return md_table_rows(headers, rows) if rows else [f"_{empty}_"]


def _strong_verdict(row: list[str]) -> list[str]:
    """A case row with its verdict in bold unless ``ok``."""
    return [*row[:-1], Strong(row[-1])] if row[-1] != "ok" else row


class MarkdownKernel(KernelFormatter):
    name = "markdown"
    filename = "report.md"

    def render(self, data: dict) -> str:
        cases = data.get("cases", [])
        out = [f"## {md_cell(data.get('headline', ''), limit=300)}", "", intro(data), ""]
        pc = data.get("positive_control")
        if pc:
            out += [
                f"Positive control: {pc['decode_gqa_mismatches']}/{pc['decode_gqa_cases']} decode-GQA cases "
                f"are mismatches{' (all caught)' if pc['all_caught'] else ' (NOT all caught)'}.",
                "",
            ]
        out += ["### By FA version, splits, dtype and kind", ""]
        out += md_table(GROUP_COLUMNS, [group_row(g) for g in data.get("groups") or []], "no case ran")
        out += ["", "### Cases", ""]
        out += md_table(CASE_COLUMNS, [_strong_verdict(case_row(c)) for c in cases], "no cases")
        problems = [c for c in cases if c.get("reason")]
        if problems:
            out += ["", "### Notes", ""]
            out += [f"- `{one_line(str(c['case_id']))}`: {md_cell(c['reason'], limit=300)}" for c in problems]
        env = "\n".join(env_lines(data))
        fence = fence_for(env)
        out += ["", "### Environment", "", f"{fence}text", *env.split("\n"), fence, ""]
        if data.get("command"):
            cmd = one_line(str(data["command"]))
            fence = fence_for(cmd)
            out += ["### Reproduce", "", f"{fence}bash", cmd, fence, ""]
        return "\n".join(out).rstrip("\n") + "\n"


def _details(c: dict) -> str:
    casc, flat = c.get("cascade") or {}, c.get("flat") or {}
    return "\n".join(
        [
            f"cascade: rel {fmt_sci(casc.get('rel'))}, max abs {fmt_sci(casc.get('max_abs'))}, "
            f"mean abs {fmt_sci(casc.get('mean_abs'))}",
            f"flat: rel {fmt_sci(flat.get('rel'))}, max abs {fmt_sci(flat.get('max_abs'))}, "
            f"mean abs {fmt_sci(flat.get('mean_abs'))}",
            f"ratio {fmt_error_ratio(c.get('ratio'))}, worst request ratio {fmt_error_ratio(c.get('seq_ratio'))}",
        ]
    )


class JunitKernel(KernelFormatter):
    name = "junit"
    filename = "junit.xml"

    def render(self, data: dict) -> str:
        doc = JunitDocument(SUITE)
        s, env = data.get("settings") or {}, data.get("env") or {}
        for k, v in (("inject", s.get("inject")), ("factor", s.get("factor")), ("vllm", env.get("vllm")),
                     ("gpu", env.get("gpu"))):  # fmt: skip
            if v is not None:
                doc.add_property(k, str(v))
        for c in data.get("cases", []):
            wall = c.get("wall_s")
            attrs = {
                "classname": f"kernel.fa{c.get('fa_version')}.{c.get('kind')}",
                "name": str(c.get("case_id")),
            }
            if isinstance(wall, int | float) and math.isfinite(wall):
                attrs["time"] = f"{wall:.3f}"
            case = doc.testcase(**attrs)
            status, reason = c.get("status"), one_line(text_of(c.get("reason")))
            if status == "mismatch":
                doc.outcome(case, "failure", _details(c), message=reason, type="mismatch")
            elif status == "error":
                doc.outcome(case, "error", message=reason, type="error")
            elif status == "skipped":
                doc.outcome(case, "skipped", message=reason)
        return doc.render(data.get("wall_s"))


FORMATTERS: tuple[KernelFormatter, ...] = (MarkdownKernel(), JsonKernel(), JunitKernel())


def write_reports(data: dict, out_dir: Path) -> list[Path]:
    """Write report.md, summary.json and junit.xml into out_dir (created); return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATTERS:
        path = out_dir / fmt.filename
        layout.write_text_atomic(path, fmt.render(data), durable=True)
        paths.append(path)
    return paths


STYLE = {"ok": "green", "mismatch": "bold red", "error": "bold magenta", "skipped": "yellow"}


def rich_table(data: dict) -> Any:
    """The terminal table: one row per case."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(data.get("headline", "cascade-repro kernel")))
    for col in ("case", "seqs", "prefix", "heads", "d", "dtype", "FA", "splits", "cascade rel", "flat rel",
                "ratio", "verdict"):  # fmt: skip
        table.add_column(
            col, overflow="fold", justify="right" if col not in ("case", "dtype", "verdict") else "left"
        )
    for c in data.get("cases", []):
        r = case_row(c)
        status = r[-1]
        table.add_row(
            escape(r[0]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
            f"[{STYLE.get(status, '')}]{escape(status)}[/]",
        )  # fmt: skip
    return table


def plan_table(cases: list[Any]) -> Any:
    """The terminal table of ``--dry-run``: one row per case (KernelCase objects)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"cascade-repro kernel: {len(cases)} cases")
    table.add_column("case", overflow="fold")
    for col in ("seqs", "tokens", "prefix", "max seq", "heads", "d", "dtype", "FA", "splits"):
        table.add_column(col, no_wrap=True)
    for c in cases:
        table.add_row(
            escape(c.case_id), str(c.num_seqs), str(c.num_tokens), str(c.prefix_len),
            str(max(c.seq_lens)), c.heads, str(c.head_dim), c.dtype, str(c.fa_version), str(c.max_num_splits),
        )  # fmt: skip
    return table
