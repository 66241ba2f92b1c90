"""Instruction verifiers in the style of Google IFEval, for Korean and English responses.

One function per instruction id: all 25 of Google IFEval's (:data:`GOOGLE_IFEVAL_IDS`) and one of
this project's, ``cascade_repro:numbered_list`` (``prompts/README.md`` lists the ids with their
kwargs). Each takes the response text and the instruction's kwargs, under Google's kwargs names, and
returns whether the response follows the instruction. The rules follow Google IFEval's
``instructions.py`` (``google-research/instruction_following_eval``) unless a docstring says
otherwise; the deviations exist because Korean is written differently, or because IFEval's
language detector (``langdetect``) and tokenizer (``nltk``) are not dependencies here.

Ids of this project live in the ``cascade_repro:`` namespace, so that no file claims an id Google's
list does not have (lm-eval's IFEval scorer raises ``KeyError`` on one). Older prompt files and runs
spelled the numbered-list id ``detectable_format:numbered_list``; :data:`ALIASES` still accepts it.

Kwargs that no response could make usable (a missing one, a relation other than ``less than`` /
``at least``, a count that is not a number, a language code a script test cannot decide) make
:func:`check` raise ``ValueError`` for every response, the blank one included, so a prompt carrying
them is reported as not scored (:func:`kwargs_problem`) rather than scored by a guess.

Each kwarg's type is the one its verifier's parameter declares: text (``str``), a whole number
(``int``: a JSON number, or text of one, as IFEval files sometimes have), a list of texts
(``list[str]``). ``prompts/ifeval_kwargs.py`` writes the types down (``KWARG_TYPES``, checked
against these signatures by a test) for the prompt loaders: its :func:`kwargs_type_problem` checks
only that, and they refuse a record it objects to (``end_phrase: 7`` would crash the verifier;
``keywords: "tea"`` would be read letter by letter); a record that reaches scoring all the same is not scored, like any other unusable kwargs.

Counting rules (what a word, a sentence, English and a letter's script are) and the readers of the
kwargs a count is compared by live in ``counting.py``.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable
from typing import Any

from cascade_repro.judge.ifeval.counting import (
    KANA,
    LANGUAGE_SCRIPTS,
    checked_relation,
    compare,
    count_sentences,
    count_words,
    is_english,
    language_code,
    one_letter,
    paragraph_number,
    script_of,
)

# ALIASES and kwargs_type_problem live with the kwarg types the prompt loaders check; named here too.
from cascade_repro.prompts.ifeval_kwargs import (  # noqa: F401
    ALIASES,
    SHORT,
    canonical_id,
    check_type,
    kwargs_type_problem,
)

Verifier = Callable[..., bool]

_COMMAS = (",", "\uff0c", "\u3001")  # ASCII, full-width and ideographic comma
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")


# ---------------------------------------------------------------------------------------------
# One verifier per instruction id
# ---------------------------------------------------------------------------------------------


def no_comma(response: str) -> bool:
    """punctuation:no_comma: no comma at all.

    IFEval looks for the ASCII comma only; the full-width ``，`` and the ideographic ``、`` count
    as commas here too, so a CJK comma does not slip through.
    """
    return not any(c in response for c in _COMMAS)


def english_lowercase(response: str) -> bool:
    """change_case:english_lowercase: English, and no uppercase letter (``str.islower``)."""
    return response.islower() and is_english(response)


def english_capital(response: str) -> bool:
    """change_case:english_capital: English, and no lowercase letter (``str.isupper``)."""
    return response.isupper() and is_english(response)


def number_words(response: str, relation: str, num_words: int) -> bool:
    """length_constraints:number_words: fewer than / at least N whitespace-separated words."""
    return compare(count_words(response), relation, int(num_words))


def number_sentences(response: str, relation: str, num_sentences: int) -> bool:
    """length_constraints:number_sentences: fewer than / at least N sentences (``counting.py``'s rule)."""
    return compare(count_sentences(response), relation, int(num_sentences))


def number_paragraphs(response: str, num_paragraphs: int) -> bool:
    """length_constraints:number_paragraphs: exactly N paragraphs separated by ``***`` (as IFEval).

    An empty piece before the first or after the last divider is not counted; an empty piece
    between two dividers fails the instruction.
    """
    paragraphs = re.split(r"\s?\*\*\*\s?", response)
    n = len(paragraphs)
    for i, p in enumerate(paragraphs):
        if not p.strip():
            if i in (0, len(paragraphs) - 1):
                n -= 1
            else:
                return False
    return n == int(num_paragraphs)


def number_bullet_lists(response: str, num_bullets: int) -> bool:
    """detectable_format:number_bullet_lists: exactly N Markdown bullets, ``* item`` or ``- item`` (as IFEval)."""
    stars = re.findall(r"^\s*\*[^\*].*$", response, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", response, flags=re.MULTILINE)
    return len(stars) + len(dashes) == int(num_bullets)


def numbered_list(response: str, num_items: int) -> bool:
    """cascade_repro:numbered_list (this project's, not in IFEval): exactly N numbered lines.

    Older files spell the id ``detectable_format:numbered_list`` (see :data:`ALIASES`).

    A numbered line starts (after optional spaces or tabs) with digits, a dot, at least one space
    or tab, then some text: ``1. 물을 끓입니다``. The numbers need not be consecutive.
    """
    return len(re.findall(r"^[ \t]*\d+\.[ \t]+\S", response, flags=re.MULTILINE)) == int(num_items)


def json_format(response: str) -> bool:
    """detectable_format:json_format: the whole response parses as JSON, Markdown fence allowed (as IFEval)."""
    value = (
        response.strip()
        .removeprefix("```json")
        .removeprefix("```Json")
        .removeprefix("```JSON")
        .removeprefix("```")
        .removesuffix("```")
        .strip()
    )
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def title(response: str) -> bool:
    """detectable_format:title: a non-blank title in double angle brackets on one line (as IFEval)."""
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", response))


def keyword_existence(response: str, keywords: list[str]) -> bool:
    """keywords:existence: every keyword occurs, case-insensitive, anywhere (as IFEval)."""
    return all(re.search(re.escape(k), response, flags=re.IGNORECASE) for k in keywords)


def forbidden_words(response: str, forbidden_words: list[str]) -> bool:
    """keywords:forbidden_words: none of the words occurs, case-insensitive.

    English words match on word boundaries, as in IFEval (``tea`` does not forbid ``steam``). A
    word with Hangul matches anywhere, because Korean attaches particles to the word: ``눈물이``
    and ``눈물을`` both use ``눈물``, and IFEval's ``\\b`` would miss them.
    """
    for w in forbidden_words:
        pattern = re.escape(w) if _HANGUL.search(w) else r"\b" + re.escape(w) + r"\b"
        if re.search(pattern, response, flags=re.IGNORECASE):
            return False
    return True


def keyword_frequency(response: str, keyword: str, frequency: int, relation: str) -> bool:
    """keywords:frequency: the keyword occurs fewer than / at least N times, case-insensitive substring count (as IFEval)."""
    n = len(re.findall(re.escape(keyword), response, flags=re.IGNORECASE))
    return compare(n, relation, int(frequency))


def end_checker(response: str, end_phrase: str) -> bool:
    """startend:end_checker: ends with the phrase, case-insensitive, ignoring outer spaces and ``"`` (as IFEval)."""
    return response.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def quotation(response: str) -> bool:
    """startend:quotation: the whole response is wrapped in double quotation marks.

    IFEval accepts ``"…"`` only; typographic ``“…”`` is accepted here too, since both are
    큰따옴표 in Korean.
    """
    v = response.strip()
    return len(v) > 1 and ((v[0] == '"' and v[-1] == '"') or (v[0] == "\u201c" and v[-1] == "\u201d"))


def postscript(response: str, postscript_marker: str) -> bool:
    """detectable_content:postscript: a line with the marker (``P.S.`` or ``P.P.S``) and text after it (as IFEval)."""
    value = response.lower()
    if postscript_marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif postscript_marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(postscript_marker.lower()) + r".*$"
    return bool(re.findall(pattern, value, flags=re.MULTILINE))


def repeat_prompt(response: str, prompt_to_repeat: str) -> bool:
    """combination:repeat_prompt: starts with the prompt to repeat, case-insensitive (as IFEval)."""
    return response.strip().lower().startswith(prompt_to_repeat.strip().lower())


def letter_frequency(response: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    """keywords:letter_frequency: the letter occurs fewer than / at least N times, case-insensitive (as IFEval).

    Every occurrence counts, inside words too; the letter may be a Hangul syllable. IFEval picks a
    random letter when ``letter`` is not one character; here that is a ``ValueError``.
    """
    n = response.lower().count(one_letter(letter))
    return compare(n, checked_relation(let_relation), int(let_frequency))


def response_language(response: str, language: str) -> bool:
    """language:response_language: the whole response is in the language, decided by script.

    IFEval asks ``langdetect`` and counts a text it cannot classify as following. Here the letters'
    scripts decide (``counting.py``'s rule), the same way on every machine:

    * ``en``: :func:`is_english` (at least 90% Latin letters), as ``change_case:*``.
    * ``ko`` (Hangul), ``ru``/``uk``/``bg`` (Cyrillic), ``ar``/``fa``/``ur`` (Arabic), ``hi``/``mr``/``ne``
      (Devanagari), ``bn``, ``pa``, ``gu``, ``ta``, ``te``, ``kn``, ``ml``, ``th``, ``he``, ``el``:
      more than half of the letters are in the language's script. Languages that share a script pass
      for each other (a Bulgarian answer passes ``ru``); what the check catches is an answer in
      another script, typically English.
    * ``ja``: more than half of the letters are kana or CJK ideographs, and at least one is kana.
    * ``zh``: more than half of the letters are CJK ideographs, and none is kana.
    * Any other code, Google's Latin-script ones (``es``, ``pt``, ``fr``, ``de``, ``it``, ``pl``,
      ``vi``, ``sw``, ``fi``) among them, raises ``ValueError``: the likeliest wrong answer, English,
      is in the same script, so the prompt is reported as not scored instead of guessed. So does
      ``zh-cn``/``zh-tw`` (simplified and traditional share the script).

    A response without letters does not follow (IFEval: followed, because ``langdetect`` fails).
    """
    code = language_code(language)
    if code == "en":
        return is_english(response)
    scripts = [script_of(ch) for ch in response if ch.isalpha()]
    if not scripts:
        return False
    kana = sum(1 for s in scripts if s in KANA)
    if (code == "ja" and not kana) or (code == "zh" and kana):
        return False
    in_script = sum(1 for s in scripts if s in LANGUAGE_SCRIPTS[code])
    return in_script * 2 > len(scripts)


def nth_paragraph_first_word(response: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    """length_constraints:nth_paragraph_first_word: N paragraphs, and paragraph n starts with the word.

    As IFEval: paragraphs are split on ``\\n\\n``; the count is of the non-blank pieces, but paragraph
    n is the n-th piece counted with blank ones (a blank n-th piece fails). Its first word is the first
    whitespace-separated unit with leading ``'`` and ``"`` removed, cut at the first ``. , ? ! ' "``,
    lowercased; it must equal ``first_word`` lowercased. Deviation: a ``first_word`` with Hangul
    only has to start the first word, because Korean attaches particles (``녹차는`` starts with
    ``녹차``), as in :func:`forbidden_words`.
    """
    nth = paragraph_number(nth_paragraph)
    paragraphs = re.split(r"\n\n", response)
    count = sum(1 for p in paragraphs if p.strip())
    if nth > count:
        return False
    paragraph = paragraphs[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    got = re.split(r"""[.,?!'"]""", word, maxsplit=1)[0].lower()
    want = str(first_word).lower()
    matches = got.startswith(want) if _HANGUL.search(want) else got == want
    return count == int(num_paragraphs) and matches


def number_placeholders(response: str, num_placeholders: int) -> bool:
    """detectable_content:number_placeholders: at least N ``[placeholders]`` (as IFEval).

    A placeholder is the shortest ``[…]`` within one line; ``[]`` counts too.
    """
    return len(re.findall(r"\[.*?\]", response)) >= int(num_placeholders)


CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def constrained_response(response: str) -> bool:
    """detectable_format:constrained_response: contains one of IFEval's three options, case-sensitive (as IFEval).

    The options are ``My answer is yes.``, ``My answer is no.`` and ``My answer is maybe.``; text
    around them is allowed.
    """
    value = response.strip()
    return any(option in value for option in CONSTRAINED_RESPONSES)


def number_highlighted_sections(response: str, num_highlights: int) -> bool:
    """detectable_format:number_highlighted_sections: at least N Markdown highlights (as IFEval).

    Each non-blank ``*text*`` within one line counts, and so does each non-blank ``**text**``; the
    stars of ``**text**`` only give blank ``*…*`` matches, so ``**bold**`` counts once.
    """
    singles = re.findall(r"\*[^\n\*]*\*", response)
    doubles = re.findall(r"\*\*[^\n\*]*\*\*", response)
    n = sum(1 for h in singles if h.strip("*").strip())
    n += sum(1 for h in doubles if h.removeprefix("**").removesuffix("**").strip())
    return n >= int(num_highlights)


def multiple_sections(response: str, section_spliter: str, num_sections: int) -> bool:
    """detectable_format:multiple_sections: at least N sections marked ``<spliter> <number>`` (as IFEval).

    The response is split on the spliter followed by a number (``Section 1``, ``SECTION 2``,
    ``섹션 3``; case-sensitive, spaces optional) and the pieces after the first are the sections.
    IFEval puts the spliter into the pattern as a regular expression; here it is matched literally.
    """
    pattern = r"\s?" + re.escape(str(section_spliter).strip()) + r"\s?\d+\s?"
    return len(re.split(pattern, response)) - 1 >= int(num_sections)


def two_responses(response: str) -> bool:
    """combination:two_responses: exactly two different responses separated by ``******`` (as IFEval).

    A blank piece before the first or after the last separator is ignored; a blank piece between
    two separators fails. The two responses must differ once outer whitespace is stripped.
    """
    valid = []
    pieces = response.split("******")
    for i, piece in enumerate(pieces):
        if piece.strip():
            valid.append(piece.strip())
        elif i not in (0, len(pieces) - 1):
            return False
    return len(valid) == 2 and valid[0] != valid[1]


_WORD_TOKEN = re.compile(r"\w+(?:[-'\u2019]\w+)*")


def capital_word_frequency(response: str, capital_frequency: int, capital_relation: str) -> bool:
    """change_case:capital_word_frequency: fewer than / at least N words in capitals (``str.isupper``).

    IFEval tokenizes with ``nltk.word_tokenize``; here a word is a run of word characters, hyphens
    and apostrophes joining runs (``WELL-KNOWN`` and ``DON'T`` are one word, as is ``AI가``).
    Deviations from nltk: ``DON'T`` counts once (nltk: ``DO`` and ``N'T``, twice) and ``U.S.`` twice
    (nltk: once). Korean words have no case and never count unless they carry capital Latin letters.
    """
    n = sum(1 for w in _WORD_TOKEN.findall(response) if w.isupper())
    return compare(n, checked_relation(capital_relation), int(capital_frequency))


VERIFIERS: dict[str, Verifier] = {
    "punctuation:no_comma": no_comma,
    "change_case:english_lowercase": english_lowercase,
    "change_case:english_capital": english_capital,
    "change_case:capital_word_frequency": capital_word_frequency,
    "language:response_language": response_language,
    "length_constraints:number_words": number_words,
    "length_constraints:number_sentences": number_sentences,
    "length_constraints:number_paragraphs": number_paragraphs,
    "length_constraints:nth_paragraph_first_word": nth_paragraph_first_word,
    "detectable_format:number_bullet_lists": number_bullet_lists,
    "detectable_format:json_format": json_format,
    "detectable_format:title": title,
    "detectable_format:constrained_response": constrained_response,
    "detectable_format:number_highlighted_sections": number_highlighted_sections,
    "detectable_format:multiple_sections": multiple_sections,
    "keywords:existence": keyword_existence,
    "keywords:forbidden_words": forbidden_words,
    "keywords:frequency": keyword_frequency,
    "keywords:letter_frequency": letter_frequency,
    "startend:end_checker": end_checker,
    "startend:quotation": quotation,
    "detectable_content:postscript": postscript,
    "detectable_content:number_placeholders": number_placeholders,
    "combination:repeat_prompt": repeat_prompt,
    "combination:two_responses": two_responses,
    "cascade_repro:numbered_list": numbered_list,
}
"""Instruction id → verifier(response, **kwargs)."""

GOOGLE_IFEVAL_IDS: tuple[str, ...] = (
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
)
"""The 25 instruction ids of Google IFEval, in the order of its ``instructions_registry.INSTRUCTION_DICT``."""

# Checks of kwargs that do not need the response, per verifier (beyond the generic ones in _prepare).
_KWARG_CHECKS: dict[Verifier, Callable[[dict[str, Any]], object]] = {
    response_language: lambda kw: language_code(kw["language"]),
    letter_frequency: lambda kw: one_letter(kw["letter"]),
    nth_paragraph_first_word: lambda kw: paragraph_number(kw["nth_paragraph"]),
}


def check(instruction_id: str, response: str, kwargs: dict[str, Any] | None = None) -> bool:
    """Return whether response follows one instruction (strict: the response as it is).

    An empty or blank response follows nothing, as in IFEval. Kwargs the verifier does not take are
    ignored (IFEval datasets carry extra ones), and so are null ones. Raises KeyError for an unknown
    id and ValueError for kwargs the verifier cannot use (:func:`kwargs_problem`), whatever the
    response, the blank one included.
    """
    fn, kw, problem = _prepare(instruction_id, kwargs)
    if problem is not None:
        raise ValueError(f"{instruction_id}: bad kwargs {SHORT.repr(kw)}: {problem}")
    if not response.strip():
        return False
    try:
        return bool(fn(response, **kw))
    except (TypeError, ValueError, AttributeError) as e:
        # Kwargs _prepare let through but the verifier cannot use: the prompt is not scored, and the
        # run goes on (one bad record once failed every cell's scoring, after every cell had run).
        raise ValueError(f"{instruction_id}: bad kwargs {SHORT.repr(kw)}: {e}") from None


def kwargs_problem(instruction_id: str, kwargs: dict[str, Any] | None = None) -> str | None:
    """Why no response can be scored on this instruction with these kwargs, or None when it can.

    A missing kwarg, one of another type than its verifier declares (:func:`kwargs_type_problem`;
    a count that is not a whole number among them), a relation other than ``less than``/``at
    least``, a ``letter`` that is not one character, an ``nth_paragraph`` below 1, or a language a
    script test cannot decide. Raises KeyError for an unknown id.
    """
    return _prepare(instruction_id, kwargs)[2]


def _prepare(
    instruction_id: str, kwargs: dict[str, Any] | None
) -> tuple[Verifier, dict[str, Any], str | None]:
    """The verifier, the kwargs it takes, and what is wrong with them (None: nothing)."""
    fn = VERIFIERS[canonical_id(instruction_id)]
    sig = _signature(fn)
    params = dict(list(sig.parameters.items())[1:])  # the first is the response
    kw = {k: v for k, v in (kwargs or {}).items() if k in params and v is not None}
    try:
        sig.bind("", **kw)
        for name, value in kw.items():
            check_type(name, params[name].annotation, value)
            if name.endswith("relation"):
                checked_relation(value)
        if (extra_check := _KWARG_CHECKS.get(fn)) is not None:
            extra_check(kw)
    except (TypeError, ValueError) as e:
        return fn, kw, str(e)
    return fn, kw, None


@functools.cache
def _signature(fn: Verifier) -> inspect.Signature:
    return inspect.signature(fn)


def loose_variants(response: str) -> list[str]:
    """The eight variants IFEval's loose accuracy tries, in IFEval's order.

    The response, without its first line, without its last line, without both; and each of these
    four with every ``*`` removed (Markdown emphasis).
    """
    lines = response.split("\n")
    remove_first = "\n".join(lines[1:]).strip()
    remove_last = "\n".join(lines[:-1]).strip()
    remove_both = "\n".join(lines[1:-1]).strip()
    return [
        response,
        response.replace("*", ""),
        remove_first,
        remove_last,
        remove_both,
        remove_first.replace("*", ""),
        remove_last.replace("*", ""),
        remove_both.replace("*", ""),
    ]


def check_loose(instruction_id: str, response: str, kwargs: dict[str, Any] | None = None) -> bool:
    """Return whether any of :func:`loose_variants` follows the instruction."""
    return any(check(instruction_id, r, kwargs) for r in loose_variants(response))
