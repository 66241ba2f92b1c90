"""Score and report above the stages: a matrix run's orchestration from its workers to its
outcome, ``report``'s rescoring and rendering, and a merge's ending.

The stages run forwards (prompts/ -> plan/ -> run/ -> judge/ -> report/); what ends a run reaches
back across them (the runner's run is scored by judge/ and written by report/), so it lives here,
a top-level module that may use every stage. The run's lock is held from the workers' start to the
last report written, as one unit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.errors import UsageError
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.plan.flags import RunSettings
from cascade_repro.plan.matrix import FAIL_ON_DEFAULT, MatrixSpec, check_fail_on
from cascade_repro.plan.shard import Shard, restrict
from cascade_repro.run import merge as merging
from cascade_repro.run import runner
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.run.runner import Executor, RunSetup, check_run_id
from cascade_repro.rundir import layout, manifest, runlock, sample_scan
from cascade_repro.rundir.manifest import SCORED, EngineRecord, Invocation, Manifest, newer_version_note


@dataclass
class RunOptions(RunSetup):
    """How to run a matrix and judge it, as opposed to what the matrix is (MatrixSpec): the
    workers' setup (``runner.RunSetup``) and the thresholds its verdicts use."""

    thresholds: Thresholds = field(default_factory=Thresholds)

    def thresholds_record(self) -> dict[str, Any]:
        return self.thresholds.to_dict()

    @classmethod
    def from_settings(cls, settings: RunSettings, *, fresh: bool = False, command: str = "") -> RunOptions:
        """`matrix`'s run settings checked and typed; a refused one is one line naming the flag, or
        the config file and its key where the value came from there. Checked before a dry run too:
        a plan that looks fine must not hide a knob that is not."""
        s = settings
        with s.named():
            check_fail_on(s.fail_on)
            thresholds = Thresholds(
                alpha=s.alpha,
                rep_delta=s.rep_delta,
                min_topk_violations=s.min_topk_violations,
                drift_min=s.drift_min,
            )
            reference = ReferenceOptions(s.reference, s.reference_device)
            shard = Shard.parse(s.shard) if s.shard is not None else None
            executor = Executor(s.executor, s.ray_address, s.retries)
            results_dir = userpath.resolve(s.results_dir, "--results-dir")
            if s.run_id is not None:  # '' would name the default run: refused, not ignored
                check_run_id(s.run_id)
            if s.max_engines_per_gpu is not None and s.max_engines_per_gpu < 1:
                raise UsageError(f"--max-engines-per-gpu {s.max_engines_per_gpu}: must be 1 or more")
            if s.max_engines_per_gpu is not None and s.executor == "ray":
                raise UsageError(
                    "--max-engines-per-gpu packs this machine's GPUs; --executor ray places each key's task itself"
                )
        if executor.name == "ray":  # Ray missing: one line now, before a dry run or a prepare
            from cascade_repro.run.ray_executor import import_ray

            import_ray()
        return cls(
            results_dir=results_dir,
            run_id=s.run_id,
            fresh=fresh,
            fail_on=s.fail_on,
            thresholds=thresholds,
            command=command,
            bar=not s.quiet,
            shard=shard,
            allow_mixed=s.allow_mixed,
            reference=reference,
            executor=executor,
            max_engines_per_gpu=s.max_engines_per_gpu,
        )


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    counts: dict[str, int]
    errors: list[str]
    headline: str = ""
    reason: str = ""


def add_invocation(m: Manifest, kind: str, command: str) -> None:
    """Append a non-matrix invocation (``rescore``: now, ``command``, this environment) to ``m``'s
    list, the earlier ones kept."""
    from cascade_repro.run import envinfo

    invs = list(m.invocations or [m.own_invocation()])
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    invs.append(
        Invocation(started_at=now, command=command, kind=kind, env=envinfo.capture(include_gpu=False))
    )
    m.update(invocations=invs)


def _warn_stderr(line: str) -> None:
    """A scoring warning (a damaged sample line skipped): one line on stderr, as written."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


@dataclass
class Scored:
    """A run scored but not yet written: run.json as it will be (engine records, thresholds), the
    three tables, and what scoring read of the samples (the report's examples come from it)."""

    run: Manifest
    cells: Any
    pairs: Any
    comparisons: Any
    samples: Any


def score(
    run_dir: Path, thresholds: Thresholds | None = None, warn: Callable[[str], None] = _warn_stderr
) -> Scored:
    """Score the samples; write nothing (:func:`commit` does). ``warn`` is told each damaged sample
    line skipped."""
    from cascade_repro.judge.several import score_run

    run = manifest.read_manifest(run_dir, SCORED)
    th = thresholds or Thresholds.from_record(run.thresholds)
    scored = restrict(run)  # a shard scores its own cells; merge scores them all
    read, cells_df, pairs_df, comp_df = score_run(scored, run_dir, th, warn=warn)
    engines = {}
    for key in scored.plan.engines:
        prog = read.progress[key]
        eff = dict(prog.engine.get("effective", {}))
        errs = {c: e for c, e in prog.errors.items()}
        # ``of``: a pending engine's start_s is written as null, as ever.
        engines[key] = EngineRecord.of(
            effective=eff,
            start_s=prog.engine.get("start_s"),
            status="error" if errs else ("done" if prog.engine else "pending"),
            error=next(iter(errs.values()), ""),
        )
    for key, record in engines.items():
        if isinstance(old := (run.engines or {}).get(key), EngineRecord):
            record.keep_unknown(old)
    run.update(engines=engines, thresholds=th.to_dict())
    return Scored(run, cells_df, pairs_df, comp_df, read)


def commit(run_dir: Path, scored: Scored) -> tuple[Path, Any]:
    """Write what :func:`score` made: the tables, run.json, every report; return (run_dir, RunData)."""
    from cascade_repro.report import write_reports
    from cascade_repro.report.load import load_run

    tables = (
        (layout.CELLS, scored.cells),
        (layout.PAIRS, scored.pairs),
        (layout.COMPARISONS, scored.comparisons),
    )
    for name, df in tables:
        layout.write_parquet_atomic(df, run_dir / name)
    manifest.write_manifest(run_dir, scored.run)
    data = load_run(run_dir, samples=scored.samples.records)
    write_reports(run_dir, data=data)
    return run_dir, data


def finalize(run_dir: Path, thresholds: Thresholds | None = None) -> tuple[Path, Any]:
    """Score the samples, write the tables and every report; return (run_dir, RunData)."""
    return commit(run_dir, score(run_dir, thresholds))


def rescore(run_dir: Path, command: str, allow_loss: bool = False) -> tuple[Path, Any]:
    """``report --rescore``: score the samples again and write the tables, recording the invocation.

    Nothing is written until the new tables are known not to lose what the old ones hold
    (:func:`rescore_loss`): such a rescore is a one-line UsageError, the old tables, reports and
    run.json left as they were, unless ``allow_loss``."""
    run_dir = Path(run_dir)
    manifest.read_manifest(run_dir, SCORED)  # a damaged run.json: one line, before anything is read
    old = _old_cells(run_dir)
    warnings: list[str] = []  # said once the new tables are written; a refusal is its one line
    scored = score(run_dir, warn=warnings.append)
    if not allow_loss and (loss := rescore_loss(run_dir, old, scored.cells)) is not None:
        raise UsageError(
            f"not rescoring {layout.shown(run_dir)}: {loss}; the old tables and reports are kept "
            "(--allow-loss writes the new ones)"
        )
    for line in warnings:
        _warn_stderr(line)
    add_invocation(scored.run, "rescore", command)
    return commit(run_dir, scored)


@dataclass
class Rerendered:
    """What ``report`` did: the reports it wrote, and the run's outcome under its --fail-on."""

    paths: dict[Any, Path]
    outcome: Any  # report.outcome.Outcome
    # The reports left as they were (a run without samples/ beside richer ones), and why, in one line.
    kept: list[Path] = field(default_factory=list)
    note: str = ""
    run_dir: Path | None = None  # the run directory as resolved (``userpath``)
    newer: str | None = None  # the run was made by a newer version (manifest.newer_version_note)


def rerender(
    run_dir: Path,
    fail_on: str | None = None,
    rescore_first: bool = False,
    allow_loss: bool = False,
    command: str = "",
    force: bool = False,
) -> Rerendered:
    """``cascade-repro report``: write every report of a run again from its saved files, judged by
    ``fail_on`` (None: the run's own). Under the run's lock: a matrix still writing the directory
    would be scored half-way, and two writers of the reports would interleave. A run cut before
    scoring is scored first (its report then shows the cells it finished, and says the run is not
    finished); ``rescore_first`` scores it again (:func:`rescore`, recorded as ``command``). A
    directory without run.json is not locked (nothing to lock, and no lock file left behind): the
    readers say what is wrong with it.

    A run without ``samples/`` (committed evidence, an artifact copied without them) renders no
    sample text or top-k table: where report.md or report.html already exist, they are kept
    (they may hold what this rendering cannot) unless ``force``; the other reports are written."""
    from contextlib import nullcontext

    from cascade_repro.judge.outcome import run_fail_on
    from cascade_repro.report import ReportFormat, write_reports
    from cascade_repro.report.load import load_run
    from cascade_repro.report.outcome import outcome_of

    if fail_on is not None:  # before anything is scored or written
        check_fail_on(fail_on)
    run_dir = userpath.resolve(run_dir, "RUN_DIR")
    if run_dir.is_file():
        raise UsageError(
            f"{layout.shown(run_dir)} is a file: give the run directory ({layout.shown(run_dir.parent)})"
        )
    is_run = (run_dir / layout.RUN_JSON).is_file()
    if is_run:  # a damaged run.json: one line, before the lock file is made
        run = manifest.read_manifest(run_dir)
    with runlock.RunLock(run_dir, instead="") if is_run else nullcontext():
        unscored = (
            is_run
            and not all((run_dir / t).is_file() for t in layout.TABLES)
            # samples/ may not exist yet (cut during the first engine start): all cells pending
            and run.has("plan")
        )
        scored_now = unscored or rescore_first
        if unscored and not rescore_first:
            _, data = finalize(run_dir)
        elif rescore_first:
            _, data = rescore(run_dir, command, allow_loss=allow_loss)
        else:
            data = load_run(run_dir)
        formats = list(ReportFormat)
        kept: list[Path] = []
        note = ""
        if data.samples_missing:
            rich = [
                f for f in (ReportFormat.markdown, ReportFormat.html) if (run_dir / _report_name(f)).is_file()
            ]
            if rich and not force:
                kept = [run_dir / _report_name(f) for f in rich]
                formats = [f for f in formats if f not in rich]
                note = f"{data.samples_missing}; left {' and '.join(p.name for p in kept)} unchanged (--force rewrites them)"
            else:
                note = data.samples_missing
        with data.settled():  # the reports and the outcome read the same tables: each converted once
            if scored_now and fail_on is None and not data.samples_missing:
                # Scoring (`commit`) has just written every report, judged by the run's own --fail-on:
                # written again from the same data they would be the same bytes.
                paths = {f: run_dir / _report_name(f) for f in formats}
            else:
                # Rendered from what was loaded (or scored): the samples are read once.
                paths = write_reports(run_dir, formats, fail_on=fail_on, data=data)
            outcome = outcome_of(data, fail_on if fail_on is not None else run_fail_on(data.manifest))
    from cascade_repro.run.envinfo import _version

    newer = newer_version_note(run, _version("cascade-repro")) if is_run else None
    return Rerendered(paths, outcome, kept, note, run_dir, newer)


def _report_name(fmt: Any) -> str:
    from cascade_repro.report import formatter_for

    return formatter_for(fmt).filename


def _old_cells(run_dir: Path) -> Any:
    """The cells table a rescore would replace; None where there is none, or none readable (a
    damaged table holds nothing to keep)."""
    import pandas as pd

    path = run_dir / layout.CELLS
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except Exception:  # noqa: BLE001 - pyarrow raises several unrelated types for a damaged file
        return None


def _prompt_records_problem(run_dir: Path) -> str | None:
    """The prompt loader's one line on prompts.jsonl, where it refuses the file (scoring then has no
    prompts to score instructions against); None where it reads."""
    from cascade_repro.prompts.promptsets import iter_prompt_records

    try:
        for _ in iter_prompt_records(layout.prompts_path(run_dir), check_kwarg_types=False):
            pass
    except UsageError as e:
        return str(e)
    return None


def rescore_loss(run_dir: Path, old: Any, new: Any) -> str | None:
    """What the new cells table would lose against the old one, in words; None when nothing.

    Lost: prompts.jsonl missing or damaged (every IFEval score, and each sample's check against its
    prompt, go with it); a cell finished in the old table that the samples no longer finish (its
    samples file missing or cut short, a sample record damaged or of another run: the new table
    would say "pending" or "error" where the old one held results; the first such record is
    named). Not a loss: a prompt whose instructions cannot be scored (the report's IFEval note says
    which), a cell the old table had not finished either.
    """
    if (why := sample_scan.prompts_problem(run_dir)) is not None:
        return f"{why}, so every IFEval score and each sample's check against its prompt would be dropped"
    if (why := _prompt_records_problem(run_dir)) is not None:
        return f"{why}; so every IFEval score would be dropped"
    if old is None or not {"cell_id", "status"} <= set(old.columns):
        return None
    before = old.set_index("cell_id")
    after = new.set_index("cell_id")
    was_done = before.index[before["status"] == "done"]
    gone = [c for c in was_done if c not in after.index or after.at[c, "status"] != "done"]
    if not gone:
        return None
    lost = f"{len(gone)} cell(s) finished in the old tables would not be"
    keys = {c: str(after.at[c, "engine_key"]) for c in gone if c in after.index}
    if missing := next((k for k in keys.values() if not layout.samples_path(run_dir, k).is_file()), None):
        return f"{lost}: {layout.SAMPLES}/{layout.shown(missing)}.jsonl is missing"
    ids = sample_scan.prompt_ids(run_dir)
    for cid, key in keys.items():
        path = layout.samples_path(run_dir, key)
        prog = sample_scan.read_progress(path, ids)
        if lines := prog.corrupt.get(cid):
            why = prog.why.get(lines[0], "not JSON")
            return f"{lost} ({layout.shown(cid)} first): {layout.SAMPLES}/{layout.shown(path.name)} line {lines[0]}: {why}"
        if cid in prog.errors:
            return f"{lost} ({layout.shown(cid)} first): its samples now end in an error record"
    return f"{lost} ({layout.shown(gone[0])} first): the records that finished it are gone from {layout.SAMPLES}/"


def run_matrix(spec: MatrixSpec, opts: RunOptions, console: Any = None) -> RunOutcome:
    """Prepare, execute and finalize a matrix; the library entry point behind ``cascade-repro matrix``."""
    from cascade_repro.report.outcome import outcome_of

    t0 = time.time()
    prepared = runner.start(spec, opts, console)
    run_dir = prepared.run_dir
    with runlock.RunLock(run_dir):  # held while scoring: a reader must not see half the tables
        run, errors = runner.run_workers(prepared, spec, opts, t0, console)
        if not restrict(run).plan.cells:  # an empty shard: nothing to score
            return RunOutcome(run_dir, 0, {}, errors)
        _, data = finalize(run_dir, opts.thresholds)
    o = outcome_of(data, opts.fail_on)
    return RunOutcome(run_dir, o.exit_code, o.counts, errors, o.headline, o.reason)


@dataclass
class MergeOutcome:
    run_dir: Path
    exit_code: int
    counts: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    data: Any = None
    headline: str = ""
    reason: str = ""
    notes: list[str] = field(default_factory=list)  # which run a results dir given as a shard held


def merge(out_dir: Path, shard_dirs: list[Path], fail_on: str = FAIL_ON_DEFAULT, link: bool = False,
          command: str = "", allow_partial: bool = False) -> MergeOutcome:  # fmt: skip
    """Merge shard run directories into ``out_dir`` (``run.merge``), score it and write every report.

    A missing shard is a UsageError (exit 2), before anything is written, unless ``allow_partial``.
    Exit code as for ``cascade-repro report``: 1 when ``fail_on`` says the verdicts fail.
    """
    from cascade_repro.report.outcome import outcome_of

    check_fail_on(fail_on)
    found = merging.gather(out_dir, shard_dirs, allow_partial)
    out_dir = found.out_dir
    with runlock.RunLock(
        out_dir, instead="choose another OUT_DIR"
    ):  # links refused there, before anything is deleted or written
        warnings = merging.assemble(found, fail_on, link, command)
        _, data = finalize(out_dir)
        (out_dir / layout.MERGING).unlink()
    o = outcome_of(data, fail_on)
    return MergeOutcome(out_dir, o.exit_code, o.counts, warnings, data, o.headline, o.reason, found.notes)
