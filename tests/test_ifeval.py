"""cascade_repro.ifeval: IFEval-style verifiers on crafted Korean and English responses, scoring, IF in compare.

Every expectation was worked out by hand from the rules in cascade_repro/ifeval/verifiers.py
(Google IFEval's, with the Korean word rule: a word is a whitespace-separated unit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro.ifeval import (
    VERIFIERS,
    check,
    check_loose,
    count_sentences,
    count_words,
    if_accuracy,
    mcnemar_exact,
    paired_if,
    score_response,
)
from cascade_repro.ifeval.verifiers import is_english, loose_variants, split_sentences
from cascade_repro.promptsets import load_prompt_set

# (instruction id, kwargs, response, strict expectation)
CASES: list[tuple[str, dict, str, bool]] = [
    # punctuation:no_comma
    ("punctuation:no_comma", {}, "용궁에는 용왕이 살아요. 거북이가 길을 안내하죠.", True),
    ("punctuation:no_comma", {}, "용궁에는 용왕이 살고, 거북이가 길을 안내해요.", False),
    ("punctuation:no_comma", {}, "바다，하늘", False),  # full-width comma
    ("punctuation:no_comma", {}, "The sea is calm tonight.", True),
    ("punctuation:no_comma", {}, "Calm, quiet sea.", False),
    ("punctuation:no_comma", {}, "   ", False),  # an empty answer follows nothing
    # change_case:english_lowercase
    ("change_case:english_lowercase", {}, "seollal is the lunar new year. families eat tteokguk.", True),
    ("change_case:english_lowercase", {}, "Seollal is the lunar new year.", False),
    ("change_case:english_lowercase", {}, "설날은 음력 새해입니다.", False),  # no cased letter, not English
    ("change_case:english_lowercase", {}, "seollal 설날 is fun", False),  # 12 Latin of 15 letters < 90%
    # change_case:english_capital
    ("change_case:english_capital", {}, "TAKE LINE 2 TO CITY HALL. TAP YOUR CARD!", True),
    ("change_case:english_capital", {}, "Take line 2 to City Hall.", False),
    ("change_case:english_capital", {}, "지하철 LINE 2", False),  # 4 Latin of 7 letters
    # length_constraints:number_words (8 어절 below; punctuation stays on its word)
    ("length_constraints:number_words", {"relation": "less than", "num_words": 50},
     "배송이 늦어져 정말 죄송합니다. 내일 바로 보내 드리겠습니다.", True),  # fmt: skip
    ("length_constraints:number_words", {"relation": "less than", "num_words": 8},
     "배송이 늦어져 정말 죄송합니다. 내일 바로 보내 드리겠습니다.", False),  # fmt: skip
    ("length_constraints:number_words", {"relation": "at least", "num_words": 8},
     "배송이 늦어져 정말 죄송합니다. 내일 바로 보내 드리겠습니다.", True),  # fmt: skip
    ("length_constraints:number_words", {"relation": "at least", "num_words": 9},
     "배송이 늦어져 정말 죄송합니다. 내일 바로 보내 드리겠습니다.", False),  # fmt: skip
    ("length_constraints:number_words", {"relation": "at least", "num_words": 7}, "Green tea is calm, and it's warm.", True),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 7}, "Green tea is calm, and it's warm.", False),
    # length_constraints:number_sentences
    ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3},
     "흥부는 착했다. 놀부는 욕심이 많았다! 결국 누가 복을 받았을까?", False),  # fmt: skip
    ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 4},
     "흥부는 착했다. 놀부는 욕심이 많았다! 결국 누가 복을 받았을까?", True),  # fmt: skip
    ("length_constraints:number_sentences", {"relation": "at least", "num_sentences": 3},
     "Heungbu was kind. Nolbu was greedy! Who was rewarded?", True),  # fmt: skip
    ("length_constraints:number_sentences", {"relation": "at least", "num_sentences": 3},
     "It costs 3.5 dollars. Buy it now", False),  # fmt: skip
    # length_constraints:number_paragraphs
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3},
     "첫 문단입니다.\n\n***\n\n둘째 문단입니다.\n\n***\n\n셋째 문단입니다.", True),  # fmt: skip
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     "첫 문단입니다.\n\n***\n\n둘째 문단입니다.\n\n***\n\n셋째 문단입니다.", False),  # fmt: skip
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\nOne.\n***\nTwo.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One.\n***\n***\nTwo.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One paragraph.\n\nAnother, no divider.", False),
    # detectable_format:number_bullet_lists
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     "보리차와 옥수수차:\n* 보리차는 고소합니다\n* 옥수수차는 달콤합니다\n- 둘 다 카페인이 없습니다", True),  # fmt: skip
    ("detectable_format:number_bullet_lists", {"num_bullets": 4},
     "보리차와 옥수수차:\n* 보리차는 고소합니다\n* 옥수수차는 달콤합니다\n- 둘 다 카페인이 없습니다", False),  # fmt: skip
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "**Bold intro**\n* one item", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "1. first\n2. second", False),
    # detectable_format:numbered_list (custom)
    ("detectable_format:numbered_list", {"num_items": 4},
     "1. 물을 끓입니다.\n2. 80도로 식힙니다.\n3. 찻잎을 넣습니다.\n4. 2분 우립니다.", True),  # fmt: skip
    ("detectable_format:numbered_list", {"num_items": 3},
     "1. 물을 끓입니다.\n2. 80도로 식힙니다.\n3. 찻잎을 넣습니다.\n4. 2분 우립니다.", False),  # fmt: skip
    ("detectable_format:numbered_list", {"num_items": 2}, "Steps:\n  1. Boil water.\n  2. Steep.", True),
    ("detectable_format:numbered_list", {"num_items": 2}, "1.Boil water.\n2. Steep.", False),  # no space after 1.
    ("detectable_format:numbered_list", {"num_items": 3}, "* one\n* two\n* three", False),
    # detectable_format:json_format
    ("detectable_format:json_format", {}, '{"이름": "찻잔 세트", "가격": 35000}', True),
    ("detectable_format:json_format", {}, '```json\n{"name": "cup set"}\n```', True),
    ("detectable_format:json_format", {}, '다음은 JSON입니다: {"a": 1}', False),
    ("detectable_format:json_format", {}, '{"name": "cup set",}', False),
    # detectable_format:title
    ("detectable_format:title", {}, "<<가을 차밭>>\n찻잎이 붉게 물든다", True),
    ("detectable_format:title", {}, "<<   >>\n빈 제목", False),
    ("detectable_format:title", {}, "<<가을\n차밭>>", False),
    ("detectable_format:title", {}, "Autumn Fields\nThe leaves turn red.", False),
    # keywords:existence
    ("keywords:existence", {"keywords": ["사진", "교환"]}, "사진을 보내 주시면 교환해 드립니다.", True),
    ("keywords:existence", {"keywords": ["사진", "교환"]}, "사진만 보내 주세요.", False),
    ("keywords:existence", {"keywords": ["ocean"]}, "The OCEAN is wide.", True),
    ("keywords:existence", {"keywords": ["ocean"]}, "The sea is wide.", False),
    # keywords:forbidden_words (Hangul: anywhere, particles attached; English: whole words)
    ("keywords:forbidden_words", {"forbidden_words": ["눈물", "이별"]}, "눈물이 났어요.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["눈물", "이별"]}, "웃으며 헤어졌어요.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["tea"]}, "Steam rose from the cup.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["tea"]}, "Tea time!", False),
    # keywords:frequency (case-insensitive substring count)
    ("keywords:frequency", {"keyword": "향", "frequency": 3, "relation": "at least"},
     "향이 좋고 향긋하며 은은한 향이 납니다.", True),  # fmt: skip
    ("keywords:frequency", {"keyword": "향", "frequency": 4, "relation": "at least"},
     "향이 좋고 향긋하며 은은한 향이 납니다.", False),  # fmt: skip
    ("keywords:frequency", {"keyword": "spicy", "frequency": 2, "relation": "less than"}, "This soup is spicy.", True),
    ("keywords:frequency", {"keyword": "spicy", "frequency": 2, "relation": "less than"},
     "This soup is spicy. Very SPICY.", False),  # fmt: skip
    # startend:end_checker
    ("startend:end_checker", {"end_phrase": "감사합니다."}, "주문해 주셔서 감사합니다.", True),
    ("startend:end_checker", {"end_phrase": "감사합니다."}, '  "주문해 주셔서 감사합니다."  ', True),
    ("startend:end_checker", {"end_phrase": "감사합니다."}, "감사합니다. 또 오세요.", False),
    ("startend:end_checker", {"end_phrase": "Made by hand."}, "Each cup is MADE BY HAND.", True),
    ("startend:end_checker", {"end_phrase": "Made by hand."}, "Made by hand. Enjoy!", False),
    # startend:quotation
    ("startend:quotation", {}, '"유자청 신제품을 소개합니다."', True),
    ("startend:quotation", {}, "\u201c유자청 신제품을 소개합니다.\u201d", True),  # typographic 큰따옴표
    ("startend:quotation", {}, '유자청을 "소개"합니다', False),
    ("startend:quotation", {}, '"', False),
    ("startend:quotation", {}, '"Hello," she said.', False),
    # detectable_content:postscript
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "감사합니다.\nP.S. 다음 주에 할인이 있어요.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "감사합니다. 다음 주에 할인이 있어요.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Thanks.\nP.P.S. See you soon.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Thanks.\nP.S. See you soon.", False),
    # combination:repeat_prompt
    ("combination:repeat_prompt", {"prompt_to_repeat": "친구에게 보리차 끓이는 법을 알려 주세요."},
     "친구에게 보리차 끓이는 법을 알려 주세요. 먼저 물을 끓이세요.", True),  # fmt: skip
    ("combination:repeat_prompt", {"prompt_to_repeat": "친구에게 보리차 끓이는 법을 알려 주세요."},
     "보리차 끓이는 법: 먼저 물을 끓이세요.", False),  # fmt: skip
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a short poem about the first snow."},
     "write a short poem about the first snow. Snow falls softly.", True),  # fmt: skip
]


@pytest.mark.parametrize(("iid", "kwargs", "response", "expected"), CASES)
def test_verifier_case(iid: str, kwargs: dict, response: str, expected: bool) -> None:
    assert check(iid, response, kwargs) is expected
    if expected:
        assert check_loose(iid, response, kwargs)  # loose accepts whatever strict accepts


def test_every_shipped_instruction_has_pass_and_fail_cases_in_both_languages() -> None:
    shipped = {i for r in load_prompt_set("ko-ifeval-style").records for i in r.instruction_id_list}
    assert shipped == set(VERIFIERS)
    for iid in VERIFIERS:
        outcomes = {exp for i, _, _, exp in CASES if i == iid}
        assert outcomes == {True, False}, iid
        hangul = any(any("\uac00" <= ch <= "\ud7a3" for ch in resp) for i, _, resp, _ in CASES if i == iid)
        latin = any(any(ch.isascii() and ch.isalpha() for ch in resp) for i, _, resp, _ in CASES if i == iid)
        assert hangul and latin, iid


def test_every_shipped_record_is_scorable() -> None:
    for r in load_prompt_set("ko-ifeval-style").records:
        s = score_response(r, "답변")
        assert s["strict"] is not None, (r.key, s)
        assert [e["id"] for e in s["per_instruction"]] == list(r.instruction_id_list)


# --- counting rules ------------------------------------------------------------------------------------


def test_word_rule_is_whitespace_units() -> None:
    assert count_words("녹차를 마시면 마음이 편안해집니다.") == 4  # 어절, particles attached
    assert count_words("Don't stop, okay?") == 3  # IFEval's \w+ would say 4
    assert count_words("  \n ") == 0


def test_sentence_rule() -> None:
    assert split_sentences("1. 물을 끓입니다.\n2. 3.5g의 차를 넣으세요! 정말?! 네...") == [
        "물을 끓입니다",
        "3.5g의 차를 넣으세요",
        "정말",
        "네",
    ]
    assert count_sentences("좋아요。정말요") == 2
    assert count_sentences("첫 줄\n둘째 줄") == 2
    assert count_sentences("...!!! 🙂") == 0


def test_english_rule() -> None:
    assert is_english("Café au lait is nice")  # accented Latin letters are Latin
    assert not is_english("설날")
    assert not is_english("1234 !!")


# --- loose accuracy --------------------------------------------------------------------------------------


def test_loose_variants_follow_ifeval() -> None:
    assert loose_variants("*a*\nb\n*c*") == ["*a*\nb\n*c*", "a\nb\nc", "b\n*c*", "*a*\nb", "b", "b\nc", "a\nb", "b"]


@pytest.mark.parametrize(
    ("iid", "kwargs", "response"),
    [
        # an intro line with capitals: only the response without its first line is all lowercase
        ("change_case:english_lowercase", {}, "Sure! Here it is:\nseollal is the lunar new year."),
        # a trailing line after the end phrase: removing the last line fixes it
        ("startend:end_checker", {"end_phrase": "감사합니다."}, "주문해 주셔서 감사합니다.\n\n(자동 발송)"),
        # JSON behind an intro line
        ("detectable_format:json_format", {}, 'Here is the JSON:\n```json\n{"a": 1}\n```'),
        # Markdown bold around the quotes
        ("startend:quotation", {}, '**"유자청을 소개합니다."**'),
        # bold title markers inside the title line count once stars are removed
        ("detectable_format:numbered_list", {"num_items": 2}, "**1. 물**\n**2. 차**"),
    ],
)
def test_loose_only(iid: str, kwargs: dict, response: str) -> None:
    assert check(iid, response, kwargs) is False
    assert check_loose(iid, response, kwargs) is True


def test_loose_can_still_fail() -> None:
    assert check_loose("punctuation:no_comma", "하나, 둘\n셋", {}) is True  # the last line alone has no comma
    assert check_loose("punctuation:no_comma", "하나, 둘, 셋", {}) is False


# --- score_response, if_accuracy -------------------------------------------------------------------------

TWO = {"instruction_id_list": ["detectable_format:title", "punctuation:no_comma"], "kwargs": [{}, {}]}


def test_score_response() -> None:
    ok = score_response(TWO, "<<가을 차밭>>\n바람이 분다")
    assert (ok["strict"], ok["loose"]) == (True, True)
    # Loose tries each variant per instruction: the title line alone has no comma.
    half = score_response(TWO, "<<가을 차밭>>\n바람이 불고, 잎이 진다")
    assert (half["strict"], half["loose"]) == (False, True)
    bad = score_response(TWO, "<<가을, 차밭>>\n바람이 불고, 잎이 진다")
    assert (bad["strict"], bad["loose"]) == (False, False)
    assert [(e["id"], e["strict"]) for e in bad["per_instruction"]] == [
        ("detectable_format:title", True),
        ("punctuation:no_comma", False),
    ]
    loose = score_response(TWO, "Sure, here it is:\n<<가을 차밭>>\n바람이 분다")
    assert (loose["strict"], loose["loose"]) == (False, True)
    unknown = score_response({"instruction_id_list": ["language:response_language"], "kwargs": [{}]}, "hi")
    assert unknown["strict"] is None and "no verifier" in unknown["per_instruction"][0]["error"]
    assert score_response({"prompt": "no instructions"}, "hi")["strict"] is None
    missing = score_response({"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{}]}, "hi")
    assert missing["strict"] is None and "bad kwargs" in missing["per_instruction"][0]["error"]
    # Extra kwargs and nulls (as in google/IFEval rows) are ignored.
    extra = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": None, "foo": 1}]}
    assert score_response(extra, "쉼표 없음")["strict"] is True


def test_if_accuracy() -> None:
    prompts = [TWO, TWO, {"instruction_id_list": ["x:unknown"]}, TWO]
    samples = {
        0: "<<제목>>\n좋다",
        1: "<<제목, 부제>>\n좋고, 멋지다",  # a comma on every line: fails loose too
        2: "anything",  # unknown instruction id: not scored
        3: "Title, here:\n<<제목>>\n좋다",  # the comma is only in the first line: loose passes
        9: "out of range",
    }
    acc = if_accuracy(samples, prompts)
    assert acc["if_n"] == 3
    assert acc["strict"] == {0: True, 1: False, 3: False}
    assert acc["loose"] == {0: True, 1: False, 3: True}
    assert acc["if_strict"] == pytest.approx(1 / 3) and acc["if_loose"] == pytest.approx(2 / 3)
    empty = if_accuracy({}, prompts)
    assert empty["if_n"] == 0 and empty["if_strict"] != empty["if_strict"]  # NaN


# --- McNemar ----------------------------------------------------------------------------------------------


def test_mcnemar_exact_by_hand() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 * P(X <= 0), X ~ Bin(5, 1/2)
    assert mcnemar_exact(1, 6) == pytest.approx(2 * 8 / 128)  # 2 * (1 + 7) / 2^7
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)


def test_mcnemar_matches_scipy_binomtest() -> None:
    stats = pytest.importorskip("scipy.stats")
    for b in range(0, 15):
        for c in range(0, 15):
            if b + c:
                assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_paired_if() -> None:
    test = {0: True, 1: False, 2: True, 3: False}
    ref = {0: True, 1: True, 2: False, 3: True, 4: True}
    p = paired_if(test, ref)
    assert (p["if_n"], p["if_gained"], p["if_lost"]) == (4, 1, 2)
    assert (p["if_test"], p["if_ref"], p["if_delta"]) == (0.5, 0.75, -0.25)
    assert p["p"] == pytest.approx(1.0)  # 2 * P(X <= 1), X ~ Bin(3, 1/2) = 2 * 4/8
    none = paired_if({}, ref)
    assert none["if_n"] == 0 and none["p"] != none["p"]


# --- compare: IF columns, and IF never changes a verdict -------------------------------------------------

PROMPTS = [
    {"key": "ko-a", "prompt": "쉼표 없이 써 주세요.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "lang": "ko"},
    {"key": "ko-b", "prompt": "제목을 붙이세요.", "instruction_id_list": ["detectable_format:title"], "kwargs": [{}], "lang": "ko"},
    {"key": "en-c", "prompt": "End with 'Done.'", "instruction_id_list": ["startend:end_checker"],
     "kwargs": [{"end_phrase": "Done."}], "lang": "en"},  # fmt: skip
    {"key": "en-d", "prompt": "Say hi.", "lang": "en"},
]
GOOD = ["하나 둘 셋", "<<제목>>\n본문", "All set. Done.", "hi"]
BAD = ["하나, 둘, 셋", "제목 없음", "Done. All set.", "hello"]


def _write_run(root: Path, cascade_texts: list[str]) -> Path:
    from cascade_repro.runstore import JsonlWriter

    root.mkdir(parents=True)
    cells = [
        {"cell_id": f"tp1-b8-{arm}", "engine_key": "hf-tp1", "tp": 1, "batch": 8, "arm": arm, "rerun": 0, "seed": 0,
         "dtype": "float32", "fa_version": None, "backend": "FLASH_ATTN"}
        for arm in ("cascade", "flat")
    ]  # fmt: skip
    run = {"spec": {"engine": "hf", "model": "m"}, "plan": {"engines": {"hf-tp1": {}}, "cells": cells}}
    (root / "run.json").write_text(json.dumps(run), encoding="utf-8")
    (root / "prompts.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PROMPTS), "utf-8")
    w = JsonlWriter(root / "samples" / "hf-tp1.jsonl")
    for arm, texts in (("cascade", cascade_texts), ("flat", GOOD)):
        cid = f"tp1-b8-{arm}"
        w.write({"type": "cell_start", "cell_id": cid})
        for i, (p, text) in enumerate(zip(PROMPTS, texts, strict=True)):
            w.write({"type": "sample", "cell_id": cid, "wave": 0, "prompt_index": i, "prompt_key": p["key"],
                     "prompt_hash": "h", "prompt_tokens": 300, "token_ids": [5, 6, 7, 8, i], "text": text,
                     "finish_reason": "stop", "logprobs": [-0.1] * 5,
                     "topk": [[[t, -0.1]] for t in (5, 6, 7, 8, i)]})  # fmt: skip
        w.write({"type": "wave", "cell_id": cid, "wave": 0, "batch": 8, "n_real": 4,
                 "cascade_steps": 5 if arm == "cascade" else 0, "total_steps": 5, "cascade_calls": 0,
                 "common_prefix_len": 304, "wall_s": 1.0, "tokens": 20})  # fmt: skip
        w.write({"type": "cell_done", "cell_id": cid, "n_samples": 4, "wall_s": 1.0})
    w.close()
    return root


def test_compare_adds_if_columns_without_touching_verdicts(tmp_path: Path) -> None:
    from cascade_repro.compare import build_tables
    from cascade_repro.verdicts import Thresholds

    out = {}
    for name, texts in (("same", GOOD), ("worse", BAD)):
        root = _write_run(tmp_path / name, texts)
        run = json.loads((root / "run.json").read_text())
        cells, pairs, _ = build_tables(run, root, Thresholds())
        out[name] = (cells.set_index("cell_id"), pairs.set_index("pair_id"))
    cells, pairs = out["worse"]
    # Three prompts carry instructions; the fourth has none and is not scored.
    assert cells.loc["tp1-b8-flat", "if_n"] == 3 and cells.loc["tp1-b8-flat", "if_strict"] == 1.0
    assert cells.loc["tp1-b8-cascade", "if_strict"] == 0.0 and cells.loc["tp1-b8-cascade", "if_loose"] == 0.0
    p = pairs.loc["tp1-b8-cascade~flat"]
    assert (p["if_n"], p["if_gained"], p["if_lost"], p["if_strict_delta"]) == (3, 0, 3, -1.0)
    assert p["p_if"] == pytest.approx(0.25)  # 2 * P(X <= 0), X ~ Bin(3, 1/2)
    same = out["same"][1].loc["tp1-b8-cascade~flat"]
    assert same["if_strict_delta"] == 0.0 and same["p_if"] == 1.0
    # Token ids are identical in both runs: the verdict is the same, whatever IF says.
    assert p["verdict"] == same["verdict"] == "identical"
    assert p["reasons"] == same["reasons"]


def test_compare_without_prompts_file_has_no_if(tmp_path: Path) -> None:
    from cascade_repro.compare import build_tables
    from cascade_repro.verdicts import Thresholds

    root = _write_run(tmp_path / "r", BAD)
    (root / "prompts.jsonl").unlink()
    run = json.loads((root / "run.json").read_text())
    cells, pairs, _ = build_tables(run, root, Thresholds())
    assert (cells["if_n"] == 0).all() and cells["if_strict"].isna().all()
    assert pairs["p_if"].isna().all()
