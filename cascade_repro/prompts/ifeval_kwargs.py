"""The type of each IFEval instruction's kwargs, read where a prompt record enters.

A record's kwargs are checked against :data:`KWARG_TYPES` when it is loaded (``end_phrase: 7`` would
crash the verifier; ``keywords: "tea"`` would be read letter by letter), so a bad file costs nothing
instead of failing scoring after every cell ran. ``judge/ifeval/verifiers.py`` checks the kwargs it
is given with the same :func:`check_type`; ``tests/prompts/test_ifeval_kwargs.py`` fails when this
table and the verifiers' signatures disagree, so a new verifier or kwarg is written here too.

Types are written as the verifiers' annotations are: ``str`` takes text, ``int`` a whole number (a
JSON number, or text of one, as IFEval files sometimes have), ``list[str]`` a list of texts.
"""

from __future__ import annotations

import reprlib
from typing import Any

KWARG_TYPES: dict[str, dict[str, str]] = {
    "punctuation:no_comma": {},
    "change_case:english_lowercase": {},
    "change_case:english_capital": {},
    "change_case:capital_word_frequency": {"capital_frequency": "int", "capital_relation": "str"},
    "language:response_language": {"language": "str"},
    "length_constraints:number_words": {"relation": "str", "num_words": "int"},
    "length_constraints:number_sentences": {"relation": "str", "num_sentences": "int"},
    "length_constraints:number_paragraphs": {"num_paragraphs": "int"},
    "length_constraints:nth_paragraph_first_word": {"num_paragraphs": "int", "nth_paragraph": "int", "first_word": "str"},
    "detectable_format:number_bullet_lists": {"num_bullets": "int"},
    "detectable_format:json_format": {},
    "detectable_format:title": {},
    "detectable_format:constrained_response": {},
    "detectable_format:number_highlighted_sections": {"num_highlights": "int"},
    "detectable_format:multiple_sections": {"section_spliter": "str", "num_sections": "int"},
    "keywords:existence": {"keywords": "list[str]"},
    "keywords:forbidden_words": {"forbidden_words": "list[str]"},
    "keywords:frequency": {"keyword": "str", "frequency": "int", "relation": "str"},
    "keywords:letter_frequency": {"letter": "str", "let_frequency": "int", "let_relation": "str"},
    "startend:end_checker": {"end_phrase": "str"},
    "startend:quotation": {},
    "detectable_content:postscript": {"postscript_marker": "str"},
    "detectable_content:number_placeholders": {"num_placeholders": "int"},
    "combination:repeat_prompt": {"prompt_to_repeat": "str"},
    "combination:two_responses": {},
    "cascade_repro:numbered_list": {"num_items": "int"},
}  # fmt: skip
"""Instruction id → {kwarg name: type}, in the order of the verifier's parameters."""

ALIASES: dict[str, str] = {"detectable_format:numbered_list": "cascade_repro:numbered_list"}
"""Old spelling → id: prompt files and runs written before the id moved to this project's namespace."""

# A kwarg's value in a message: a hostile file's 10 MB string or deep list stays one short line.
SHORT = reprlib.Repr()
SHORT.maxstring = SHORT.maxother = 60


def canonical_id(instruction_id: str) -> str:
    """The id a verifier is registered under: :data:`ALIASES` resolved, any other id unchanged."""
    return ALIASES.get(instruction_id, instruction_id)


def whole_number(name: str, value: Any) -> int:
    """``int(value)`` for a count kwarg: a whole number, or text of one (not a bool, not 2.5)."""
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        if isinstance(value, str | float | int):  # int() of a list or an object is a TypeError anyway
            return int(value)
        raise TypeError
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a whole number, not {SHORT.repr(value)}") from None


def check_type(name: str, annotation: Any, value: Any) -> None:
    """Raise ValueError when a kwarg is not of the type ``annotation`` names.

    ``str`` (or the type itself) takes text, ``int`` a whole number (:func:`whole_number`),
    ``list[str]`` a list of texts; any other annotation takes anything.
    """
    if annotation in ("str", str) and not isinstance(value, str):
        raise ValueError(f"{name} must be text, not {SHORT.repr(value)}")
    if annotation in ("int", int):
        whole_number(name, value)
    if annotation in ("list[str]", list[str]) and (
        not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value)
    ):
        raise ValueError(f"{name} must be a list of texts, not {SHORT.repr(value)}")


def kwargs_type_problem(instruction_id: str, kwargs: Any) -> str | None:
    """What is wrong with the first kwarg of a known instruction whose value is not of the type
    :data:`KWARG_TYPES` gives it, naming it; None when every one is, or the id is unknown.

    Only types: a missing kwarg, a relation or language no verifier takes, a ``letter`` of two
    characters are ``judge/ifeval/verifiers.kwargs_problem``'s, and leave the prompt unscored with
    a note.
    """
    types = KWARG_TYPES.get(canonical_id(instruction_id)) if isinstance(instruction_id, str) else None
    if types is None or not isinstance(kwargs, dict):
        return None
    for name, value in kwargs.items():
        if name in types and value is not None:
            try:
                check_type(name, types[name], value)
            except ValueError as e:
                return str(e)
    return None
