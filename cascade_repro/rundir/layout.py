"""The run directory's names and paths: no other module spells a file name of it out.

    run.json                 the manifest: spec, plan, prompt-set facts, environment, engines, timings
    prompts.jsonl            the prompt records, index i = prompt_index i
    samples/<key>.jsonl      append-only records of one engine key's worker
    reference/<key>.jsonl    the reference pass's records of that key's samples
    worker-<key>.log         that worker's stderr
    probe/<key>/             the vLLM probe's control and counts files of that engine
    cells.parquet pairs.parquet comparisons.parquet     the scored tables
    report.md report.html summary.json junit.xml        the reports
    minimize/<pair>/         `cascade-repro minimize` output
    .lock                    held while a process writes here

Also the whole-file writers of its text, JSON and tables, and prompts.jsonl's reader and writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.atomic import write_atomic

RUN_JSON = "run.json"
PROMPTS = "prompts.jsonl"
# A prompts.jsonl record's field holding the hash of the prompt as the run's tokenizer rendered it
# (``chat.prompt_hash``): the run's, not the prompt's, so the prompt loaders leave it out of the
# record they read back.
PROMPT_HASH = "prompt_hash"
SAMPLES = "samples"
REFERENCE = "reference"  # the reference pass's records, one file per engine key (run/reference.py)
REFERENCE_LOG = "reference.log"  # the reference pass's output
PROBE = "probe"
MINIMIZE = "minimize"
LOCK = ".lock"
# A merge in progress (its spec hash): a merge cut before it finished is cleared and redone by the
# next merge of the same matrix, where a folder of half-copied files would read as someone else's.
MERGING = ".merging"
CELLS, PAIRS, COMPARISONS = "cells.parquet", "pairs.parquet", "comparisons.parquet"
TABLES = (CELLS, PAIRS, COMPARISONS)
REPORT_MD, REPORT_HTML, SUMMARY_JSON, JUNIT_XML = "report.md", "report.html", "summary.json", "junit.xml"
REPORTS = (REPORT_MD, REPORT_HTML, SUMMARY_JSON, JUNIT_XML)
SWEEP_MD = "sweep.md"  # explain --measure's table


def samples_path(run_dir: Path, engine_key: str) -> Path:
    return run_dir / SAMPLES / f"{engine_key}.jsonl"


def samples_files(run_dir: Path) -> list[Path]:
    """Every engine key's samples file, sorted by name."""
    return sorted((Path(run_dir) / SAMPLES).glob("*.jsonl"))


def reference_path(run_dir: Path, engine_key: str) -> Path:
    return Path(run_dir) / REFERENCE / f"{engine_key}.jsonl"


def reference_files(run_dir: Path) -> list[Path]:
    """The reference pass's files of a run, sorted (none before the pass ran)."""
    return sorted((Path(run_dir) / REFERENCE).glob("*.jsonl"))


def probe_dir(run_dir: Path, engine_key: str) -> Path:
    return Path(run_dir) / PROBE / engine_key


def prompts_path(run_dir: Path) -> Path:
    return Path(run_dir) / PROMPTS


def read_prompts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's prompt records as written by the runner.

    Each is a dict with ``key``, ``prompt``, the IFEval fields (``instruction_id_list``, ``kwargs``,
    ``lang``) and, when the prompt source had other columns, ``extra`` (column name -> JSON data).
    """
    with open(prompts_path(run_dir), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(run_dir: Path, records: list[Any], hashes: list[str] | None = None) -> None:
    """Write prompts.jsonl atomically (temp file and rename).

    A record is a dict, or a :class:`~cascade_repro.prompts.promptsets.PromptRecord`, written as its
    ``to_json()`` (its extra columns under ``extra``). ``hashes``: each prompt's hash as the run's
    tokenizer renders it (``chat.prompt_hash``), written as its ``prompt_hash``: what every sample
    of that prompt must carry (:func:`sample_problem`).
    """
    rows: Iterable[dict[str, Any]] = (r if isinstance(r, dict) else r.to_json() for r in records)
    if hashes is not None:
        rows = ({**r, PROMPT_HASH: h} for r, h in zip(rows, hashes, strict=True))
    write_text_atomic(prompts_path(run_dir), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_parquet_atomic(df: Any, path: Path) -> None:
    """Write a table through a temp file and rename (:func:`~cascade_repro.atomic.write_atomic`)."""
    write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))


def write_run_json(run_dir: Path, run: dict[str, Any]) -> None:
    """Write run.json's JSON form atomically (:func:`write_manifest` writes a Manifest)."""
    write_json_atomic(Path(run_dir) / RUN_JSON, run)


def worker_log(run_dir: Path, engine_key: str) -> Path:
    return run_dir / f"worker-{engine_key}.log"


def shown(path: Path | str) -> str:
    """A path for a one-line message: relative to the current folder below it (as the user likely
    typed it; ``userpath.display``), a control character in a hostile name shown as ``?``."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", userpath.display(path))


def sweep_path(run_dir: Path) -> Path:
    return run_dir / SWEEP_MD


def write_text_atomic(path: Path, text: str, *, mode: int | None = None, durable: bool = False) -> None:
    """Write text through a temp file and rename, so readers never see half a file.

    ``mode``: the file's permissions (else 0666 less the umask, as for every file of a run
    directory); ``durable``: fsync before the rename, so a power loss cannot leave an empty file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=mode, durable=durable)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
