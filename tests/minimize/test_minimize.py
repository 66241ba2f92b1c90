"""`minimize`: ddmin, the search on a scripted engine, the standalone script, and a run end to end on the fake engine."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import runpy
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.engines.base import Completion, WaveStats
from cascade_repro.judge.metrics.divergence import topk_contains
from cascade_repro.minimize.ddmin import ddmin, split
from cascade_repro.minimize.render import render_repro
from cascade_repro.minimize.search import Case, Oracle, search

STANDALONE = Path(__file__).parents[2] / "cascade_repro" / "minimize" / "standalone.py"


# --------------------------------------------------------------------------- ddmin


def test_split_keeps_order_and_sizes():
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([1, 2], 4) == [[1], [2]]


def test_ddmin_finds_the_two_culprits():
    calls = []

    def fails(s):
        calls.append(len(s))
        return {3, 17} <= set(s)

    r = ddmin(list(range(32)), fails, max_tests=200)
    assert r.items == [3, 17]
    assert r.tests == len(calls) and not r.exhausted
    # 1-minimal: dropping either culprit passes.
    assert not fails([3]) and not fails([17])


def test_ddmin_never_tries_below_min_size():
    seen = []

    def fails(s):
        seen.append(len(s))
        return len(s) >= 8 and 5 in s

    r = ddmin(list(range(40)), fails, max_tests=100, min_size=8)
    assert len(r.items) == 8 and 5 in r.items
    assert min(seen) >= 8


def test_ddmin_keeps_duplicates_apart_and_respects_the_budget():
    # Items may repeat (a wave's filler requests repeat prompts); positions keep them distinct.
    r = ddmin([7, 7, 7, 7, 1, 7, 7, 7], lambda s: s.count(7) >= 2 and 1 in s, max_tests=100)
    assert sorted(r.items) == [1, 7, 7]
    r = ddmin(list(range(64)), lambda s: 63 in s and 0 in s, max_tests=3)
    assert r.exhausted and r.tests == 3 and {0, 63} <= set(r.items)


# --------------------------------------------------------------------------- search on a scripted engine


class ScriptedEngine:
    """Deterministic stand-in for the search's unit tests (not a vLLM mock: it models the fault).

    The cascade arm flips prompt 5's token at step 2 to one outside the flat top-k, but only when
    at least 8 requests share the wave (cascade's request threshold) and max_tokens > 2.
    """

    def __init__(self):
        self.waves = []

    def tokenizer(self):
        class Tok:
            def decode(self, ids):
                return "".join(f"<{i}>" for i in ids)

        return Tok()

    def run_wave(self, prompts, arm, max_tokens, prefix_len=None):
        self.waves.append((len(prompts), arm, max_tokens))
        out = []
        fire = arm == "cascade" and len(prompts) >= 8
        for p in prompts:
            toks = [p[-1] * 10 + j for j in range(max_tokens)]
            topk = [[[t, -0.1], [t + 1000, -2.0]] for t in toks]
            if fire and p[-1] == 5 and max_tokens > 2:
                toks[2] = 99999
                topk[2] = [[99999, -0.2], [42, -3.0]]
            out.append(Completion(toks, "", "length", [-0.1] * len(toks), topk))
        return out, WaveStats(cascade_steps=max_tokens if fire else 0, total_steps=max_tokens)

    def effective(self):
        return {}

    def close(self):
        pass


def test_search_shrinks_requests_and_tokens():
    rendered = [[0, 0, i] for i in range(32)]
    eng = ScriptedEngine()
    oracle = Oracle(eng, rendered, prefix_len=2, criterion="topk")
    best, tests, exhausted, conf = search(oracle, Case(list(range(32)), 16), max_tests=64)
    assert best is not None and best.failed
    assert len(best.case.prompt_indices) == 8 and 5 in best.case.prompt_indices
    assert best.case.max_tokens == 3  # first bad token at step 2
    v = best.violations[0]
    assert (v.prompt_index, v.step, v.cascade_token, v.topk_ok) == (5, 2, 99999, False)
    assert v.cascade_text == "<99999>" and v.flat_lp_of_cascade_token is None
    assert tests == len(oracle.trials) and not exhausted
    assert conf == [{"requests": 8, "max_tokens": 3, "runs": 3, "fails": 3}]
    # Every test ran both arms with the same requests.
    assert len(eng.waves) == 2 * tests


def test_search_reports_not_reproduced():
    oracle = Oracle(ScriptedEngine(), [[0, 0, i] for i in range(16)], prefix_len=2, criterion="topk")
    best, tests, _, conf = search(oracle, Case(list(range(6, 14)), 16), max_tests=10)  # no prompt 5
    assert best is None and tests == 1 and conf == []


def test_search_falls_back_to_the_recorded_length():
    oracle = Oracle(ScriptedEngine(), [[0, 0, i] for i in range(16)], prefix_len=2, criterion="topk")
    best, tests, _, _ = search(oracle, Case(list(range(16)), 2), max_tests=20, full_tokens=16, confirm=1)
    assert best is not None and best.case.max_tokens == 3


class FlakyAtEight(ScriptedEngine):
    """Cascade fires with exactly 8 requests only on every other wave (a request arrived late)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def run_wave(self, prompts, arm, max_tokens, prefix_len=None):
        if arm == "cascade" and len(prompts) == 8:
            self.n += 1
            if self.n % 2 == 0:  # the 8th request joined a later step: no step reached the threshold
                return super().run_wave(prompts, "flat", max_tokens, prefix_len)
        return super().run_wave(prompts, arm, max_tokens, prefix_len)


def test_a_flaky_minimum_falls_back_to_the_next_larger_stable_case():
    oracle = Oracle(FlakyAtEight(), [[0, 0, i] for i in range(32)], prefix_len=2, criterion="topk")
    best, _, _, conf = search(oracle, Case(list(range(32)), 3), max_tests=64)
    assert best is not None and best.failed and 5 in best.case.prompt_indices
    assert conf[0]["requests"] == 8 and conf[0]["fails"] < conf[0]["runs"]
    assert len(best.case.prompt_indices) > 8
    assert conf[-1] == {"requests": len(best.case.prompt_indices), "max_tokens": 3, "runs": 3, "fails": 3}


# --------------------------------------------------------------------------- the standalone script


def _standalone():
    return runpy.run_path(str(STANDALONE))


def _arm(tokens, topk):
    return {
        "outputs": [
            {"token_ids": t, "logprobs": [-0.1] * len(t), "topk": k}
            for t, k in zip(tokens, topk, strict=True)
        ]
    }


def test_standalone_compare_agrees_with_the_harness_rule():
    compare = _standalone()["compare"]
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 6)
        a = [rng.randint(0, 4) for _ in range(n)]
        b = list(a[: rng.randint(0, n)]) + [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
        ka = [[[rng.randint(0, 4), -1.0] for _ in range(3)] for _ in a]
        kb = [[[rng.randint(0, 4), -1.0] for _ in range(3)] for _ in b]
        diffs = compare(_arm([a], [ka]), _arm([b], [kb]))
        harness = topk_contains(a, ka, b, kb)
        if a == b:
            assert diffs == []
        else:
            assert len(diffs) == 1 and diffs[0]["within_topk"] == bool(harness)


def test_rendered_repro_is_valid_python_with_the_case():
    src = render_repro(
        model="some/model",
        system_prompt="line one\nline 'two'\n\"three\"",
        prompts=["쉼표 없이 써 주세요.", 'quote " and \\ backslash'],
        engine_args={
            "tensor_parallel_size": 2,
            "attention_config": {"backend": "FLASH_ATTN", "flash_attn_version": 2},
        },
        max_tokens=3,
        topk=5,
        seed=0,
        inject=True,
        header="test",
    )
    ast.parse(src)
    ns: dict = {}
    exec(compile(src, "repro.py", "exec"), ns)  # defines only; main() runs under __main__
    assert ns["MODEL"] == "some/model"
    assert ns["SYSTEM_PROMPT"] == "line one\nline 'two'\n\"three\""
    assert ns["PROMPTS"][1] == 'quote " and \\ backslash'
    assert ns["ENGINE_ARGS"]["attention_config"]["flash_attn_version"] == 2
    assert ns["MAX_TOKENS"] == 3 and ns["INJECT_LSE_LAYOUT"] is True
    assert "import vllm" not in src.split("def ")[0]  # vLLM is imported inside the arm only


def _repro_file(tmp_path, model: str) -> Path:
    src = render_repro(model=model, system_prompt="", prompts=["p"], engine_args={}, max_tokens=1, topk=5,
                       seed=0, inject=False, header="test")  # fmt: skip
    path = tmp_path / "repro.py"
    path.write_text(src, encoding="utf-8")
    return path


def test_repro_that_cannot_run_exits_2_not_1_which_means_the_bug(tmp_path):
    """Without vLLM (this machine) an arm fails: that is no evidence of the bug either way."""
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: the arm would run")
    (tmp_path / "model").mkdir()
    res = subprocess.run([sys.executable, str(_repro_file(tmp_path, str(tmp_path / "model")))],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # One line, no traceback (issue 45 item 7: a CPU-engine case printed the arm's traceback first).
    assert res.returncode == 2
    assert res.stderr == (
        "error: the cascade arm failed (vLLM is not installed here; repro.py needs vLLM on a GPU it "
        "supports); nothing was compared\n"
    )

    res = subprocess.run([sys.executable, str(_repro_file(tmp_path, "/nonexistent/cache/model"))],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr == "error: model folder not found: /nonexistent/cache/model (pass --model PATH_OR_HUB_ID)\n"


# --------------------------------------------------------------------------- CLI errors


def test_cli_without_a_regression_is_a_usage_error(tmp_path):
    import pandas as pd

    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "x", "spec": {}, "plan": {"cells": [], "engines": {}}})
    )
    pd.DataFrame(
        [{"pair_id": "tp1-b8-cascade~flat", "kind": "cascade", "verdict": "within noise", "batch": 8}]
    ).to_parquet(tmp_path / "pairs.parquet")
    r = CliRunner().invoke(app, ["minimize", str(tmp_path)])
    assert r.exit_code == 2
    assert "no pair" in r.output and "within noise" in r.output
    r = CliRunner().invoke(app, ["minimize", str(tmp_path), "--pair", "nope"])
    assert r.exit_code == 2 and "tp1-b8-cascade~flat" in r.output
    r = CliRunner().invoke(app, ["minimize", str(tmp_path / "missing")])
    assert r.exit_code == 2


# --------------------------------------------------------------------------- end to end on the fake engine


def test_minimize_injected_fake_run(tmp_path):
    """A real run, minimize's real engine path and files, on the deterministic fake engine (seconds).

    The fake's fault reorders each step's candidates without replacing them, so a flipped token stays
    in the other arm's top-k: the search runs with ``--criterion any``. The top-k criterion's search is
    held by the scripted engine's tests above."""
    from cascade_repro.pipeline import RunOptions, run_matrix
    from cascade_repro.plan.matrix import MatrixSpec

    # A ~330-word system prompt clears cascade's 256-token minimum (the fake's tokens are bytes).
    sp = tmp_path / "system.txt"
    sp.write_text(
        " ".join(f"Rule {i}: answer politely, briefly and in the user's language." for i in range(30))
    )
    spec = MatrixSpec(
        engine="fake", limit=16, batch=[16], max_tokens=4, inject="lse-layout", system_prompt=str(sp)
    )
    run = run_matrix(spec, RunOptions(results_dir=tmp_path / "res", progress=False))
    assert run.exit_code == 1  # the injected fault is a regression

    out = tmp_path / "min"
    r = CliRunner().invoke(app, ["minimize", str(run.run_dir), "--out", str(out), "--criterion", "any"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "minimized.json").read_text())
    assert data["reproduced"] and data["pair_id"] == "tp1-b16-cascade~flat"
    assert data["criterion"] == "any"
    final = data["final"]
    assert final["case"]["prompt_indices"] == list(range(8))  # cascade's minimum; 16 -> 8
    assert final["case"]["max_tokens"] == 1  # the injected fault moves the very first token
    assert final["cascade_steps"] == final["total_steps"] == 1
    v = final["violations"][0]
    assert v["step"] == 0 and v["cascade_token"] != v["flat_token"]
    assert data["tests"] == len(data["trials"]) >= 2
    assert data["stable"]
    assert data["confirmations"] == [{"requests": 8, "max_tokens": 1, "runs": 3, "fails": 3}]
    assert data["start"] == {"prompt_indices": list(range(16)), "max_tokens": 1}
    repro = (out / "repro.py").read_text()
    ns: dict = {}
    exec(compile(repro, "repro.py", "exec"), ns)
    assert len(ns["PROMPTS"]) == 8 and ns["MAX_TOKENS"] == 1 and ns["INJECT_LSE_LAYOUT"] is True
    assert ns["ENGINE_ARGS"]["enable_prefix_caching"] is True
    issue = (out / "issue.md").read_text()
    for heading in (
        "### Your current environment",
        "### 🐛 Describe the bug",
        "#### First divergence",
        "#### Expected vs actual",
        "### Before submitting a new issue...",
    ):
        assert heading in issue
    assert "fault injected" in issue.lower() and "8 concurrent requests" in issue
    # What the bug's sentence says is what repro.py runs.
    args = ns["ENGINE_ARGS"]
    assert f"tensor parallel {args['tensor_parallel_size']}, dtype {args['dtype']}." in issue
    start = data["start"]
    assert (
        f"from the recorded wave cut at its first failing step ({len(start['prompt_indices'])} requests x "
        f"{start['max_tokens']} tokens" in issue
    )
    # A run of an engine that is not vLLM says first that vLLM was not run.
    note = "> **Note: vLLM was not run.** This case comes from the `fake` engine: "
    assert issue.split("\n")[2].startswith(note)


def _fake_run(tmp_path):
    """A finished run dir with one regression pair: b4, 8 prompts, two waves; wave 1 fails more."""
    import pandas as pd

    from cascade_repro.rundir import jsonl, layout, manifest

    cells = [
        {"cell_id": f"tp1-b4-{arm}", "engine_key": "hf-k", "batch": 4, "arm": arm, "tp": 1, "rerun": 0}
        for arm in ("cascade", "flat")
    ]
    run = {
        "run_id": "fake",
        "spec": {"engine": "hf", "max_tokens": 16, "topk": 2},
        "prompt_set": {"n": 8, "system_prompt_text": "sys"},
        "plan": {"cells": cells, "engines": {"hf-k": {"key": "hf-k", "seed": 0, "tp": 1}}},
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"key": f"p{i}", "prompt": f"q{i}"}) + "\n" for i in range(8))
    )
    w = jsonl.JsonlWriter(layout.samples_path(tmp_path, "hf-k"))
    bad = {5: 3, 6: 7, 1: 9}  # prompt -> first bad step (outside the other arm's top-k)
    for arm in ("cascade", "flat"):
        cid = f"tp1-b4-{arm}"
        w.write({"type": "cell_start", "cell_id": cid})
        for i in range(8):
            toks = list(range(16))
            if arm == "cascade" and i in bad:
                toks[bad[i]] = 999
            topk = [[[t, -0.1], [t + 500, -3.0]] for t in toks]
            w.write(
                {
                    "type": "sample",
                    "cell_id": cid,
                    "wave": i // 4,
                    "prompt_index": i,
                    "prompt_key": f"p{i}",
                    "token_ids": toks,
                    "logprobs": [-0.1] * 16,
                    "topk": topk,
                    "text": "",
                }
            )
        w.write({"type": "cell_done", "cell_id": cid})
    w.close()
    pd.DataFrame(
        [
            {
                "pair_id": "tp1-b4-cascade~flat",
                "kind": "cascade",
                "verdict": "regression",
                "batch": 4,
                "test_cell": "tp1-b4-cascade",
                "ref_cell": "tp1-b4-flat",
            }
        ]
    ).to_parquet(tmp_path / "pairs.parquet")
    return manifest.read_manifest(tmp_path)


def test_start_case_takes_the_wave_with_most_failures_cut_to_the_first_bad_token(tmp_path):
    from cascade_repro.minimize.search import pick_pair, start_case

    run = _fake_run(tmp_path)
    pair = pick_pair(tmp_path, None)
    case = start_case(run, tmp_path, pair, "topk")
    assert case.prompt_indices == [4, 5, 6, 7]  # wave 1 holds two failing prompts, wave 0 one
    assert case.max_tokens == 4  # prompt 5 goes wrong at step 3


def test_cli_out_that_is_a_file_is_a_usage_error(tmp_path):
    _fake_run(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = CliRunner().invoke(app, ["minimize", str(tmp_path), "--out", str(blocker / "sub")])
    assert r.exit_code == 2 and "--out" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_an_engine_that_cannot_start_is_one_line_not_a_traceback(tmp_path):
    from cascade_repro.errors import UsageError
    from cascade_repro.minimize import minimize_run

    _fake_run(tmp_path)

    def refuses(run, eplan):
        raise RuntimeError(
            "Engine core initialization failed.\nValueError: Free memory on device cuda:0 is low"
        )

    with pytest.raises(
        UsageError, match="could not start the hf engine for hf-k: RuntimeError: ValueError: Free memory"
    ):
        minimize_run(tmp_path, engine_factory=refuses)


def test_repro_carries_old_vllm_env_and_ignore_eos():
    from cascade_repro.minimize.render import render_repro

    src = render_repro(
        model="m", system_prompt="s", prompts=["p"], engine_args={"enable_prefix_caching": True},
        engine_env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "VLLM_FLASH_ATTN_VERSION": "2"}, ignore_eos=True,
        max_tokens=9, topk=5, seed=0, inject=False, header="h",
    )  # fmt: skip
    ns: dict = {"__name__": "repro"}
    exec(compile(src, "repro.py", "exec"), ns)  # defines the case and functions, runs nothing
    assert ns["ENGINE_ENV"] == {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "VLLM_FLASH_ATTN_VERSION": "2"}
    assert ns["IGNORE_EOS"] is True and ns["MAX_TOKENS"] == 9
    plain = render_repro(model="m", system_prompt="", prompts=["p"], engine_args={}, max_tokens=1, topk=5,
                         seed=0, inject=False, header="h")  # fmt: skip
    assert "ENGINE_ENV = {}" in plain and "IGNORE_EOS = False" in plain


def test_issue_shows_byte_fragments_by_id_and_bytes():
    """Two byte fragments of a character both decode to '�' alone: issue.md shows their ids and
    bytes, so the two sides of the first divergence differ on the page; decodable tokens stay text."""
    from cascade_repro.engines.fake import ByteTokenizer
    from cascade_repro.minimize.render import _tok
    from cascade_repro.minimize.tokens import _byte_decoder, hex_bytes, token_bytes

    tok = ByteTokenizer()
    x = {"cascade_token": 0xE2, "cascade_text": tok.decode([0xE2]), "cascade_bytes": hex_bytes(token_bytes(tok, 0xE2)),
         "flat_token": 0xEC, "flat_text": tok.decode([0xEC]), "flat_bytes": hex_bytes(token_bytes(tok, 0xEC))}  # fmt: skip
    assert x["cascade_text"] == x["flat_text"] == "\ufffd"
    assert (_tok(x, "cascade", "flat"), _tok(x, "flat", "cascade")) == ("id 226 (bytes e2)", "id 236 (bytes ec)")
    # Text where it decodes and differs.
    y = {"cascade_token": 65, "cascade_text": "A", "flat_token": 66, "flat_text": "B"}
    assert (_tok(y, "cascade", "flat"), _tok(y, "flat", "cascade")) == ("`'A'` (id 65)", "`'B'` (id 66)")
    # Equal decoded text under different ids (a minimized.json of an older version: no bytes): the ids.
    z = {"cascade_token": 7, "cascade_text": "a", "flat_token": 8, "flat_text": "a"}
    assert _tok(z, "cascade", "flat") == "id 7 `'a'`"

    class Bpe:  # a Hugging Face byte-level BPE tokenizer's piece, and a SentencePiece byte fallback
        def convert_ids_to_tokens(self, i):
            return {1: "âĢ", 2: "<0xE2>", 3: "Ġthe", 4: "▁word"}[i]

    rev = {c: b for c, b in _byte_decoder().items()}
    assert len(rev) == 256 and rev["Ġ"] == 0x20
    assert [token_bytes(Bpe(), i) for i in (1, 2, 3, 4)] == [b"\xe2\x80", b"\xe2", b" the", b" word"]
    assert token_bytes(object(), 1) is None


def test_the_engine_loads_with_third_party_progress_bars_off(tmp_path):
    """Issue 45 item 7: transformers' "Loading weights: 0%|" bar cut through minimize's own lines."""
    import os

    from transformers.utils import logging as hf_logging

    from cascade_repro.errors import UsageError
    from cascade_repro.minimize import minimize_run

    _fake_run(tmp_path)
    seen = {}

    def records(run, eplan):
        seen["bars"] = hf_logging.is_progress_bar_enabled()
        seen["hub"] = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
        raise RuntimeError("stop here")

    hf_logging.enable_progress_bar()
    with pytest.raises(UsageError, match="stop here"):
        minimize_run(tmp_path, engine_factory=records)
    assert seen == {"bars": False, "hub": "1"}
    assert hf_logging.is_progress_bar_enabled()  # given back afterwards


def test_an_arm_that_raises_reports_one_line_to_the_parent(tmp_path, capsys):
    """The arm's exception goes to the parent's one error line (exit 2), not a traceback."""
    ns: dict = {}
    exec(compile(_repro_file(tmp_path, str(tmp_path)).read_text(), "repro.py", "exec"), ns)

    def engine_refuses(arm, model):
        raise RuntimeError("Engine core initialization failed.\nValueError: Free memory on device is low")

    ns["run_arm"] = engine_refuses
    out = tmp_path / "arm.json"
    assert ns["main"](["--arm", "cascade", "--out", str(out), "--model", str(tmp_path)]) == 2
    assert json.loads(out.read_text()) == {"error": "RuntimeError: ValueError: Free memory on device is low"}
    assert capsys.readouterr().err == ""
