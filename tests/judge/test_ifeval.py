"""cascade_repro.judge.ifeval: IFEval-style verifiers on crafted Korean and English responses, scoring, IF in compare.

Every expectation was worked out by hand from the rules in cascade_repro/judge/ifeval/verifiers.py and counting.py
(Google IFEval's instructions.py, with the Korean word rule: a word is a whitespace-separated unit,
and the deviations each verifier's docstring states).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro.judge.ifeval import (
    ALIASES,
    GOOGLE_IFEVAL_IDS,
    VERIFIERS,
    Unscorable,
    canonical_id,
    check,
    check_loose,
    count_sentences,
    count_words,
    if_accuracy,
    kwargs_problem,
    mcnemar_exact,
    paired_if,
    score_response,
    unknown_instruction_ids,
    unscorable,
)
from cascade_repro.judge.ifeval.counting import is_english, script_of, split_sentences
from cascade_repro.judge.ifeval.verifiers import loose_variants
from cascade_repro.prompts.promptsets import load_prompt_set
from cascade_repro.rundir import layout, manifest

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
    # cascade_repro:numbered_list (this project's)
    ("cascade_repro:numbered_list", {"num_items": 4},
     "1. 물을 끓입니다.\n2. 80도로 식힙니다.\n3. 찻잎을 넣습니다.\n4. 2분 우립니다.", True),  # fmt: skip
    ("cascade_repro:numbered_list", {"num_items": 3},
     "1. 물을 끓입니다.\n2. 80도로 식힙니다.\n3. 찻잎을 넣습니다.\n4. 2분 우립니다.", False),  # fmt: skip
    ("cascade_repro:numbered_list", {"num_items": 2}, "Steps:\n  1. Boil water.\n  2. Steep.", True),
    ("cascade_repro:numbered_list", {"num_items": 2}, "1.Boil water.\n2. Steep.", False),  # no space after 1.
    ("cascade_repro:numbered_list", {"num_items": 3}, "* one\n* two\n* three", False),
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
    # keywords:letter_frequency (case-insensitive count of the character, inside words too)
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 3, "let_relation": "at least"}, "Banana", True),
    ("keywords:letter_frequency", {"letter": "A", "let_frequency": 4, "let_relation": "at least"}, "Banana", False),
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 3, "let_relation": "less than"}, "Banana", False),
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 4, "let_relation": "less than"}, "BANANA", True),
    ("keywords:letter_frequency", {"letter": "차", "let_frequency": 3, "let_relation": "at least"},
     "녹차와 홍차는 차이가 있다", True),  # 녹차, 홍차, 차이: 3  # fmt: skip
    ("keywords:letter_frequency", {"letter": "차", "let_frequency": 3, "let_relation": "less than"},
     "녹차와 홍차는 차이가 있다", False),  # fmt: skip
    # language:response_language (by script)
    ("language:response_language", {"language": "ko"}, "녹차는 몸에 좋습니다.", True),
    ("language:response_language", {"language": "ko"}, "GPU 서버를 씁니다", True),  # 6 Hangul of 9 letters
    ("language:response_language", {"language": "ko"}, "AB 가나", False),  # exactly half is not more than half
    ("language:response_language", {"language": "ko"}, "Green tea is good for you.", False),
    ("language:response_language", {"language": "ko"}, "12345 !!!", False),  # no letter
    ("language:response_language", {"language": "en"}, "Green tea is good for you.", True),
    ("language:response_language", {"language": "en"}, "녹차는 몸에 좋습니다.", False),
    ("language:response_language", {"language": "ja"}, "緑茶はおいしいです", True),
    ("language:response_language", {"language": "ja"}, "绿茶很好喝", False),  # no kana: not Japanese
    ("language:response_language", {"language": "zh"}, "绿茶很好喝", True),
    ("language:response_language", {"language": "zh"}, "緑茶はおいしいです", False),  # kana
    ("language:response_language", {"language": "ru"}, "Зелёный чай полезен.", True),
    ("language:response_language", {"language": "ru"}, "Green tea is good.", False),
    ("language:response_language", {"language": "hi"}, "हरी चाय अच्छी है", True),
    ("language:response_language", {"language": "ar"}, "الشاي الأخضر مفيد", True),
    ("language:response_language", {"language": "th"}, "ชาเขียวดีต่อสุขภาพ", True),
    # length_constraints:nth_paragraph_first_word (paragraphs split on \n\n)
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "coffee"},
     "Tea is old.\n\nCoffee, however, is newer.\n\nBoth are loved.", True),  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "coffee"},
     "Tea is old.\n\nCoffee, however, is newer.\n\nBoth are loved.", False),  # three paragraphs  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "tea"},
     "Tea is old.\n\nCoffee, however, is newer.\n\nBoth are loved.", False),  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "Coffee"},
     'Intro.\n\n"Coffee" is newer.', True),  # leading quote removed, cut at the closing one  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "b"},
     "A.\n\n\n\nB.", False),  # IFEval: paragraph 2 is the blank piece between the two breaks  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "b"},
     "A.\n\n\n\nB.", False),  # only two paragraphs  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "녹차"},
     "차는 오래되었다.\n\n녹차는 특히 그렇다.", True),  # the particle may follow a Korean word  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "홍차"},
     "차는 오래되었다.\n\n녹차는 특히 그렇다.", False),  # fmt: skip
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "차"},
     "차는 오래되었다.\n녹차는 특히 그렇다.", True),  # one line break is not a paragraph break  # fmt: skip
    # detectable_content:number_placeholders (at least N [..] within a line)
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[이름]님, [주소]로 보내 드립니다.", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 3}, "[이름]님, [주소]로 보내 드립니다.", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], order [id] ships.", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Fill in [] and [].", True),  # empty counts
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "A [split\nbracket]", False),
    # detectable_format:constrained_response (one of three exact English options)
    ("detectable_format:constrained_response", {}, "My answer is yes.", True),
    ("detectable_format:constrained_response", {}, "Hmm. My answer is maybe. It depends.", True),
    ("detectable_format:constrained_response", {}, "My answer is Yes.", False),  # case-sensitive
    ("detectable_format:constrained_response", {}, "My answer is yes", False),  # the period is part of it
    ("detectable_format:constrained_response", {}, "제 생각에는 그렇습니다. My answer is no.", True),
    ("detectable_format:constrained_response", {}, "제 답은 '예'입니다.", False),
    # detectable_format:number_highlighted_sections (at least N non-blank *..* or **..**)
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*Tea* is *calm*.", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "*Tea* is *calm*.", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "**녹차**와 *홍차*", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "**녹차**와 *홍차*", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "Nothing * * here", False),  # blank
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "*녹차\n홍차*", False),  # across lines
    # detectable_format:multiple_sections (spliter + number, case-sensitive; at least N)
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nTea.\nSECTION 2\nCoffee.", True),  # fmt: skip
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 3},
     "SECTION 1\nTea.\nSECTION 2\nCoffee.", False),  # fmt: skip
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 1},
     "Section 1\nTea.", False),  # fmt: skip
    ("detectable_format:multiple_sections", {"section_spliter": " 섹션 ", "num_sections": 2},
     "섹션 1\n녹차 이야기\n섹션 2\n홍차 이야기", True),  # fmt: skip
    ("detectable_format:multiple_sections", {"section_spliter": "섹션", "num_sections": 2},
     "섹션 하나\n녹차 이야기", False),  # no number after the spliter  # fmt: skip
    # combination:two_responses (exactly two different, separated by ******)
    ("combination:two_responses", {}, "녹차를 추천합니다.\n******\n홍차를 추천합니다.", True),
    ("combination:two_responses", {}, "Tea.\n******\nTea.", False),  # the same twice
    ("combination:two_responses", {}, "A\n******\nB\n******\nC", False),  # three
    ("combination:two_responses", {}, "******\nGreen tea.\n******\nBlack tea.", True),  # blank piece at an end
    ("combination:two_responses", {}, "녹차\n******\n\n******\n홍차", False),  # blank piece inside
    ("combination:two_responses", {}, "Just one answer.", False),
    # change_case:capital_word_frequency (words in capitals, str.isupper)
    ("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": "at least"},
     "I LOVE GREEN TEA", True),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 5, "capital_relation": "at least"},
     "I LOVE GREEN TEA", False),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": "less than"},
     "I LOVE GREEN TEA", False),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 5, "capital_relation": "less than"},
     "I LOVE GREEN TEA", True),  # fmt: skip
    # DON'T, WORRY and WELL-KNOWN: 3 words (nltk would say 4: DO and N'T are two tokens)
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"},
     "DON'T WORRY, a WELL-KNOWN tea", True),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": "at least"},
     "DON'T WORRY, a WELL-KNOWN tea", False),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "at least"},
     "이 제품은 AI가 추천한 차입니다", True),  # AI가 is in capitals  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "less than"},
     "이 제품은 AI가 추천한 차입니다", False),  # fmt: skip
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "at least"},
     "녹차는 몸에 좋습니다", False),  # Korean has no case  # fmt: skip
]


@pytest.mark.parametrize(("iid", "kwargs", "response", "expected"), CASES)
def test_verifier_case(iid: str, kwargs: dict, response: str, expected: bool) -> None:
    assert check(iid, response, kwargs) is expected
    if expected:
        assert check_loose(iid, response, kwargs)  # loose accepts whatever strict accepts


def test_verifiers_cover_googles_25_ids_and_ours() -> None:
    assert len(GOOGLE_IFEVAL_IDS) == len(set(GOOGLE_IFEVAL_IDS)) == 25
    assert set(VERIFIERS) == {*GOOGLE_IFEVAL_IDS, "cascade_repro:numbered_list"}
    # Ids of this project's own are in its namespace, never in Google's.
    assert [i for i in VERIFIERS if i not in GOOGLE_IFEVAL_IDS] == ["cascade_repro:numbered_list"]


def test_every_verifier_has_pass_and_fail_cases_in_both_languages() -> None:
    shipped = {i for r in load_prompt_set("ko-ifeval-style").records for i in r.instruction_id_list}
    assert shipped <= set(VERIFIERS)
    assert "detectable_format:numbered_list" not in shipped  # the shipped set uses the new id
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
        # an intro paragraph: without the first line, paragraph 1 starts with the word
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "tea"},
         "Sure, here it is:\n\nTea is old.\n\nCoffee is newer."),  # fmt: skip
        # a closing line after the two responses
        ("combination:two_responses", {}, "녹차입니다.\n******\n홍차입니다.\n******\n(끝)"),
        # a bold answer line: the option only appears once the stars are removed
        ("detectable_format:constrained_response", {}, "**My answer is** yes."),
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
    unknown = score_response({"instruction_id_list": ["x:unknown"], "kwargs": [{}]}, "hi")
    assert unknown["strict"] is None and unknown["per_instruction"][0]["error"] == "no verifier for 'x:unknown'"
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


# --- the old numbered-list id, kwargs no verifier can use, unscorable prompts ---------------------------


def test_old_numbered_list_id_is_an_alias() -> None:
    assert ALIASES == {"detectable_format:numbered_list": "cascade_repro:numbered_list"}
    assert canonical_id("detectable_format:numbered_list") == "cascade_repro:numbered_list"
    assert canonical_id("punctuation:no_comma") == "punctuation:no_comma"
    for text, expected in (("1. 물\n2. 차", True), ("1. 물", False)):
        for iid in ALIASES:
            assert check(iid, text, {"num_items": 2}) is check(ALIASES[iid], text, {"num_items": 2}) is expected
    # An old run's prompt record still scores, under the id it was written with.
    old = {"instruction_id_list": ["detectable_format:numbered_list"], "kwargs": [{"num_items": 2}]}
    s = score_response(old, "1. 물\n2. 차")
    assert (s["strict"], s["per_instruction"][0]["id"]) == (True, "detectable_format:numbered_list")


def test_old_prompt_file_with_the_old_id_scores(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    rec = {"key": "a", "prompt": "번호를 매기세요", "instruction_id_list": ["detectable_format:numbered_list"],
           "kwargs": [{"num_items": 2}]}  # fmt: skip
    path.write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    records = load_prompt_set(str(path)).records
    assert unknown_instruction_ids(records) == {}
    assert score_response(records[0], "1. 물\n2. 차")["strict"] is True


@pytest.mark.parametrize(
    ("iid", "kwargs", "problem"),
    [
        ("language:response_language", {"language": "de"}, "language 'de' cannot be told from English by script"),
        ("language:response_language", {"language": "zh-cn"}, "language 'zh-cn' cannot be decided by script"),
        ("language:response_language", {"language": "xx"}, "language 'xx' cannot be decided by script"),
        ("language:response_language", {}, "missing a required argument: 'language'"),
        ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 2, "let_relation": "at least"},
         "letter must be one character, not 'ab'"),  # fmt: skip
        ("keywords:letter_frequency", {"letter": "a", "let_frequency": 2, "let_relation": "at most"},
         "relation must be one of ('less than', 'at least'), not 'at most'"),  # fmt: skip
        ("change_case:capital_word_frequency", {"capital_frequency": 2.5, "capital_relation": "at least"},
         "capital_frequency must be a whole number, not 2.5"),  # fmt: skip
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 0, "first_word": "a"},
         "nth_paragraph counts from 1, not 0"),  # fmt: skip
        ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": "many"},
         "num_sections must be a whole number, not 'many'"),  # fmt: skip
    ],
)
def test_kwargs_no_response_can_satisfy_raise_for_every_response(iid: str, kwargs: dict, problem: str) -> None:
    assert kwargs_problem(iid, kwargs) == problem
    for response in ("", "   ", "Banana 녹차", "SECTION 1 a SECTION 2 b"):  # the blank one too
        with pytest.raises(ValueError, match="bad kwargs"):
            check(iid, response, kwargs)
    s = score_response({"instruction_id_list": [iid], "kwargs": [kwargs]}, "Banana")
    assert s["strict"] is None and s["per_instruction"][0]["error"].endswith(problem)


def test_usable_kwargs_have_no_problem() -> None:
    assert kwargs_problem("language:response_language", {"language": "KO"}) is None  # any case
    assert kwargs_problem("length_constraints:number_words", {"relation": "at least", "num_words": "50"}) is None
    assert kwargs_problem("punctuation:no_comma", {"num_words": None, "foo": 1}) is None  # extra kwargs ignored
    with pytest.raises(KeyError):
        kwargs_problem("x:unknown", {})


def test_scripts_of_letters() -> None:
    assert [script_of(ch) for ch in "가ㄱあアｱ一々Жاकกα"] == [
        "HANGUL", "HANGUL", "HIRAGANA", "KATAKANA", "KATAKANA", "CJK", "CJK", "CYRILLIC", "ARABIC",
        "DEVANAGARI", "THAI", "GREEK",
    ]  # fmt: skip


UNSCORABLE = [
    {"instruction_id_list": ["x:unknown", "punctuation:no_comma"], "kwargs": [{}, {}]},
    {"instruction_id_list": ["x:unknown", "x:unknown"]},  # one prompt, counted once
    {"instruction_id_list": ["y:other"]},
    {"instruction_id_list": ["language:response_language"], "kwargs": [{"language": "de"}]},
    {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"relation": "more than", "num_words": 5}]},
    {"instruction_id_list": ["x:unknown", "language:response_language"], "kwargs": [{}, {"language": "de"}]},
    {"instruction_id_list": ["detectable_format:numbered_list"], "kwargs": [{"num_items": 2}]},  # alias: scorable
    {"instruction_id_list": ["language:response_language"], "kwargs": [{"language": "ko"}]},  # scorable
    {"prompt": "no instructions"},  # nothing to score: not counted
]


def test_unscorable_counts_and_names_prompts() -> None:
    assert unknown_instruction_ids(UNSCORABLE) == {"x:unknown": 3, "y:other": 1}
    u = unscorable(UNSCORABLE)
    assert u == Unscorable(
        n_prompts=9,
        n_unscored=6,
        unknown_ids={"x:unknown": 3, "y:other": 1},
        bad_kwargs={
            "language:response_language: language 'de' cannot be told from English by script": 2,
            "length_constraints:number_words: relation must be one of ('less than', 'at least'), not 'more than'": 1,
        },
    )
    assert u.note() == (
        "IFEval: 6 of 9 prompts not scored (no verifier for x:unknown (3 prompts), y:other (1 prompt); "
        "kwargs no verifier can use: language:response_language: language 'de' cannot be told from English "
        "by script (2 prompts), length_constraints:number_words: relation must be one of ('less than', "
        "'at least'), not 'more than' (1 prompt))."
    )
    # The same prompts are the ones score_response leaves unscored, whatever the response.
    unscored = [i for i, r in enumerate(UNSCORABLE) if score_response(r, "1. 녹차\n2. 홍차")["strict"] is None]
    assert unscored == [0, 1, 2, 3, 4, 5, 8]  # 8 has no instructions


def test_unscorable_without_problems() -> None:
    shipped = load_prompt_set("ko-ifeval-style").records
    assert unscorable(shipped) == Unscorable(n_prompts=len(shipped))
    assert unscorable(shipped).note() is None and unknown_instruction_ids(shipped) == {}
    assert unscorable([]).note() is None
    one = unscorable([{"instruction_id_list": ["z:z"]}])
    assert one.note() == "IFEval: 1 of 1 prompt not scored (no verifier for z:z (1 prompt))."


def test_report_names_unknown_ids(tmp_path: Path) -> None:
    from cascade_repro.report.load import unscorable_prompts

    root = _write_run(tmp_path / "r", GOOD)
    assert unscorable_prompts(root).note() is None  # every prompt scorable or without ids
    prompts = [*PROMPTS[:3], {**PROMPTS[3], "instruction_id_list": ["x:unknown"], "kwargs": [{}]}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), "utf-8")
    assert unscorable_prompts(root).note() == (
        "IFEval: 1 of 4 prompts not scored (no verifier for x:unknown (1 prompt))."
    )
    (root / "prompts.jsonl").unlink()
    assert unscorable_prompts(root).note() is None


def test_markdown_report_carries_the_unscored_note(tmp_path: Path) -> None:
    from cascade_repro.judge.compare import build_tables
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.report.load import load_run
    from cascade_repro.report.markdown import MarkdownFormatter
    from cascade_repro.rundir import manifest

    root = _write_run(tmp_path / "r", GOOD)
    prompts = [*PROMPTS[:3], {**PROMPTS[3], "instruction_id_list": ["x:unknown"], "kwargs": [{}]}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), "utf-8")
    run = manifest.read_manifest(root)
    for df, name in zip(build_tables(run, root, Thresholds()), (layout.CELLS, layout.PAIRS, layout.COMPARISONS),
                        strict=True):  # fmt: skip
        df.to_parquet(root / name, index=False)
    text = MarkdownFormatter().render(load_run(root))
    assert "_IFEval: 1 of 4 prompts not scored (no verifier for x:unknown (1 prompt))._" in text


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
    from cascade_repro.rundir.jsonl import JsonlWriter

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
    from cascade_repro.judge.compare import build_tables
    from cascade_repro.judge.verdicts import Thresholds

    out = {}
    for name, texts in (("same", GOOD), ("worse", BAD)):
        root = _write_run(tmp_path / name, texts)
        run = manifest.read_manifest(root)
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
    from cascade_repro.judge.compare import build_tables
    from cascade_repro.judge.verdicts import Thresholds

    root = _write_run(tmp_path / "r", BAD)
    (root / "prompts.jsonl").unlink()
    run = manifest.read_manifest(root)
    cells, pairs, _ = build_tables(run, root, Thresholds())
    assert (cells["if_n"] == 0).all() and cells["if_strict"].isna().all()
    assert pairs["p_if"].isna().all()
