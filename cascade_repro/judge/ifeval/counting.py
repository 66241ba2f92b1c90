"""How the IFEval verifiers count a response, and the kwargs a count is compared by.

What a word, a sentence, an English text and a letter's script are (the rules below, each a
function here that the verifiers in ``verifiers.py`` call), which language codes a script test can
decide (:data:`LANGUAGE_SCRIPTS`), and the kwargs values that no response could make usable (a
relation other than ``less than`` / ``at least``, a letter that is not one character, a paragraph
number below 1, an undecidable language): each reader raises ``ValueError`` for those, which
``verifiers.check`` turns into a prompt not scored.

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
* **English** (``change_case:*``, and ``language:response_language`` with ``en``): at least 90% of
  the letters are Latin-script letters. IFEval asks ``langdetect``; a script test gives the same
  answer for the Korean/English distinction this set needs, and the same answer on every machine.
* **Script** of a letter: the first word of its Unicode name (``HANGUL``, ``CYRILLIC``, ``CJK``, …;
  ``HALFWIDTH``/``FULLWIDTH`` skipped, the ideographic iteration mark ``々`` counted as ``CJK``).
"""

from __future__ import annotations

import re
import unicodedata

LESS_THAN = "less than"
AT_LEAST = "at least"
RELATIONS = (LESS_THAN, AT_LEAST)
ENGLISH_MIN_LATIN_SHARE = 0.9

_SENTENCE_END = re.compile(r"[.?!\u3002\uff1f\uff01\u2026]+|\n")
_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")


def compare(count: int, relation: str, n: int) -> bool:
    """Whether ``count`` is ``less than`` / ``at least`` ``n``; ValueError for any other relation."""
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


def script_of(ch: str) -> str:
    """The script of one letter by the rule in the module docstring (``""`` for an unnamed character)."""
    words = unicodedata.name(ch, "").split()
    if words[:1] in (["HALFWIDTH"], ["FULLWIDTH"]):
        words = words[1:]
    first = words[0].split("-")[0] if words else ""
    return "CJK" if first == "IDEOGRAPHIC" else first


# language:response_language codes decided by the script of the letters: code -> scripts that count.
# Google's list (instructions_util.LANGUAGE_CODES) has 30 codes; those written in a script other
# than Latin are here, plus el and zh, whose scripts are unambiguous.
KANA = ("HIRAGANA", "KATAKANA")
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    "ko": ("HANGUL",),
    "ja": (*KANA, "CJK"),
    "zh": ("CJK",),
    "ru": ("CYRILLIC",),
    "uk": ("CYRILLIC",),
    "bg": ("CYRILLIC",),
    "ar": ("ARABIC",),
    "fa": ("ARABIC",),
    "ur": ("ARABIC",),
    "hi": ("DEVANAGARI",),
    "mr": ("DEVANAGARI",),
    "ne": ("DEVANAGARI",),
    "bn": ("BENGALI",),
    "pa": ("GURMUKHI",),
    "gu": ("GUJARATI",),
    "ta": ("TAMIL",),
    "te": ("TELUGU",),
    "kn": ("KANNADA",),
    "ml": ("MALAYALAM",),
    "th": ("THAI",),
    "he": ("HEBREW",),
    "el": ("GREEK",),
}
"""Language code -> the scripts whose letters count as that language (``en`` uses :func:`is_english`)."""

# Google's codes written in Latin script: a script test cannot tell them from English.
LATIN_SCRIPT_CODES = ("es", "pt", "fr", "de", "it", "pl", "vi", "sw", "fi")


def language_code(language: str) -> str:
    """The normalised code when a script test can decide it; ValueError otherwise."""
    code = str(language).strip().lower()
    if code == "en" or code in LANGUAGE_SCRIPTS:
        return code
    if code in LATIN_SCRIPT_CODES:
        raise ValueError(f"language {language!r} cannot be told from English by script")
    raise ValueError(f"language {language!r} cannot be decided by script")


def checked_relation(relation: str) -> str:
    """The relation itself, when it is ``less than`` or ``at least``; ValueError otherwise."""
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, not {relation!r}")
    return relation


def one_letter(letter: str) -> str:
    """The letter lower-cased, when it is one character; ValueError otherwise."""
    value = str(letter).strip().lower()
    if len(value) != 1:
        raise ValueError(f"letter must be one character, not {letter!r}")
    return value


def paragraph_number(nth_paragraph: int) -> int:
    """The paragraph number, counted from 1; ValueError below 1 or for a value that is not one."""
    n = int(nth_paragraph)
    if n < 1:
        raise ValueError(f"nth_paragraph counts from 1, not {nth_paragraph!r}")
    return n
