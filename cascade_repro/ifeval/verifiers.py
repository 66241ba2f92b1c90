"""Instruction verifiers in the style of Google IFEval, for Korean and English responses.

One function per instruction id used in the shipped ``ko-ifeval-style`` set (``prompts/README.md``
lists them with their kwargs). Each takes the response text and the instruction's kwargs and
returns whether the response follows the instruction. The rules follow Google IFEval's
``instructions.py`` (``google-research/instruction_following_eval``) unless a docstring says
otherwise; the deviations exist because Korean is written differently, or because IFEval's
language detector (``langdetect``) is not a dependency here.

Counting rules, stated once:

* **Word**: a whitespace-separated unit (``str.split()``). In Korean that is an 어절 (a word with
  its particles attached: ``녹차를`` is one word), in English an ordinary word; punctuation stays
  attached to its word. IFEval counts ``\\w+`` runs instead, which would split ``don't`` in two and
  make Korean counts depend on punctuation.
* **Sentence**: a stretch of text between sentence ends that contains at least one letter. Sentence
  ends are ``.``, ``?``, ``!``, ``。``, ``？``, ``！``, ``…`` (a run such as ``?!`` or ``...`` ends one
  sentence) and line breaks. A period between two digits (``3.5``) is not a sentence end; a piece
  with no letter (the ``1`` of ``1. 물을 끓입니다.``) is not a sentence. Abbreviations are not
  recognised: ``P.S.`` splits like any other period (IFEval uses an English abbreviation list).
* **English** (``change_case:*``): at least 90% of the letters are Latin-script letters. IFEval asks
  ``langdetect``; a script test gives the same answer for the Korean/English distinction this set
  needs, and the same answer on every machine.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

Verifier = Callable[..., bool]

LESS_THAN = "less than"
AT_LEAST = "at least"
RELATIONS = (LESS_THAN, AT_LEAST)
ENGLISH_MIN_LATIN_SHARE = 0.9

_COMMAS = (",", "\uff0c", "\u3001")  # ASCII, full-width and ideographic comma
_SENTENCE_END = re.compile(r"[.?!\u3002\uff1f\uff01\u2026]+|\n")
_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")


def _compare(count: int, relation: str, n: int) -> bool:
    if relation == LESS_THAN:
        return count < n
    if relation == AT_LEAST:
        return count >= n
    raise ValueError(f"relation must be one of {RELATIONS}, not {relation!r}")


def count_words(text: str) -> int:
    """Count whitespace-separated units (Korean 어절, English words)."""
    return len(text.split())


def split_sentences(text: str) -> list[str]:
    """Split text into sentences by the rule in the module docstring (Korean and English alike)."""
    protected = _DECIMAL_POINT.sub("\x00", text)
    pieces = _SENTENCE_END.split(protected)
    return [p.replace("\x00", ".").strip() for p in pieces if any(ch.isalpha() for ch in p)]


def count_sentences(text: str) -> int:
    """Count sentences by :func:`split_sentences`."""
    return len(split_sentences(text))


def is_english(text: str) -> bool:
    """Return True when at least 90% of the letters are Latin-script letters (and there is a letter)."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return False
    latin = sum(1 for ch in letters if unicodedata.name(ch, "").startswith("LATIN"))
    return latin / len(letters) >= ENGLISH_MIN_LATIN_SHARE


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
    return _compare(count_words(response), relation, int(num_words))


def number_sentences(response: str, relation: str, num_sentences: int) -> bool:
    """length_constraints:number_sentences: fewer than / at least N sentences (module docstring rule)."""
    return _compare(count_sentences(response), relation, int(num_sentences))


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
    """detectable_format:numbered_list (custom, not in IFEval): exactly N numbered lines.

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
    return _compare(n, relation, int(frequency))


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


VERIFIERS: dict[str, Verifier] = {
    "punctuation:no_comma": no_comma,
    "change_case:english_lowercase": english_lowercase,
    "change_case:english_capital": english_capital,
    "length_constraints:number_words": number_words,
    "length_constraints:number_sentences": number_sentences,
    "length_constraints:number_paragraphs": number_paragraphs,
    "detectable_format:number_bullet_lists": number_bullet_lists,
    "detectable_format:numbered_list": numbered_list,
    "detectable_format:json_format": json_format,
    "detectable_format:title": title,
    "keywords:existence": keyword_existence,
    "keywords:forbidden_words": forbidden_words,
    "keywords:frequency": keyword_frequency,
    "startend:end_checker": end_checker,
    "startend:quotation": quotation,
    "detectable_content:postscript": postscript,
    "combination:repeat_prompt": repeat_prompt,
}
"""Instruction id → verifier(response, **kwargs)."""


def check(instruction_id: str, response: str, kwargs: dict[str, Any] | None = None) -> bool:
    """Return whether response follows one instruction (strict: the response as it is).

    An empty or blank response follows nothing, as in IFEval. Kwargs the verifier does not take are
    ignored (IFEval datasets carry extra ones). Raises KeyError for an unknown id and ValueError
    for missing or malformed kwargs.
    """
    fn = VERIFIERS[instruction_id]
    sig = _signature(fn)
    names = list(sig.parameters)[1:]  # the first is the response
    kw = {k: v for k, v in (kwargs or {}).items() if k in names and v is not None}
    try:
        sig.bind(response, **kw)
    except TypeError as e:
        raise ValueError(f"{instruction_id}: bad kwargs {kw!r}: {e}") from None
    if not response.strip():
        return False
    try:
        return bool(fn(response, **kw))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{instruction_id}: bad kwargs {kw!r}: {e}") from None


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
