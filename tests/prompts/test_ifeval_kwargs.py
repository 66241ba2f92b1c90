"""prompts/ifeval_kwargs.py's table of kwarg types is the verifiers' signatures, written down."""

from __future__ import annotations

import inspect

from cascade_repro.judge.ifeval.verifiers import VERIFIERS
from cascade_repro.prompts.ifeval_kwargs import ALIASES, KWARG_TYPES, kwargs_type_problem


def test_the_table_matches_the_verifiers_signatures():
    signatures = {
        iid: {name: p.annotation for name, p in list(inspect.signature(fn).parameters.items())[1:]}
        for iid, fn in VERIFIERS.items()
    }
    assert KWARG_TYPES == signatures
    for iid in KWARG_TYPES:  # the same order, so a message names the same first bad kwarg
        assert list(KWARG_TYPES[iid]) == list(signatures[iid]), iid


def test_every_alias_names_a_known_instruction():
    assert set(ALIASES.values()) <= set(KWARG_TYPES)


def test_a_kwarg_of_the_wrong_type_is_named():
    assert kwargs_type_problem("startend:end_checker", {"end_phrase": 7}) == "end_phrase must be text, not 7"
    assert "keywords must be a list of texts" in kwargs_type_problem("keywords:existence", {"keywords": "tea"})
    assert kwargs_type_problem("detectable_format:numbered_list", {"num_items": "3"}) is None
    assert kwargs_type_problem("detectable_format:numbered_list", {"num_items": 2.5}) is not None
    assert kwargs_type_problem("x:unknown", {"end_phrase": 7}) is None
