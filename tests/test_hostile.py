"""Hostile run directories and prompt records: a run directory is input from elsewhere (a CI
artifact, a tarball), so what it holds must never reach outside it.

Each table row plants one thing, runs one command and asserts its exit code, that a refusal is one
line on stderr, and that nothing outside the run directory changed (``outside/``: a victim file and a
victim folder, compared byte for byte and by mtime). Run directories come from
``tests/support/make_synthetic_run.py`` (no model), copied for each row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.plan.models import embedded_available
from cascade_repro.rundir import codec, jsonl, layout, manifest, runlock, safety, sample_scan

WIDE = {"COLUMNS": "250"}
PAIR = "tp1-b8-cascade~flat"  # a cascade pair of the synthetic run (minimize takes any with --pair)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic run (two engine keys, scored), copied by every row that needs a run."""
    from conftest import synthetic_run

    return synthetic_run(tmp_path_factory.mktemp("hostile") / "synth", prompts=8, batch="1,8", tp="1,2")


@dataclass
class Case:
    """One row: ``plant`` builds the directories under ``root`` and returns the command's arguments."""

    id: str
    plant: Callable[[Path, Path], list[str]]  # (root, the synthetic run) -> argv
    code: int
    says: str = ""  # what the one line of stderr holds (a refusal); "" for a command that goes on
    needs_model: bool = False


def run_copy(synth: Path, dest: Path) -> Path:
    shutil.copytree(synth, dest, symlinks=True)
    return dest


def victims(root: Path) -> tuple[Path, Path]:
    """``outside/victim.txt`` and ``outside/dir/`` (with a file): what a link in a run points at."""
    out = root / "outside"
    (out / "dir").mkdir(parents=True)
    (out / "victim.txt").write_text("precious\n", encoding="utf-8")
    (out / "dir" / "keep.jsonl").write_text('{"keep": 1}\n', encoding="utf-8")
    return out / "victim.txt", out / "dir"


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root/outside``: its bytes and mtime (what a truncation or append changes)."""
    out = {}
    for p in sorted((root / "outside").rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() else b"", st.st_mtime_ns)
    return out


def link(path: Path, target: Path) -> None:
    """Replace ``path`` (a file or a folder of the run) with a symbolic link to ``target``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def samples_file(run: Path) -> Path:
    return layout.samples_files(run)[0]


def shards(root: Path, synth: Path) -> tuple[Path, Path]:
    """Two shard directories of the synthetic run's matrix (each holds every key: merge takes its own)."""
    out = []
    for i in (1, 2):
        d = run_copy(synth, root / f"shard{i}")
        run = manifest.read_run_json(d)
        run["shard"] = f"{i}/2"
        layout.write_json_atomic(d / layout.RUN_JSON, run)
        out.append(d)
    return out[0], out[1]


# --- 1. links planted in a run directory ------------------------------------------------------------


def _report_lock(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / layout.LOCK, victims(root)[0])
    return ["report", str(run)]


def _report_samples(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(samples_file(run), victims(root)[0])
    return ["report", "--rescore", str(run)]


def _report_parquet_temp(root: Path, synth: Path) -> list[str]:
    """A link under a table's old temp name is never written through (temp files are new files): the report goes on."""
    run = run_copy(synth, root / "run")
    link(run / f".{layout.CELLS}.tmp", victims(root)[0])
    return ["report", "--rescore", str(run)]


def _merge_shard_samples(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    link(samples_file(s1), victims(root)[0])  # samples/*.jsonl -> /etc/passwd, say
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_shard_prompts(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    link(s1 / layout.PROMPTS, victims(root)[0])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_out_lock(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    (root / "merged").mkdir()
    link(root / "merged" / layout.LOCK, victims(root)[0])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_out_samples(root: Path, synth: Path) -> list[str]:
    """An earlier merge whose samples/ is a link: merging again would empty the folder it points at."""
    s1, s2 = shards(root, synth)
    assert CliRunner().invoke(app, ["merge", str(root / "merged"), str(s1), str(s2)]).exit_code == 0
    link(root / "merged" / layout.SAMPLES, victims(root)[1])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_clean(root: Path, synth: Path) -> list[str]:
    victims(root)
    s1, s2 = shards(root, synth)
    return ["merge", str(root / "merged"), str(s1), str(s2)]


# The deterministic fake engine: what these rows test (links, locks, paths) happens around the model.
MATRIX = ["matrix", "--engine", "fake", "--limit", "1", "--batch", "1", "--max-tokens", "2", "--no-auto-controls",
          "--quiet"]  # fmt: skip


def _matrix_lock(root: Path, synth: Path) -> list[str]:
    run = root / "results" / "r"
    run.mkdir(parents=True)
    link(run / layout.LOCK, victims(root)[0])
    return [*MATRIX, "--results-dir", str(root / "results"), "--run-id", "r"]


def _matrix_fresh_samples(root: Path, synth: Path) -> list[str]:
    """--fresh once left a linked samples/ in place (rmtree failing quietly) and resumed the old run."""
    run = run_copy(synth, root / "results" / "r")
    link(run / layout.SAMPLES, victims(root)[1])
    return [*MATRIX, "--results-dir", str(root / "results"), "--run-id", "r", "--fresh"]


def _minimize_dir(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / layout.MINIMIZE, victims(root)[1])
    return ["minimize", str(run), "--pair", PAIR]


def _minimize_prompts(root: Path, synth: Path) -> list[str]:
    """The prompts of the chosen wave are copied into repro.py and issue.md: never from a link."""
    run = run_copy(synth, root / "run")
    link(run / layout.PROMPTS, victims(root)[0])
    return ["minimize", str(run), "--pair", PAIR]


def _minimize_output(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / layout.MINIMIZE / PAIR / "repro.py", victims(root)[0])
    return ["minimize", str(run), "--pair", PAIR]


def _minimize_out_option(root: Path, synth: Path) -> list[str]:
    """--out names the user's own folder: still, an output file there that is a link is not written through."""
    run = run_copy(synth, root / "run")
    (root / "mine").mkdir()
    link(root / "mine" / "issue.md", victims(root)[0])
    return ["minimize", str(run), "--pair", PAIR, "--out", str(root / "mine")]


LINK = "is a symbolic link"
CASES = [
    Case("report-lock", _report_lock, 2, f".lock {LINK}"),
    Case("report-rescore-samples", _report_samples, 2, LINK),
    Case("report-parquet-temp", _report_parquet_temp, 0),
    Case("merge-shard-samples", _merge_shard_samples, 2, LINK),
    Case("merge-shard-prompts", _merge_shard_prompts, 2, f"prompts.jsonl {LINK}"),
    Case("merge-out-lock", _merge_out_lock, 2, f".lock {LINK}"),
    Case("merge-out-samples", _merge_out_samples, 2, f"samples {LINK}"),
    Case("merge-clean", _merge_clean, 0),
    Case("matrix-lock", _matrix_lock, 2, f".lock {LINK}"),
    Case("matrix-fresh-linked-samples", _matrix_fresh_samples, 2, f"samples {LINK}"),
    Case("minimize-linked-dir", _minimize_dir, 2, f"minimize {LINK}"),
    Case("minimize-linked-prompts", _minimize_prompts, 2, f"prompts.jsonl {LINK}"),
    Case("minimize-linked-output", _minimize_output, 2, f"repro.py {LINK}"),
    Case("minimize-linked-output-in-out", _minimize_out_option, 2, f"issue.md {LINK}"),
]


@pytest.fixture(scope="module")
def model_ready() -> bool:
    """The embedded model converted before a matrix row runs, so its stderr is the refusal alone."""
    if not embedded_available():
        return False
    from cascade_repro.plan.models import resolve_model

    resolve_model("embedded")
    return True


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_run_directories(case: Case, synth: Path, tmp_path: Path, request: pytest.FixtureRequest):
    if case.needs_model and not request.getfixturevalue("model_ready"):
        pytest.skip("the embedded model is not installed")
    argv = case.plant(tmp_path, synth)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == case.code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
        assert "resuming" not in res.output
    assert snapshot(tmp_path) == before  # nothing outside the run directory changed
    merged = tmp_path / "merged"
    if case.code == 2 and case.id.startswith("merge-shard"):
        assert not merged.exists()  # refused before anything was written
    if merged.is_dir() and case.code == 0:
        assert all(not p.is_symlink() for p in merged.rglob("*"))
        assert "precious" not in "".join(p.read_text(errors="replace") for p in merged.rglob("*.jsonl"))


def test_refuse_links_names_a_linked_folder_on_the_way(tmp_path: Path):
    from cascade_repro.errors import UsageError

    run = tmp_path / "run"
    (tmp_path / "elsewhere").mkdir()
    run.mkdir()
    (run / "minimize").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match=f"^{run}/minimize is a symbolic link \\(to {tmp_path}/elsewhere\\)"):
        safety.refuse_links(run, [run / "minimize" / "pair" / "repro.py"])
    safety.refuse_links(run, [run / "samples" / "k.jsonl"])  # not there yet: nothing to refuse
    os.mkfifo(run / layout.LOCK)
    with pytest.raises(UsageError, match="is neither a file nor a folder"):
        safety.refuse_run_links(run)


def test_a_run_directory_that_is_itself_a_link_is_the_users_choice(synth: Path, tmp_path: Path):
    real = run_copy(synth, tmp_path / "real")
    (tmp_path / "alias").symlink_to(real)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "alias")], env=WIDE)
    assert res.exit_code == 0, res.output


def test_writers_in_a_run_directory_do_not_follow_a_link(tmp_path: Path):
    """Belt and braces under the directory check: the appending writers open with O_NOFOLLOW."""
    from cascade_repro.errors import UsageError

    victim, _ = victims(tmp_path)
    before = snapshot(tmp_path)
    planted = tmp_path / "k.jsonl"
    planted.symlink_to(victim)
    with pytest.raises(UsageError, match=LINK):
        jsonl.JsonlWriter(planted)
    with pytest.raises(UsageError, match=LINK):
        jsonl.truncate_torn_tail(planted)
    assert snapshot(tmp_path) == before and len(before) == 3  # the victim, its folder and the folder's file


# --- 2. prompt records whose IFEval kwargs have the wrong type --------------------------------------


def prompt_file(root: Path, kwargs: dict, iid: str = "startend:end_checker", name: str = "bad.jsonl") -> Path:
    """A prompt file whose second record carries ``kwargs`` for ``iid`` (the first is fine)."""
    rows = [
        {"key": "a", "prompt": "쉼표 없이 답하세요", "instruction_id_list": ["punctuation:no_comma"]},
        {"key": "b", "prompt": "답하세요", "instruction_id_list": [iid], "kwargs": [kwargs]},
    ]
    path = root / name
    if name.endswith(".csv"):
        import csv

        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["key", "prompt", "instruction_id_list", "kwargs"])
            w.writeheader()
            for r in rows:
                w.writerow(
                    {k: json.dumps(v, ensure_ascii=False) if isinstance(v, list) else v for k, v in r.items()}
                )
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    victims(root)
    return path


def _show(kwargs: dict, iid: str = "startend:end_checker", name: str = "bad.jsonl"):
    return lambda root, synth: ["prompts", "show", str(prompt_file(root, kwargs, iid, name))]


def _dry_run(kwargs: dict, iid: str = "startend:end_checker"):
    def plant(root: Path, synth: Path) -> list[str]:
        path = prompt_file(root, kwargs, iid)
        return ["matrix", "--dry-run", "--prompts", str(path), "--results-dir", str(root / "results")]

    return plant


def _rescore_unchecked_record(root: Path, synth: Path) -> list[str]:
    """A run's prompts.jsonl that skipped the loaders (an older version wrote it, or a hand): scoring
    once crashed on it after every cell had run, on every rerun; now that prompt alone is unscored."""
    victims(root)
    run = run_copy(synth, root / "run")
    rows = layout.read_prompts(run)
    rows[0].update(instruction_id_list=["startend:end_checker"], kwargs=[{"end_phrase": 7}])
    rows[1].update(instruction_id_list=["keywords:existence"], kwargs=[{"keywords": "notalist"}])
    rows[2].update(instruction_id_list=["punctuation:no_comma"], kwargs=[{}])
    layout.write_prompts(run, rows)
    return ["report", "--rescore", str(run)]


TEXT = "end_phrase must be text, not 7"
# fmt: off
CASES_PROMPTS = [
    Case("show-end-phrase-number", _show({"end_phrase": 7}), 2,
         f"bad.jsonl line 2: field 'kwargs' item 0 (startend:end_checker): {TEXT}"),
    Case("show-postscript-number", _show({"postscript_marker": 1}, "detectable_content:postscript"), 2,
         "postscript_marker must be text, not 1"),
    Case("show-repeat-list", _show({"prompt_to_repeat": ["x"]}, "combination:repeat_prompt"), 2,
         "prompt_to_repeat must be text"),
    Case("show-keywords-not-a-list", _show({"keywords": "notalist"}, "keywords:existence"), 2,
         "keywords must be a list of texts, not 'notalist'"),
    Case("show-forbidden-numbers", _show({"forbidden_words": [1, 2]}, "keywords:forbidden_words"), 2,
         "forbidden_words must be a list of texts"),
    Case("show-count-text", _show({"relation": "at least", "num_words": "many"}, "length_constraints:number_words"), 2,
         "num_words must be a whole number, not 'many'"),
    Case("show-relation-number", _show({"relation": 1, "num_words": 5}, "length_constraints:number_words"), 2,
         "relation must be text, not 1"),
    Case("show-csv", _show({"end_phrase": 7}, name="bad.csv"), 2,
         f"bad.csv line 3: field 'kwargs' item 0 (startend:end_checker): {TEXT}"),
    Case("dry-run-end-phrase-number", _dry_run({"end_phrase": 7}), 2,
         f"line 2: field 'kwargs' item 0 (startend:end_checker): {TEXT}"),
    Case("dry-run-keywords-not-a-list", _dry_run({"keywords": "tea"}, "keywords:existence"), 2,
         "keywords must be a list of texts"),
    Case("dry-run-well-typed", _dry_run({"end_phrase": "끝"}), 0),
    Case("rescore-unchecked-record", _rescore_unchecked_record, 0),
]
# fmt: on


@pytest.mark.parametrize("case", CASES_PROMPTS, ids=lambda c: c.id)
def test_hostile_prompt_records(case: Case, synth: Path, tmp_path: Path):
    argv = case.plant(tmp_path, synth)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == case.code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
        assert not (tmp_path / "results").exists()  # refused before anything was planned or written
    assert snapshot(tmp_path) == before
    if case.id == "rescore-unchecked-record":
        report = (tmp_path / "run" / layout.REPORT_MD).read_text(encoding="utf-8").replace("\\_", "_")
        report = " ".join(report.split())  # the note, as Markdown escapes and wraps it
        assert "IFEval: 2 of 8 prompts not scored" in report, report
        assert "end_phrase must be text, not 7" in report and "keywords must be a list of texts" in report


# --- 2b. prompts longer than the model's context: refused before any engine starts ----------------------

CONTEXT = "context 8,192 of SmolLM2-135M-Instruct"  # the embedded model's max_position_embeddings


def _context_file(root: Path, long: bool = True) -> Path:
    """A prompt file whose prompt ``long`` does not fit the embedded model's context (``short`` does)."""
    victims(root)
    rows = [{"key": "short", "prompt": "Say hello."}]
    if long:
        rows.insert(0, {"key": "long", "prompt": "word " * 9000})
    path = root / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rendered_length(prompt: str) -> int:
    """The prompt's tokens as the run renders it: the default system prompt, the chat template."""
    from cascade_repro.plan.models import load_tokenizer, resolve_model
    from cascade_repro.prompts.chat import render
    from cascade_repro.prompts.promptsets import load_system_prompt

    tok = load_tokenizer(resolve_model("embedded")[0])
    return len(render(tok, load_system_prompt(MatrixSpec().system_prompt), prompt))


@dataclass
class ContextCase:
    id: str
    argv: Callable[[Path], list[str]]
    code: int
    says: str = ""  # "{n}" stands for the long prompt's rendered length, as the message writes it


# fmt: off
CONTEXT_CASES = [
    ContextCase("dry-run-long-prompt", lambda r: ["matrix", "--dry-run", "--prompts", str(_context_file(r))], 2,
                f"error: prompt long: {{n}} tokens + --max-tokens {MatrixSpec().max_tokens} > {CONTEXT}"),
    ContextCase("matrix-long-prompt", lambda r: ["matrix", "--prompts", str(_context_file(r)),
                                                 "--results-dir", str(r / "results")], 2,
                f"error: prompt long: {{n}} tokens + --max-tokens {MatrixSpec().max_tokens} > {CONTEXT}"),
    ContextCase("show-long-prompt", lambda r: ["prompts", "show", str(_context_file(r))], 2,
                f"error: prompt long: {{n}} tokens leave no room to generate: {CONTEXT}"),
    ContextCase("dry-run-max-tokens", lambda r: ["matrix", "--dry-run", "--max-tokens", "100000"], 2,
                f"error: --max-tokens 100,000 leaves no room for a prompt: {CONTEXT}"),
    ContextCase("matrix-max-tokens", lambda r: ["matrix", "--max-tokens", "100000",
                                                "--results-dir", str(r / "results")], 2,
                f"error: --max-tokens 100,000 leaves no room for a prompt: {CONTEXT}"),
    ContextCase("dry-run-fits", lambda r: ["matrix", "--dry-run", "--prompts", str(_context_file(r, long=False)),
                                           "--max-tokens", "6000"], 0),  # 1,606 + 6,000 <= 8,192
]
# fmt: on


@pytest.mark.parametrize("case", CONTEXT_CASES, ids=lambda c: c.id)
def test_prompts_longer_than_the_context_are_refused_in_one_line(
    case: ContextCase, tmp_path: Path, request: pytest.FixtureRequest
):
    if not request.getfixturevalue("model_ready"):
        pytest.skip("the embedded model is not installed")  # the check needs the tokenizer on disk
    argv = case.argv(tmp_path)
    before = snapshot(tmp_path) if (tmp_path / "outside").exists() else None
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == case.code, res.output
    assert "Traceback" not in res.output
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        says = case.says.format(n=f"{_rendered_length('word ' * 9000):,}")
        assert lines == [lines[0]] and lines[0].startswith(says), res.stderr
        assert res.stdout == ""  # said before the plan's table
        assert not (tmp_path / "results").exists()  # before any engine, before the run directory
    if before is not None:
        assert snapshot(tmp_path) == before


def test_the_context_is_read_as_vllm_reads_it():
    from cascade_repro.vllm_surface import model_context

    assert model_context({"max_position_embeddings": 8192}) == 8192
    assert model_context({"max_position_embeddings": 4096, "n_positions": 2048}) == 2048  # the smallest
    assert model_context({"n_ctx": 1024}) is None  # no key vLLM reads: unknown, never a guess
    assert model_context({"max_position_embeddings": True}) is None
    nested = {"text_config": {"max_position_embeddings": 131072}, "max_position_embeddings": 8}
    assert model_context(nested) == 131072  # a multimodal config: its language model's
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert model_context({"max_position_embeddings": 32768, "rope_scaling": yarn}) == 131072
    llama3 = {"rope_type": "llama3", "factor": 8.0}  # its config gives the extended length already
    assert model_context({"max_position_embeddings": 131072, "rope_scaling": llama3}) == 131072
    linear = {"rope_type": "linear", "factor": 2.0}
    assert model_context({"max_position_embeddings": 2048, "rope_parameters": linear}) == 4096


def test_the_context_check_names_the_longest_prompt_over():
    from cascade_repro.errors import UsageError
    from cascade_repro.prompts.chat import check_context

    rendered = [[0] * 100, [0] * 300, [0] * 250, [0] * 10]
    keys = ["a", "b", "c", "d"]
    check_context(rendered, keys, 100, 400, "context 400 of M")  # 300 + 100 fits exactly
    with pytest.raises(UsageError) as e:
        check_context(rendered, keys, 101, 400, "context 400 of M")
    assert str(e.value) == "prompt b: 300 tokens + --max-tokens 101 > context 400 of M"
    with pytest.raises(UsageError) as e:
        check_context(rendered, keys, 200, 400, "context 400 of M")
    assert str(e.value) == "prompt b: 300 tokens + --max-tokens 200 > context 400 of M (and 1 more)"
    with pytest.raises(UsageError) as e:
        check_context(rendered, keys, 400, 400, "--max-model-len 400")
    assert str(e.value) == "--max-tokens 400 leaves no room for a prompt: --max-model-len 400"
    check_context(rendered, keys, 0, 301, "context 301 of M")  # room for one generated token
    with pytest.raises(UsageError) as e:
        check_context(rendered, keys, 0, 300, "context 300 of M")
    assert str(e.value) == "prompt b: 300 tokens leave no room to generate: context 300 of M"


def test_every_verifier_kwarg_has_a_type_the_loaders_check():
    """The types come from the verifiers' own signatures: each kwarg is text, a whole number or a
    list of texts, a value of another type is refused, and one that reaches scoring is unscored."""
    import inspect

    from cascade_repro.judge.ifeval.score import score_response
    from cascade_repro.judge.ifeval.verifiers import VERIFIERS, kwargs_problem, kwargs_type_problem

    wrong = {"str": [7, 2.5, True, ["x"], {"a": 1}], "int": ["many", 2.5, True, [3], {"n": 3}],
             "list[str]": ["notalist", 7, [1, 2], ["ok", None], {"a": "b"}]}  # fmt: skip
    right = {"str": "at least", "int": 3, "list[str]": ["차", "tea"]}
    for iid, fn in VERIFIERS.items():
        params = list(inspect.signature(fn).parameters.values())[1:]
        for p in params:
            assert p.annotation in wrong, (
                f"{iid}: {p.name} is typed {p.annotation!r}: teach _of_type that type"
            )
            for value in wrong[p.annotation]:
                kw = {q.name: right[q.annotation] for q in params} | {p.name: value}
                problem = kwargs_type_problem(iid, kw)
                assert problem is not None and problem.startswith(f"{p.name} must be "), (iid, kw, problem)
                assert kwargs_problem(iid, kw) == problem
                scored = score_response(
                    {"instruction_id_list": [iid], "kwargs": [kw]}, "at least 3 words here 차"
                )
                assert scored["strict"] is None and problem in scored["per_instruction"][0]["error"]
            assert kwargs_type_problem(iid, {q.name: right[q.annotation] for q in params}) is None
    assert kwargs_type_problem("x:unknown", {"end_phrase": 7}) is None  # an unknown id is only noted


def test_scoring_survives_records_that_never_met_a_loader():
    from cascade_repro.judge.ifeval.score import score_response, unscorable

    hostile = [
        {"instruction_id_list": [["a"]], "kwargs": [{}]},  # an id that is not text
        {"instruction_id_list": "punctuation:no_comma"},  # not a list: no instructions
        {"instruction_id_list": ["startend:end_checker"], "kwargs": "notalist"},
        {
            "instruction_id_list": ["startend:end_checker"],
            "kwargs": [{"end_phrase": "x" * 10_000, "other": 1}],
        },
    ]
    for rec in hostile:
        score_response(rec, "답 x")
    assert score_response(hostile[3], "답 " + "x" * 10_000)["strict"] is True
    note = unscorable(hostile).note()
    assert note is not None and "no verifier for ['a']" in note and "\n" not in note


# --- 3. one error path: an unexpected error is one line and exit 70, Ctrl-C 130 ---------------------

# Runs the real console entry point in a fresh interpreter, with a fault planted where FAULT_AT says:
# inside a command (`prompts list` loading the sets) or outside every command's own handling (the
# app's --version callback, run while the command line is parsed).
FAULTY_CLI = """
import importlib.metadata, os, signal, sys, time
from cascade_repro.prompts import promptsets

signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's SIGINT starts ignored

def fault(*args, **kwargs):
    what = os.environ["FAULT"]
    if what == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C
        time.sleep(30)
    raise {"attr": AttributeError("'int' object has no attribute 'strip'"),
           "multiline": RuntimeError("first line\\nsecond line"),
           "interrupt": KeyboardInterrupt()}[what]

if os.environ["FAULT_AT"] == "command":
    promptsets.list_builtin_sets = fault
else:
    importlib.metadata.version = fault
from cascade_repro.cli import main
main()
"""


@dataclass
class Fault:
    id: str
    argv: list[str]
    env: dict[str, str]
    code: int
    says: str  # the one line of stderr; "Traceback" for the --debug rows (then the traceback, once)


INTERNAL = (
    "error: internal error: AttributeError: 'int' object has no attribute 'strip' (a bug in cascade-repro;"
)
CMD, VERSION = {"FAULT_AT": "command"}, {"FAULT_AT": "version"}
# fmt: off
FAULTS = [
    Fault("internal-error-in-a-command", ["prompts", "list"], {**CMD, "FAULT": "attr"}, 70, INTERNAL),
    Fault("internal-error-outside-a-command", ["--version"], {**VERSION, "FAULT": "attr"}, 70, INTERNAL),
    Fault("internal-error-message-on-one-line", ["prompts", "list"], {**CMD, "FAULT": "multiline"}, 70,
          "error: internal error: RuntimeError: first line second line"),
    Fault("debug-flag-shows-the-traceback", ["--debug", "prompts", "list"], {**CMD, "FAULT": "attr"}, 70,
          "Traceback"),
    Fault("debug-env-shows-the-traceback", ["prompts", "list"],
          {**CMD, "FAULT": "attr", "CASCADE_REPRO_DEBUG": "1"}, 70, "Traceback"),
    Fault("debug-env-0-is-off", ["prompts", "list"], {**CMD, "FAULT": "attr", "CASCADE_REPRO_DEBUG": "0"}, 70,
          INTERNAL),
    Fault("ctrl-c-in-a-command", ["prompts", "list"], {**CMD, "FAULT": "sigint"}, 130,
          "interrupted: finished cells are kept"),
    Fault("ctrl-c-outside-a-command", ["--version"], {**VERSION, "FAULT": "interrupt"}, 130, ""),
    Fault("usage-error-stays-2", ["prompts", "show", "missing.jsonl"], {**CMD, "FAULT": "attr"}, 2,
          "error: prompt file not found: missing.jsonl"),
]
# fmt: on


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.id)
def test_one_error_path(fault: Fault, tmp_path: Path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CASCADE_REPRO_DEBUG"} | fault.env | WIDE
    res = subprocess.run([sys.executable, "-c", FAULTY_CLI, *fault.argv], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert res.returncode == fault.code, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if fault.says == "Traceback":
        assert res.stderr.count("Traceback") == 1 and "During handling" not in res.stderr, res.stderr
        assert lines[-1] == "AttributeError: 'int' object has no attribute 'strip'"
        return
    assert "Traceback" not in res.stderr
    assert len(lines) <= 1 and (lines[0] if lines else "").startswith(fault.says), res.stderr


# --- 4. damaged sample lines: skipped and named on scoring, rerun on resume --------------------------


def _cut(raw: bytes, rec: dict) -> bytes:
    return raw[: len(raw) // 2] + b"\n"  # a line cut in half mid-file (a disk error, a bad copy)


def _with(**fields: object) -> Callable[[bytes, dict], bytes]:
    def how(raw: bytes, rec: dict) -> bytes:
        return json.dumps({**rec, **fields}, separators=(",", ":")).encode() + b"\n"

    return how


def damage_sample(run: Path, how: Callable[[bytes, dict], bytes]) -> tuple[Path, int, str]:
    """Rewrite the middle sample line of the run's first samples file with ``how``: (file, its 1-based
    line number, the cell it belongs to)."""
    path = samples_file(run)
    lines = path.read_bytes().splitlines(keepends=True)
    idx = [i for i, ln in enumerate(lines) if codec.is_sample_line(ln)]
    i = idx[len(idx) // 2]
    rec = json.loads(lines[i])
    lines[i] = how(lines[i], rec)
    path.write_bytes(b"".join(lines))
    return path, i + 1, rec["cell_id"]


@dataclass
class Damage:
    id: str
    how: Callable[[bytes, dict], bytes]
    why: str  # what the warning says is wrong with the line


# fmt: off
DAMAGES = [
    Damage("cut-in-half", _cut, "not JSON"),
    Damage("token-ids-text", _with(token_ids="1,2,3"), "token_ids is not a list of whole numbers"),
    Damage("token-ids-floats", _with(token_ids=[1.5, 2]), "token_ids is not a list of whole numbers"),
    Damage("prompt-index-out-of-range", _with(prompt_index=99), "prompt_index 99 names no prompt (this run has 8)"),
    Damage("prompt-index-text", _with(prompt_index="3"), "prompt_index '3' names no prompt (this run has 8)"),
    Damage("from-another-run", _with(prompt_key="someone-else"),
           "prompt_key 'someone-else' is not prompt"),
    Damage("hash-of-another-run", _with(prompt_hash="0123456789abcdef"),
           "prompt_hash '0123456789abcdef' is not prompt"),
]
# fmt: on


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.id)
def test_a_damaged_sample_line_is_skipped_and_named(damage: Damage, synth: Path, tmp_path: Path):
    import pandas as pd

    run = run_copy(synth, tmp_path / "run")
    path, line, cid = damage_sample(run, damage.how)
    where = f"samples/{path.name} line {line}: "
    # Without --allow-loss the rescore keeps the old tables (section 7); with it the cell is an error.
    res = CliRunner().invoke(app, ["report", "--rescore", "--allow-loss", str(run)], env=WIDE)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    # The run's own --fail-on is regression: the damaged cell is an error the headline counts, not exit 1.
    assert res.exit_code == 0, res.output
    assert "1 error" in res.output
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {where}{damage.why}"), res.stderr
    assert warned[0].endswith("; skipped")
    # Nothing lost: every planned cell has its row; only the damaged one is an error, naming the line.
    cells = pd.read_parquet(run / layout.CELLS).set_index("cell_id")
    planned = [c.cell_id for c in manifest.read_manifest(run).plan.cells]
    assert sorted(cells.index) == sorted(planned)
    assert cells.loc[cid, "status"] == "error"
    assert f"record in samples/{path.name} at line {line}" in cells.loc[cid, "error"]
    assert (cells.drop(cid)["status"] == "done").all()
    assert f"samples/{path.name} at line {line}" in (run / layout.REPORT_MD).read_text(encoding="utf-8")
    # Re-rendering the scored run reads the samples again (the examples): no crash either.
    again = CliRunner().invoke(app, ["report", str(run)], env=WIDE)
    assert again.exit_code == 0 and "Traceback" not in again.output, again.output


def fake_matrix(results: Path, *args: str) -> list[str]:
    """A small matrix of the fake engine into ``results/r``."""
    return ["matrix", "--engine", "fake", *args, "--no-auto-controls", "--reference", "off", "--results-dir",
            str(results), "--run-id", "r"]  # fmt: skip


@dataclass
class FinishedRun:
    """A fake-engine run made once for the rows below, which each damage a copy and run again."""

    args: list[str]
    run: Path
    exit_code: int
    output: str

    def copy(self, tmp_path: Path) -> tuple[list[str], Path]:
        """The matrix's arguments for ``tmp_path/results`` and the copy of the run they resume."""
        run = Path(shutil.copytree(self.run, tmp_path / "results" / "r", symlinks=True))
        return fake_matrix(tmp_path / "results", *self.args), run


def finished_run(tmp_path_factory: pytest.TempPathFactory, *args: str) -> FinishedRun:
    results = tmp_path_factory.mktemp("finished") / "results"
    first = CliRunner().invoke(app, fake_matrix(results, *args), env=WIDE)
    assert first.exception is None or isinstance(first.exception, SystemExit), first.exception
    return FinishedRun(list(args), results / "r", first.exit_code, first.output)


@pytest.fixture(scope="module")
def batch1_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    return finished_run(tmp_path_factory, "--limit", "2", "--batch", "1", "--max-tokens", "2")


@pytest.mark.parametrize("damage", [DAMAGES[0], DAMAGES[1], DAMAGES[-1]], ids=lambda d: d.id)
def test_resume_reruns_the_cell_of_a_damaged_sample_line(
    damage: Damage, batch1_run: FinishedRun, tmp_path: Path
):
    from collections import Counter

    import pandas as pd

    # Exit 4: at batch 1 cascade never fires (nothing exercised), the exit code of a finished run.
    assert batch1_run.exit_code == 4, batch1_run.output
    argv, run = batch1_run.copy(tmp_path)
    path, line, cid = damage_sample(run, damage.how)
    mine = b'"cell_id":"%s"' % cid.encode()
    before = [ln for ln in path.read_bytes().splitlines(keepends=True) if mine not in ln]
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == 4, res.output  # finished again (3 would be "not finished")
    assert "Traceback" not in res.output
    said = [ln for ln in res.output.splitlines() if ln.startswith("warning:")]
    assert len(said) == 1 and said[0].startswith(f"warning: {cid}: "), res.output
    assert f"record in samples/{path.name} at line {line}" in said[0] and "counts as unfinished" in said[0]
    assert "resuming r: 1 of 2 cells already done, running the other 1" in res.output
    # Every cell in the tables, all done; the damaged cell ran again, the other was kept as it was.
    cells = pd.read_parquet(run / layout.CELLS).set_index("cell_id")
    assert sorted(cells.index) == sorted(c.cell_id for c in manifest.read_manifest(run).plan.cells)
    assert (cells["status"] == "done").all(), cells["status"]
    recs = []
    for ln in path.read_bytes().splitlines():
        try:
            recs.append(json.loads(ln))
        except ValueError:
            assert damage.id == "cut-in-half"  # the damaged line stays where it was, unread
    starts = Counter(r["cell_id"] for r in recs if r.get("type") == "cell_start")
    assert starts[cid] == 2 and all(n == 1 for c, n in starts.items() if c != cid), starts
    after = path.read_bytes().splitlines(keepends=True)
    assert all(ln in after for ln in before if b'"type":"engine"' not in ln)  # the other cell's lines kept
    assert sample_scan.read_progress(path, sample_scan.prompt_ids(run)).done == set(cells.index)


# Control records with a wrong type (found by tests/fuzz/atheris_rundir.py: a wave's ``wall_s`` as text
# crashed scoring, exit 70): a lost record, as a damaged sample line is. (field, bad JSON, the line)
CONTROL_DAMAGE = [
    ("wall_s", '"x"', "wave record: 'wall_s' is text, not a number"),
    ("tokens", "[1]", "wave record: 'tokens' is a list, not a whole number"),
    ("n_samples", "true", "cell_done record: 'n_samples' is true or false, not a whole number"),
    ("effective", "7", "engine record: 'effective' is a whole number, not an object"),
]


@pytest.fixture(scope="module")
def batch8_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    return finished_run(tmp_path_factory, "--limit", "2", "--batch", "8", "--max-tokens", "4")


@pytest.mark.parametrize(("name", "bad", "says"), CONTROL_DAMAGE, ids=[c[0] for c in CONTROL_DAMAGE])
def test_a_control_record_of_the_wrong_type_is_a_lost_record(
    name: str, bad: str, says: str, batch8_run: FinishedRun, tmp_path: Path
):
    import pandas as pd

    first = batch8_run
    assert first.exit_code in (0, 5), first.output
    argv, run = first.copy(tmp_path)
    path = samples_file(run)
    key = f'"{name}":'.encode()
    assert key in path.read_bytes()
    # The field's value becomes ``bad`` in every record that has it; the old value moves to a key no
    # reader knows, so the line stays JSON.
    path.write_bytes(path.read_bytes().replace(key, key + bad.encode() + b',"_":'))
    res = CliRunner().invoke(app, ["report", "--rescore", str(run)], env=WIDE)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert says in res.stderr and res.stderr.count("\n") == 1, res.stderr
    # Resume: every cell that lost a record runs again and the run ends whole.
    again = CliRunner().invoke(app, argv, env=WIDE)
    assert again.exit_code == first.exit_code and "Traceback" not in again.output, again.output
    cells = pd.read_parquet(run / layout.CELLS)
    assert (cells["status"] == "done").all(), cells[["cell_id", "status", "error"]]


# --- 5. rich markup in paths: printed as is, never parsed --------------------------------------------

# "[/x]" closes a tag nobody opened (rich raised MarkupError after the reports were written);
# "[bold red]" was taken as a style and vanished from the printed path.
BRACKETS = "a[/x] [bold red]b"


def _report_brackets(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    run = run_copy(synth, root / BRACKETS / "run")
    return ["report", str(run)], [f"wrote {run / layout.REPORT_MD}"]


def _rescore_brackets(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    run = run_copy(synth, root / BRACKETS / "run")
    return ["report", "--rescore", str(run)], [f"wrote {run / layout.JUNIT_XML}"]


def _merge_brackets(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    s1, s2 = shards(root, synth)
    out = root / BRACKETS / "merged"
    return ["merge", str(out), str(s1), str(s2)], [f"report: {out / layout.REPORT_MD}"]


def _matrix_brackets(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    results = root / BRACKETS
    argv = [*MATRIX, "--reference", "off", "--results-dir", str(results), "--run-id", "r"]
    return argv, [f"report: {results / 'r' / layout.REPORT_MD}"]


# fmt: off
MARKUP = [
    Case("report-brackets-in-path", _report_brackets, 0),
    Case("rescore-brackets-in-path", _rescore_brackets, 0),
    Case("merge-brackets-in-path", _merge_brackets, 0),
    Case("matrix-brackets-in-path", _matrix_brackets, 4),  # 4: batch 1, nothing exercised
]
# fmt: on


@pytest.mark.parametrize("case", MARKUP, ids=lambda c: c.id)
def test_markup_in_paths_is_printed_as_is(
    case: Case, synth: Path, tmp_path: Path, request: pytest.FixtureRequest
):
    if case.needs_model and not request.getfixturevalue("model_ready"):
        pytest.skip("the embedded model is not installed")
    argv, shows = case.plant(tmp_path, synth)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert "Traceback" not in res.output and "MarkupError" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == case.code, res.output
    lines = res.output.splitlines()
    for line in shows:
        assert line in lines or any(ln.startswith(line) for ln in lines), res.output  # the whole path


# --- 6. terminal escape sequences in prompt data: never reach the terminal ---------------------------

OSC_TITLE, OSC_CLIPBOARD, CSI_CLEAR = "\x1b]0;pwned\x07", "\x1b]52;c;ZXZpbA==\x07", "\x1b[2J"
RAW = ("\x1b", "\x07", "\x9b", "\x9d")  # ESC, BEL, and the 8-bit CSI and OSC


def _escapes_file(root: Path, name: str) -> Path:
    rows = [
        {"key": f"k{OSC_TITLE}1", "prompt": f"first{OSC_CLIPBOARD} part{CSI_CLEAR} end\x9b2J", "lang": "en"},
        {"key": "k2", "prompt": "second [bold red]prompt[/x]", "lang": f"ko{CSI_CLEAR}",
         f"col{CSI_CLEAR}": "x"},
    ]  # fmt: skip
    path = root / name
    if name.endswith(".csv"):
        import csv

        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["key", "prompt", "lang", f"col{CSI_CLEAR}"])
            w.writeheader()
            w.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _show_escapes(name: str):
    def plant(root: Path, synth: Path) -> tuple[list[str], list[str]]:
        path = _escapes_file(root, name)
        # What is left of each text once its control characters are dropped: all of it is shown.
        return ["prompts", "show", "--limit", "5", str(path)], [
            "k]0;pwned1", "first]52;c;ZXZpbA== part[2J end2J", "second [bold red]prompt[/x]", "ko[2J", "col[2J",
        ]  # fmt: skip

    return plant


def _missing_file_escapes(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    return ["prompts", "show", str(root / f"no{OSC_TITLE}such.jsonl")], []


def _duplicate_key_escapes(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    path = root / "dup.jsonl"
    row = json.dumps({"key": f"k{OSC_CLIPBOARD}", "prompt": "p"})
    path.write_text(row + "\n" + row + "\n", encoding="utf-8")
    return ["prompts", "show", str(path)], []


def _dry_run_escapes(root: Path, synth: Path) -> tuple[list[str], list[str]]:
    path = root / f"p{CSI_CLEAR}.jsonl"
    path.write_text(json.dumps({"key": "a", "prompt": ""}) + "\n", encoding="utf-8")  # an empty prompt
    return ["matrix", "--dry-run", "--prompts", str(path), "--results-dir", str(root / "results")], []


# fmt: off
ESCAPES = [
    Case("show-jsonl-escapes", _show_escapes("esc.jsonl"), 0),
    Case("show-csv-escapes", _show_escapes("esc.csv"), 0),
    Case("show-missing-file-name-escapes", _missing_file_escapes, 2, "prompt file not found: "),
    Case("show-duplicate-key-escapes", _duplicate_key_escapes, 2, "duplicate key"),
    Case("dry-run-file-name-escapes", _dry_run_escapes, 2, "p[2J.jsonl"),
]
# fmt: on


@pytest.mark.parametrize("case", ESCAPES, ids=lambda c: c.id)
def test_escape_sequences_in_prompt_data_never_reach_the_terminal(case: Case, synth: Path, tmp_path: Path):
    argv, shows = case.plant(tmp_path, synth)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == case.code, res.output
    assert not any(c in res.output for c in RAW), repr(res.output)
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
    flat = " ".join(res.output.split())  # the table may wrap a long prompt: compare its words
    for text in shows:
        assert text in flat, (text, res.output)


# --- 7. damaged run.json, rescore that would lose data, samples checked against prompts.jsonl ------
# Each row damages a copy of the scored synthetic run and rescores it (or reports it): the refusal
# is one line, exit 2, and run.json, prompts.jsonl, the samples and the tables keep their bytes.


def _run_json(content: bytes | None, command: str = "rescore"):
    def plant(root: Path, synth: Path) -> list[str]:
        victims(root)
        run = run_copy(synth, root / "run")
        if content is None:
            (run / layout.RUN_JSON).unlink()
        else:
            (run / layout.RUN_JSON).write_bytes(content)
        return ["report", "--rescore", str(run)] if command == "rescore" else ["report", str(run)]

    return plant


def _edited_run_json(edit: Callable[[dict], object], command: str = "rescore"):
    def plant(root: Path, synth: Path) -> list[str]:
        data = json.loads((synth / layout.RUN_JSON).read_bytes())
        data = edit(data)
        return _run_json(json.dumps(data).encode(), command)(root, synth)

    return plant


def _without(key: str):
    return lambda d: {k: v for k, v in d.items() if k != key}


def _set(path: str, value: object):
    def edit(d: dict) -> dict:
        *head, last = path.split(".")
        node = d
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
        return d

    return edit


def _samples_missing(root: Path, synth: Path) -> list[str]:
    victims(root)
    run = run_copy(synth, root / "run")
    samples_file(run).unlink()
    return ["report", "--rescore", str(run)]


def _samples_cut_at_a_line(root: Path, synth: Path) -> list[str]:
    """Whole lines lost at the end (a copy cut short): the cells they finished would be pending."""
    victims(root)
    run = run_copy(synth, root / "run")
    path = samples_file(run)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[: len(lines) // 2]))
    return ["report", "--rescore", str(run)]


def _prompts(how: Callable[[Path], None]):
    def plant(root: Path, synth: Path) -> list[str]:
        victims(root)
        run = run_copy(synth, root / "run")
        how(layout.prompts_path(run))
        return ["report", "--rescore", str(run)]

    return plant


def _bad_line(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][: len(lines[3]) // 2] + b"\n"
    path.write_bytes(b"".join(lines))


def _not_a_record(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b'{"key": "ko-00003"}\n'  # JSON, but no prompt: the loader refuses the file
    path.write_bytes(b"".join(lines))


def _damaged_sample(how: Callable[[bytes, dict], bytes]):
    def plant(root: Path, synth: Path) -> list[str]:
        victims(root)
        run = run_copy(synth, root / "run")
        damage_sample(run, how)
        return ["report", "--rescore", str(run)]

    return plant


def _other_run_samples(root: Path, synth: Path) -> list[str]:
    """Every sample of one file from another run of the same prompt keys: its prompts rendered
    otherwise (another system prompt, another tokenizer), so every hash differs."""

    def other(raw: bytes) -> bytes:
        if not codec.is_sample_line(raw):
            return raw
        rec = json.loads(raw)
        rec["prompt_hash"] = "f" * 16
        return json.dumps(rec, separators=(",", ":")).encode() + b"\n"

    victims(root)
    run = run_copy(synth, root / "run")
    path = samples_file(run)
    path.write_bytes(b"".join(other(ln) for ln in path.read_bytes().splitlines(keepends=True)))
    return ["report", "--rescore", str(run)]


RUN_JSON = "run.json: "
KEPT = "the old tables and reports are kept (--allow-loss writes the new ones)"
LOST = "cell(s) finished in the old tables would not be"
# fmt: off
CASES_RESCORE = [
    Case("run-json-random-bytes", _run_json(bytes(range(256)) * 4), 2, f"{RUN_JSON}corrupt JSON"),
    Case("run-json-cut", _run_json(b'{"plan": {"cells": ['), 2, f"{RUN_JSON}corrupt JSON at line 1"),
    Case("run-json-list", _run_json(b"[]"), 2, f"{RUN_JSON}not a JSON object but a list"),
    Case("run-json-null", _run_json(b"null"), 2, f"{RUN_JSON}not a JSON object but null"),
    Case("run-json-null-report", _run_json(b"null", "report"), 2, f"{RUN_JSON}not a JSON object but null"),
    Case("run-json-no-plan", _edited_run_json(_without("plan")), 2, f"{RUN_JSON}no 'plan' section"),
    Case("run-json-plan-list", _edited_run_json(_set("plan", [])), 2, "'plan' is a list, not an object"),
    Case("run-json-plan-text", _edited_run_json(_set("plan", "x"), "report"), 2, "'plan' is text, not an object"),
    Case("run-json-cells-object", _edited_run_json(_set("plan.cells", {})), 2,
         "'plan.cells' is an object, not a list"),
    Case("run-json-cell-batch-text", _edited_run_json(_set("plan.cells.0.batch", "8")), 2,
         "'plan.cells[0].batch' is text, not a whole number"),
    Case("run-json-engines-list", _edited_run_json(_set("engines", [])), 2, "'engines' is a list, not an object"),
    Case("run-json-invocations-object", _edited_run_json(_set("invocations", {})), 2,
         "'invocations' is an object, not a list"),
    Case("run-json-thresholds-list", _edited_run_json(_set("thresholds", [1])), 2,
         "'thresholds' is a list, not an object"),
    Case("run-json-thresholds-unknown-knob", _edited_run_json(_set("thresholds.bogus", 1)), 2,
         "run.json's thresholds hold an unknown knob 'bogus'"),
    Case("run-json-thresholds-alpha-text", _edited_run_json(_set("thresholds.alpha", "x")), 2,
         "run.json's thresholds: --alpha must be in (0, 1), got 'x'"),
    Case("run-json-spec-null", _edited_run_json(_set("spec", None)), 2, "'spec' is null, not an object"),
    Case("run-json-prompt-set-number", _edited_run_json(_set("prompt_set", 3)), 2,
         "'prompt_set' is a whole number, not an object"),
    Case("run-json-missing", _run_json(None), 2, "not a cascade-repro run directory"),
    Case("rescore-samples-missing", _samples_missing, 2, f"{LOST}: samples/"),
    Case("rescore-samples-cut-at-a-line", _samples_cut_at_a_line, 2, LOST),
    Case("rescore-prompts-missing", _prompts(lambda p: p.unlink()), 2,
         "prompts.jsonl is missing, so every IFEval score and each sample's check against its prompt"),
    Case("rescore-prompts-bad-line", _prompts(_bad_line), 2, "prompts.jsonl line 4 is not JSON, so every IFEval"),
    Case("rescore-prompts-not-a-record", _prompts(_not_a_record), 2, "so every IFEval score would be dropped"),
    Case("rescore-sample-of-another-run", _other_run_samples, 2,
         "prompt_hash 'ffffffffffffffff' is not prompt 0's hash"),
    Case("rescore-sample-hash-mismatch", _damaged_sample(_with(prompt_hash="0123456789abcdef")), 2,
         "prompt_hash '0123456789abcdef' is not prompt"),
    Case("rescore-sample-key-mismatch", _damaged_sample(_with(prompt_key="someone-else")), 2,
         "prompt_key 'someone-else' is not prompt"),
    Case("rescore-token-ids-text", _damaged_sample(_with(token_ids="abc")), 2,
         "token_ids is not a list of whole numbers"),
    Case("rescore-prompt-index-999", _damaged_sample(_with(prompt_index=999)), 2,
         "prompt_index 999 names no prompt (this run has 8)"),
    Case("rescore-clean", _prompts(lambda p: None), 0),
]
# fmt: on


def run_bytes(run: Path) -> dict[str, bytes]:
    """Every file of a run directory, by name: what a refused command must leave as it was."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES_RESCORE, ids=lambda c: c.id)
def test_rescore_validates_before_it_writes(case: Case, synth: Path, tmp_path: Path):
    argv = case.plant(tmp_path, synth)
    run = tmp_path / "run"
    before, files = snapshot(tmp_path), run_bytes(run)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == case.code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert snapshot(tmp_path) == before
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
        if case.id.startswith("rescore-"):
            assert lines[0].endswith(KEPT), lines[0]
        # Nothing written: not run.json (no "rescore" invocation), not a table, not a report, no lock.
        assert run_bytes(run) == files
    else:
        assert manifest.read_manifest(run).invocations[-1].kind == "rescore"


def test_allow_loss_writes_what_the_samples_hold(synth: Path, tmp_path: Path):
    """--allow-loss: the user means it (the samples were removed on purpose): the cells go pending."""
    import pandas as pd

    argv = _samples_missing(tmp_path, synth)
    res = CliRunner().invoke(app, [*argv[:2], "--allow-loss", argv[2]], env=WIDE)
    assert res.exit_code == 5, res.output  # not finished
    cells = pd.read_parquet(tmp_path / "run" / layout.CELLS)
    gone = cells[cells["engine_key"] == samples_file(synth).stem]
    assert len(gone) and (gone["status"] == "pending").all()
    assert (cells.drop(gone.index)["status"] == "done").all()


def test_prompts_jsonl_holds_each_prompts_hash_and_the_loader_leaves_it_out(synth: Path):
    """A run's prompts.jsonl read back as a prompt file: the hash is the run's, not an extra column."""
    from cascade_repro.prompts.promptsets import RUN_FIELDS, iter_prompt_records

    assert layout.PROMPT_HASH in RUN_FIELDS
    ids = sample_scan.prompt_ids(synth)
    assert ids is not None and len(ids) == 8 and all(isinstance(h, str) and len(h) == 16 for h in ids.hashes)
    records = list(iter_prompt_records(layout.prompts_path(synth)))
    assert [r.key for r in records] == ids.keys and all(r.extra == {} for r in records)


def test_an_old_run_without_hashes_checks_keys_only(synth: Path, tmp_path: Path):
    run = run_copy(synth, tmp_path / "run")
    rows = layout.read_prompts(run)
    layout.write_prompts(run, [{k: v for k, v in r.items() if k != layout.PROMPT_HASH} for r in rows])
    ids = sample_scan.prompt_ids(run)
    assert ids is not None and ids.hashes == [None] * 8
    rec = {"cell_id": "c", "prompt_index": 1, "token_ids": [1], "prompt_key": ids.keys[1], "prompt_hash": "x"}
    assert sample_scan.sample_problem(rec, ids) is None
    assert "prompt_key 'y'" in sample_scan.sample_problem({**rec, "prompt_key": "y"}, ids)
    with_hash = sample_scan.prompt_ids(synth)
    assert "prompt_hash 'x' is not prompt 1's hash" in sample_scan.sample_problem(rec, with_hash)
    assert "prompt_hash None" in sample_scan.sample_problem(
        {k: v for k, v in rec.items() if k != "prompt_hash"}, with_hash
    )


def test_every_run_json_this_repository_holds_passes_the_check():
    """The check refuses damage, not a file some version of this tool wrote: the evidence runs pass."""
    from cascade_repro.rundir.manifest import manifest_problem

    root = Path(__file__).resolve().parents[1]
    found = sorted(root.glob("docs/evidence/**/run.json"))
    assert found
    for path in found:
        assert manifest_problem(json.loads(path.read_bytes())) is None, path


def test_a_worker_whose_tokenizer_renders_otherwise_refuses_to_generate(synth: Path):
    """Its samples would fail the check against prompts.jsonl and its cells rerun on every resume."""
    from cascade_repro.errors import UsageError
    from cascade_repro.run.worker import check_hashes

    ids = sample_scan.prompt_ids(synth)
    assert ids is not None
    check_hashes(synth, [h or "" for h in ids.hashes])
    with pytest.raises(UsageError, match=r"^prompt 3 renders as 0{16} under this engine's tokenizer"):
        check_hashes(synth, [h if i != 3 else "0" * 16 for i, h in enumerate(ids.hashes)])


# --- 8. a leading `~` in a path: expanded as a shell would, once, before any I/O -------------------
# `--results-dir '~'` once wrote samples and tables under ./~ while pandas, which expands `~` itself,
# read the tables back from $HOME: a clean run scored another run's tables. Each row runs in
# ``tmp_path`` (the current folder) with HOME at ``tmp_path/home``: what it writes lands under HOME,
# and no folder named `~` appears.


def _tilde_results(value: str, where: str = "flag"):
    def plant(root: Path, synth: Path) -> tuple[list[str], dict[str, str], Path]:
        argv = [*MATRIX, "--reference", "off", "--run-id", "r"]
        env: dict[str, str] = {}
        if where == "flag":
            argv += ["--results-dir", value]
        elif where == "env":
            env["CASCADE_REPRO_RESULTS_DIR"] = value
        else:  # the config file's key
            (root / "m.toml").write_text(f'results_dir = "{value}"\n', encoding="utf-8")
            argv += ["--config", "m.toml"]
        return argv, env, Path(value.replace("~", str(root / "home"), 1)) / "r"

    return plant


def _tilde_report(root: Path, synth: Path) -> tuple[list[str], dict[str, str], Path]:
    run_copy(synth, root / "home" / "run")
    return ["report", "~/run"], {}, root / "home" / "run"


def _tilde_merge(root: Path, synth: Path) -> tuple[list[str], dict[str, str], Path]:
    home = root / "home"
    shards(home, synth)
    return ["merge", "~/merged", "~/shard1", "~/shard2"], {}, home / "merged"


def _tilde_prompts(root: Path, synth: Path) -> tuple[list[str], dict[str, str], Path]:
    (root / "home" / "p.jsonl").write_text(json.dumps({"key": "a", "prompt": "hi"}) + "\n", encoding="utf-8")
    argv = [*MATRIX, "--reference", "off", "--prompts", "~/p.jsonl", "--results-dir", "out", "--run-id", "r"]
    return argv, {}, root / "out" / "r"


def _tilde_no_user(root: Path, synth: Path) -> tuple[list[str], dict[str, str], Path]:
    return ["report", "~no-such-user-41/run"], {}, root / "none"


# fmt: off
TILDE = [
    Case("results-dir-tilde-alone", _tilde_results("~"), 4),  # 4: batch 1, nothing exercised
    Case("results-dir-tilde-folder", _tilde_results("~/cr-results"), 4),
    Case("results-dir-tilde-in-config", _tilde_results("~/cr-results", "config"), 4),
    Case("results-dir-tilde-in-env", _tilde_results("~/cr-results", "env"), 4),
    Case("report-tilde-run-dir", _tilde_report, 0),
    Case("merge-tilde-dirs", _tilde_merge, 0),
    Case("prompts-tilde-file", _tilde_prompts, 4),
    Case("tilde-unknown-user", _tilde_no_user, 2, "~no-such-user-41 names no user on this machine"),
]
# fmt: on


@pytest.mark.parametrize("case", TILDE, ids=lambda c: c.id)
def test_a_leading_tilde_is_expanded_once_everywhere(
    case: Case, synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CASCADE_REPRO_RESULTS_DIR")  # the config file's key counts only without it
    argv, env, written = case.plant(tmp_path, synth)
    res = CliRunner().invoke(app, argv, env={**WIDE, "HOME": str(tmp_path / "home"), **env})
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == case.code, res.output
    assert not list(tmp_path.rglob("~*")), list(tmp_path.rglob("~*"))  # no folder named `~`
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert lines == [lines[0]] and lines[0].startswith("error: ") and case.says in lines[0], res.stderr
        return
    assert (written / layout.RUN_JSON).is_file() and (written / layout.CELLS).is_file()
    assert (written / layout.REPORT_MD).is_file()


# --- 9. another writer holds the run's lock: nothing is deleted before the lock is ours -------------
# A merge cleared its output before it took the lock: beside a merge or a `report` writing there, the
# refused merge had already deleted samples/ and prompts.jsonl of the run the other one was writing.


def _merged_before(root: Path, synth: Path) -> Path:
    s1, s2 = shards(root, synth)
    out = root / "merged"
    assert CliRunner().invoke(app, ["merge", str(out), str(s1), str(s2)], env=WIDE).exit_code == 0
    return out


def _merge_into_a_locked_merge(root: Path, synth: Path) -> tuple[list[str], Path]:
    out = _merged_before(root, synth)
    return ["merge", str(out), str(root / "shard1"), str(root / "shard2")], out


def _merge_into_a_locked_cut_merge(root: Path, synth: Path) -> tuple[list[str], Path]:
    """A merge cut short (its .merging marker left) is redone by the next merge: not while one runs."""
    out = _merged_before(root, synth)
    spec_hash = manifest.read_manifest(out).spec_hash
    (out / layout.MERGING).write_text(f"{spec_hash}\n", encoding="utf-8")
    return ["merge", str(out), str(root / "shard1"), str(root / "shard2")], out


def _matrix_fresh_into_a_locked_run(root: Path, synth: Path) -> tuple[list[str], Path]:
    run = run_copy(synth, root / "results" / "r")
    return [*MATRIX, "--results-dir", str(root / "results"), "--run-id", "r", "--fresh"], run


# fmt: off
LOCKED = [
    Case("merge-beside-a-running-merge", _merge_into_a_locked_merge, 2, "is in use by another cascade-repro run"),
    Case("merge-cut-beside-a-running-merge", _merge_into_a_locked_cut_merge, 2,
         "is in use by another cascade-repro run"),
    Case("matrix-fresh-beside-a-running-report", _matrix_fresh_into_a_locked_run, 2,
         "is in use by another cascade-repro run"),
]
# fmt: on


@pytest.mark.parametrize("case", LOCKED, ids=lambda c: c.id)
def test_nothing_is_deleted_before_the_lock_is_taken(case: Case, synth: Path, tmp_path: Path):
    argv, run = case.plant(tmp_path, synth)
    files = run_bytes(run)
    lock = runlock.RunLock(run)  # the other writer: a merge, a report, a matrix
    lock.acquire()
    try:
        res = CliRunner().invoke(app, argv, env=WIDE)
        assert run_bytes(run) == {**files, layout.LOCK: (run / layout.LOCK).read_bytes()}
    finally:
        lock.release()
    assert "Traceback" not in res.output
    assert res.exit_code == case.code, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: ") and case.says in lines[0], res.stderr


# --- 10. `matrix --run-id NAME` on a folder that is not a run ----------------------------------------
# It overwrote the folder's report.md, summary.json and cells.parquet, and --fresh deleted its samples/
# and minimize/: the user's own files. A folder without run.json is refused, as `merge` refuses one.


def _users_folder(root: Path) -> Path:
    mine = root / "results" / "mine"
    for name in ("report.md", "summary.json", "cells.parquet", "samples/notes.jsonl", "minimize/todo.txt"):
        (mine / name).parent.mkdir(parents=True, exist_ok=True)
        (mine / name).write_text(f"the user's own {name}\n", encoding="utf-8")
    return mine


def _matrix_into_users_folder(fresh: bool):
    def plant(root: Path, synth: Path) -> tuple[list[str], Path]:
        mine = _users_folder(root)
        return [
            *MATRIX,
            "--results-dir",
            str(root / "results"),
            "--run-id",
            "mine",
            *(["--fresh"] if fresh else []),
        ], mine

    return plant


def _matrix_into_an_empty_folder(root: Path, synth: Path) -> tuple[list[str], Path]:
    (root / "results" / "empty").mkdir(parents=True)
    return [
        *MATRIX,
        "--reference",
        "off",
        "--results-dir",
        str(root / "results"),
        "--run-id",
        "empty",
    ], root / "x"


NOT_A_RUN = "is not a cascade-repro run (no run.json) and holds cells.parquet, minimize and 3 more"
# fmt: off
NOT_RUNS = [
    Case("matrix-run-id-on-a-users-folder", _matrix_into_users_folder(False), 2, NOT_A_RUN),
    Case("matrix-fresh-on-a-users-folder", _matrix_into_users_folder(True), 2, NOT_A_RUN),
    Case("matrix-run-id-on-an-empty-folder", _matrix_into_an_empty_folder, 4),  # 4: nothing exercised
]
# fmt: on


@pytest.mark.parametrize("case", NOT_RUNS, ids=lambda c: c.id)
def test_a_folder_that_is_not_a_run_is_refused(case: Case, synth: Path, tmp_path: Path):
    argv, mine = case.plant(tmp_path, synth)
    files = run_bytes(mine) if mine.exists() else {}
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert "Traceback" not in res.output
    assert res.exit_code == case.code, res.output
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert lines == [lines[0]] and lines[0].startswith("error: ") and case.says in lines[0], res.stderr
        assert run_bytes(mine) == files and not (mine / layout.LOCK).exists()


# --- 11. run.json from a newer version: its unknown keys survive every rewrite, and one line says so --

FUTURE = {"future": {"x": 1}, "prompt_set.future": 2, "plan.future": 3, "plan.cells[0].future": 4}
NEWER = "note: this run was made by a newer cascade-repro (9.0.0, this is "


def _plant_future_keys(run: Path) -> None:
    data = json.loads((run / layout.RUN_JSON).read_bytes())
    data["tool_version"] = "9.0.0"
    data["future"] = FUTURE["future"]
    data["prompt_set"]["future"] = 2
    data["plan"]["future"] = 3
    data["plan"]["cells"][0]["future"] = 4
    next(iter(data["engines"].values()))["future"] = 5
    (run / layout.RUN_JSON).write_text(json.dumps(data), encoding="utf-8")


def _future_keys(run: Path) -> dict[str, object]:
    data = json.loads((run / layout.RUN_JSON).read_bytes())
    engine = next(iter(data["engines"].values()))
    return {"future": data.get("future"), "prompt_set.future": data["prompt_set"].get("future"),
            "plan.future": data["plan"].get("future"), "plan.cells[0].future": data["plan"]["cells"][0].get("future"),
            "engines.future": engine.get("future")}  # fmt: skip


@pytest.mark.parametrize("command", ["matrix", "report", "report --rescore"])
def test_a_newer_versions_keys_survive_and_are_noted(command: str, batch1_run: FinishedRun, tmp_path: Path):
    argv, run = batch1_run.copy(tmp_path)
    _plant_future_keys(run)
    if command != "matrix":
        argv = [*command.split(), str(run)]
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == 4, res.output  # batch 1: nothing exercised, as the run ended
    assert _future_keys(run) == {**FUTURE, "engines.future": 5}
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("note: this run")]
    assert len(notes) == 1 and notes[0].startswith(NEWER), res.stderr
    assert "kept as they are (future, prompt_set.future, plan.future and 2 more)" in notes[0], notes[0]


# --- 12. nothing hangs, nothing runs out of memory: links, FIFOs and devices before any read ------------
# Each row runs the command in a process of its own under a timeout: a hang fails the row (the
# timeout kills it) instead of hanging the suite.

HANG_TIMEOUT_S = 120


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    import sys

    try:
        return subprocess.run([sys.executable, "-m", "cascade_repro", *argv], capture_output=True, text=True,
                              cwd=cwd, env={**os.environ, **WIDE}, timeout=HANG_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {argv} did not end within {HANG_TIMEOUT_S} s")


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _planted_resume(what: str, plant: Callable[[Path], None], dry_run: bool):
    def argv(batch1: FinishedRun, root: Path) -> list[str]:
        args, run = batch1.copy(root)
        plant(samples_file(run) if what == "samples" else run / layout.PROMPTS)
        return [*args, "--dry-run"] if dry_run else args

    return argv


def _zero(path: Path) -> None:
    link(path, Path("/dev/zero"))


def _billion_laughs(root: Path) -> Path:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    path = root / "laughs.yaml"
    path.write_text("hf_overrides:\n" + "".join(f"  {ln}\n" for ln in lines), encoding="utf-8")
    return path


def _config_fifo(name: str):
    def argv(batch1: FinishedRun, root: Path) -> list[str]:
        os.mkfifo(root / name)
        return ["matrix", "--engine", "fake", "--dry-run", "--config", str(root / name)]

    return argv


@dataclass
class Hang:
    id: str
    argv: Callable[[FinishedRun, Path], list[str]]
    code: int
    says: str = ""


# fmt: off
HANGS = [
    Hang("dry-run-samples-linked-to-dev-zero", _planted_resume("samples", _zero, True), 2, "is a symbolic link"),
    Hang("dry-run-prompts-fifo", _planted_resume("prompts", _fifo, True), 2, "prompts.jsonl is neither a file nor a folder"),
    Hang("resume-samples-fifo", _planted_resume("samples", _fifo, False), 2, "is neither a file nor a folder"),
    Hang("resume-prompts-linked-to-dev-zero", _planted_resume("prompts", _zero, False), 2,
         f"prompts.jsonl {LINK}"),
    Hang("config-yaml-billion-laughs", lambda b, r: ["matrix", "--engine", "vllm", "--dry-run", "--config",
                                                     str(_billion_laughs(r))], 2,
         "laughs.yaml line 3: YAML alias *a refused"),
    Hang("config-dev-zero", lambda b, r: ["matrix", "--engine", "fake", "--dry-run", "--config", "/dev/zero"], 2,
         "config file /dev/zero is not a regular file (a device, a pipe or a socket)"),
    Hang("config-toml-fifo", _config_fifo("m.toml"), 2, "m.toml is not a regular file"),
    Hang("config-yaml-fifo", _config_fifo("m.yaml"), 2, "m.yaml is not a regular file"),
    Hang("dry-run-a-trillion-shards", lambda b, r: ["matrix", "--engine", "fake", "--limit", "2", "--dry-run",
                                                    "--shard", "1/1000000000000"], 0),
]
# fmt: on


@pytest.mark.parametrize("case", HANGS, ids=lambda c: c.id)
def test_nothing_hangs_or_runs_out_of_memory(case: Hang, batch1_run: FinishedRun, tmp_path: Path):
    victims(tmp_path)
    argv = case.argv(batch1_run, tmp_path)
    before = snapshot(tmp_path)
    res = run_cli(argv, tmp_path)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == case.code, res.stderr
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert lines == [lines[0]] and lines[0].startswith("error: ") and case.says in lines[0], res.stderr
        assert res.stdout == ""  # refused before the plan's table
    assert snapshot(tmp_path) == before


def test_a_merge_of_a_trillion_shards_walks_its_engine_keys_only(tmp_path: Path, synth: Path):
    from cascade_repro.run.merge import check_shards

    dirs = []
    for i in (1, 2):
        d = run_copy(synth, tmp_path / f"s{i}")
        run = manifest.read_run_json(d)
        run["shard"] = f"{i}/1000000000000"
        layout.write_json_atomic(d / layout.RUN_JSON, run)
        dirs.append(d)
    _, warnings = check_shards(dirs)
    assert warnings == [
        "999,999,999,998 shards after 2/1000000000000 are missing: they hold no engine key (the matrix has 2), "
        "so nothing is pending"
    ]


def test_a_large_dry_run_says_how_far_rendering_got(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from cascade_repro.cli import matrix_plan

    monkeypatch.setattr(matrix_plan, "PROGRESS_EVERY_S", 0.0)  # every prompt, instead of every 10 s
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"key": f"k{i}", "prompt": f"p{i}"}) + "\n" for i in range(3)), encoding="utf-8")
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--dry-run", "--prompts", str(path)], env=WIDE)
    assert res.exit_code == 0, res.output
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("rendering")]
    assert said == [f"rendering the prompts to plan: {i} of 3" for i in (1, 2, 3)], res.stderr


def test_a_dry_run_measures_what_a_run_measures_one_prompt_at_a_time():
    from cascade_repro.engines import get as engine_info
    from cascade_repro.prompts.chat import measure_lengths, measure_prefix

    tok = engine_info("fake").own_tokenizer()
    prompts = ["a", "a longer prompt", "같은 접두사 뒤의 질문", ""]
    for system in ("", "a shared system prompt " * 20):
        whole, streamed = measure_prefix(tok, system, prompts), measure_lengths(tok, system, prompts)
        assert streamed.lengths == [len(r) for r in whole.rendered] and streamed.tokens == whole.tokens


# --- 13. what rich would hide or rewrite: COLUMNS=0, emoji codes in user text --------------------------
# COLUMNS=0 once silenced every message, the exit codes staying 2, 1 or 69; rich turned ":smile:"
# in a results path, ":thumbs_up:" in a prompt and "tp=A:B" in a message into emoji.


def _emoji_prompts(root: Path) -> Path:
    path = root / "emoji.jsonl"
    path.write_text(json.dumps({"key": "a", "prompt": "I :thumbs_up: this"}) + "\n", encoding="utf-8")
    return path


@dataclass
class Shown:
    id: str
    argv: Callable[[Path], list[str]]
    env: dict[str, str]
    code: int
    says: str  # a text the command prints, on stdout or stderr


ZERO = {"COLUMNS": "0"}
# fmt: off
SHOWN = [
    Shown("columns-0-error", lambda r: ["matrix", "--bogus"], ZERO, 2, "error: no such option: --bogus"),
    Shown("columns-0-usage-error", lambda r: ["prompts", "show", str(r / "none.jsonl")], ZERO, 2,
          "error: prompt file not found"),
    Shown("columns-0-dry-run-table", lambda r: ["matrix", "--engine", "fake", "--limit", "2", "--dry-run"], ZERO, 0,
          "tp1-b8-cascade"),
    Shown("columns-0-prompts-list", lambda r: ["prompts", "list"], ZERO, 0, "prompt sets"),
    Shown("columns-0-env", lambda r: ["env"], ZERO, 0, "python"),
    Shown("columns-0-headline", lambda r: [*MATRIX, "--reference", "off", "--results-dir", str(r / "res"),
                                           "--run-id", "r"], ZERO, 4, "nothing exercised"),
    Shown("emoji-code-in-results-dir", lambda r: [*MATRIX, "--reference", "off", "--results-dir",
                                                  str(r / "runs" / ":smile:"), "--run-id", "r"], WIDE, 4,
          "runs/:smile:/r/report.md"),
    Shown("emoji-code-in-a-prompt", lambda r: ["prompts", "show", str(_emoji_prompts(r))], WIDE, 0,
          "I :thumbs_up: this"),
    Shown("emoji-code-in-a-message", lambda r: ["matrix", "--engine", "fake", "--twin", "tp=1:1", "--dry-run"], WIDE,
          2, "--twin tp=A:B: A < B"),
]
# fmt: on


@pytest.mark.parametrize("case", SHOWN, ids=lambda c: c.id)
def test_rich_neither_hides_nor_rewrites_a_message(case: Shown, tmp_path: Path):
    res = CliRunner().invoke(app, case.argv(tmp_path), env=case.env)
    assert "Traceback" not in res.output
    assert res.exit_code == case.code, res.output
    assert case.says in res.output, res.output


# --- 14. a Hub dataset the Hub cannot serve: one line, at once ------------------------------------------
# datasets retried for ~24 s, eleven lines, then advised "set HF_HUB_OFFLINE=0", which nobody had set.


def test_an_unreachable_hub_dataset_is_one_line_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    res = run_cli(["prompts", "show", "hf:someone/prompts"], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr
    assert lines == [
        "error: could not load Hub dataset someone/prompts: the Hub cannot be reached (127.0.0.1: Connection "
        "refused); give a local .jsonl, .csv or .parquet file, or set HF_HUB_OFFLINE=1 to read the dataset from "
        "the local cache"
    ], res.stderr


# --- 15. the machine refuses the lock file: one line naming it, exit 6 ---------------------------------


def test_a_full_disk_at_the_lock_names_the_lock_file(synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import errno

    run = run_copy(synth, tmp_path / "run")
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(layout.LOCK):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    res = CliRunner().invoke(app, ["report", str(run)], env=WIDE)
    monkeypatch.undo()
    assert res.exit_code == 6, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: {run / layout.LOCK}: No space left on device"], res.stderr
    assert not (run / layout.LOCK).exists()  # released on the way out


# --- 16. refusals that say what is wrong, where the tool went quietly on or said something else ---------


def _dry(*args: str) -> list[str]:
    return ["matrix", "--engine", "fake", "--limit", "1", "--dry-run", *args]


def _file_as_cache(root: Path) -> list[str]:
    (root / "afile").write_text("x\n", encoding="utf-8")
    return _dry()


def _duplicate_config_keys(suffix: str, text: str):
    def argv(root: Path) -> list[str]:
        (root / f"m.{suffix}").write_text(text, encoding="utf-8")
        return _dry("--config", str(root / f"m.{suffix}"))

    return argv


def _pretty_json_array(root: Path) -> list[str]:
    path = root / "pretty.jsonl"
    path.write_text('[\n  {"key": "a", "prompt": "x"}\n]\n', encoding="utf-8")
    return ["prompts", "show", str(path)]


@dataclass
class Refusal:
    id: str
    argv: Callable[[Path], list[str]]
    says: str
    env: Callable[[Path], dict[str, str]] = lambda root: {}


# fmt: off
REFUSALS = [
    Refusal("run-id-300-characters", lambda r: _dry("--run-id", "a" * 300), "--run-id: at most 200 characters, got 300"),
    Refusal("run-id-empty", lambda r: _dry("--run-id", ""), "--run-id '': use letters"),
    Refusal("run-id-empty-on-a-run", lambda r: [*MATRIX, "--results-dir", str(r), "--run-id", ""], "--run-id '': use letters"),
    Refusal("cache-variable-names-a-file", _file_as_cache, "CASCADE_REPRO_CACHE=", lambda r: {"CASCADE_REPRO_CACHE": str(r / "afile")}),
    Refusal("toml-key-twice", _duplicate_config_keys("toml", "max-tokens = 4\nmax_tokens = 8\n"),
            "m.toml: max-tokens and max_tokens set the same setting: give one"),
    Refusal("yaml-key-twice", _duplicate_config_keys("yaml", "max-model-len: 4096\nmax_model_len: 2048\n"),
            "m.yaml: max-model-len and max_model_len set the same setting: give one"),
    Refusal("pretty-printed-json-array", _pretty_json_array,
            "malformed JSON at column 1: Expecting value (this loader reads JSON Lines: one object per line)"),
]
# fmt: on


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.id)
def test_a_refusal_says_what_is_wrong(case: Refusal, tmp_path: Path):
    res = CliRunner().invoke(app, case.argv(tmp_path), env={**WIDE, **case.env(tmp_path)})
    assert "Traceback" not in res.output
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: ") and case.says in lines[0], res.stderr
    assert res.stdout == ""  # before any table


def test_report_of_run_json_names_the_folder_to_give(synth: Path, tmp_path: Path):
    run = run_copy(synth, tmp_path / "run")
    res = CliRunner().invoke(app, ["report", str(run / layout.RUN_JSON)], env=WIDE)
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {run / layout.RUN_JSON} is a file: give the run directory ({run})"


@pytest.mark.parametrize(("command", "instead"), [("report", ""), ("merge", " or choose another OUT_DIR"),
                                                  ("matrix", " or choose another --results-dir")])  # fmt: skip
def test_the_in_use_line_offers_what_the_command_has(command: str, instead: str, synth: Path, tmp_path: Path):
    if command == "merge":
        argv, run = _merge_into_a_locked_merge(tmp_path, synth)
    elif command == "report":
        run = run_copy(synth, tmp_path / "run")
        argv = ["report", str(run)]
    else:
        argv, run = _matrix_fresh_into_a_locked_run(tmp_path, synth)
    lock = runlock.RunLock(run)
    lock.acquire()
    try:
        res = CliRunner().invoke(app, argv, env=WIDE)
    finally:
        lock.release()
    assert res.exit_code == 2, res.output
    assert res.stderr.rstrip().endswith(f"(pid {os.getpid()}); wait for it{instead}"), res.stderr


def test_the_install_checkouts_commit_is_read_without_gits_lock(monkeypatch: pytest.MonkeyPatch):
    """`git status` refreshes the index under .git/index.lock unless told not to: a run would take
    that lock in the user's checkout, and a commit there at that moment would fail."""
    from cascade_repro.run import envinfo

    seen = []
    real = subprocess.run

    def record(args, **kw):
        if args and args[0] == "git":
            seen.append((args, (kw.get("env") or os.environ).get("GIT_OPTIONAL_LOCKS")))
        return real(args, **kw)

    monkeypatch.setattr(subprocess, "run", record)
    envinfo.source_info()
    if not seen:
        pytest.skip("not run from a git checkout")
    assert all(locks == "0" for _, locks in seen), seen
