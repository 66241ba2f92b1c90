"""vLLM's flat logprobs (SamplingParams(flat_logprobs=True)) convert to exactly what the dict form
gives, and the engine asks for them where vLLM's SamplingParams has the field."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cascade_repro import vllm_surface
from cascade_repro.engines.base import completion_text
from cascade_repro.engines.vllm import (
    VLLMEngine,
    completion_of,
    flat_topk,
    topk_by_position,
    topk_entries,
    uniform_topk,
    vllm_text,
)


def _fake_logprobs():
    """The fake vLLM's ``vllm.logprobs`` (vLLM 0.26.0's Logprob and FlatLogprobs), loaded by path."""
    path = Path(__file__).parents[1] / "fake_vllm" / "vllm" / "logprobs.py"
    spec = importlib.util.spec_from_file_location("fake_vllm_logprobs", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


_LP = _fake_logprobs()
Lp, FlatLogprobs = _LP.Logprob, _LP.FlatLogprobs


def flat_of(positions: list[list[tuple[int, float, int]]]) -> FlatLogprobs:
    flat = FlatLogprobs()
    for entries in positions:
        flat.append_fast([t for t, _, _ in entries], [v for _, v, _ in entries], [r for _, _, r in entries],
                         [None] * len(entries))  # fmt: skip
    return flat


def draw(rng: random.Random, n: int, k: int, outside: float, ties: bool):
    """One request as vLLM hands it over: the dict form (append_logprobs_for_next_position's dict
    branch: sampled first, then the top-k, a repeated id overwritten) and the flat form."""
    token_ids, dicts, positions = [], [], []
    for _ in range(n):
        ids = rng.sample(range(1000), k + 1)
        vals = sorted((round(-abs(rng.gauss(0, 2)), 1 if ties else 6) for _ in range(k + 1)), reverse=True)
        top = [(ids[r], vals[r], r + 1) for r in range(k)]
        sampled = (ids[k], vals[k] - 0.25, k + 1 + rng.randrange(40)) if rng.random() < outside else top[0]
        entries = [sampled, *top]
        dicts.append({t: Lp(v, r) for t, v, r in entries})
        positions.append(entries)
        token_ids.append(sampled[0])
    return token_ids, dicts, flat_of(positions)


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("k", [1, 5, 20])
@pytest.mark.parametrize("ties", [False, True])
def test_flat_equals_dict_form(k: int, ties: bool):
    rng = random.Random(k * 7 + ties)
    for _ in range(20):
        token_ids, dicts, flat = draw(rng, 64, k, outside=0.3, ties=ties)
        lps, topk = flat_topk(flat, token_ids, k)
        want = [topk_entries(d, t, k) for d, t in zip(dicts, token_ids, strict=True)]
        assert same(lps, [c for c, _ in want])
        assert topk == [t for _, t in want]


@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_whole_list_path_takes_vllms_layout_and_gives_what_the_loop_gives(k: int):
    rng = random.Random(k)
    for outside in (0.0, 0.3, 1.0):
        token_ids, _, flat = draw(rng, 128, k, outside=outside, ties=k == 5)
        fast = uniform_topk(flat, token_ids, k)
        assert fast is not None  # every position has all k entries: the layout vLLM gives
        lps, topk = topk_by_position(flat, token_ids, k)
        assert same(fast[0], lps) and fast[1] == topk
        assert [type(v) for row in fast[1] for _, v in row] == [float] * (128 * k)


def _spoil(flat, how: str, rng: random.Random) -> None:
    """Lay one position out otherwise, each way the whole-list path must notice."""
    i = rng.randrange(1, len(flat) - 1)
    s, e = flat.start_indices[i], flat.end_indices[i]
    if how == "short":  # a position with fewer than k entries
        for col in (flat.token_ids, flat.logprobs, flat.ranks, flat.decoded_tokens):
            del col[e - 1]
        flat.end_indices[i] -= 1
        for j in range(i + 1, len(flat)):
            flat.start_indices[j] -= 1
            flat.end_indices[j] -= 1
    elif how == "first":  # the first entry is not the sampled token
        flat.token_ids[s] = 100_000
    elif how == "rank":  # ranks not 1..k in order
        flat.ranks[s + 1], flat.ranks[s + 2] = flat.ranks[s + 2], flat.ranks[s + 1]
    elif how == "int":  # a logprob that is not a float: the loop writes float(v)
        flat.logprobs[s + 1] = 0
    elif how == "fewer":  # fewer positions than tokens
        for col in (flat.start_indices, flat.end_indices):
            del col[-1]


@pytest.mark.parametrize("how", ["short", "first", "rank", "int", "fewer"])
def test_any_other_layout_falls_back_to_the_loop(how: str):
    rng = random.Random(how)
    for _ in range(10):
        token_ids, _, flat = draw(rng, 32, 5, outside=0.3, ties=False)
        _spoil(flat, how, rng)
        assert uniform_topk(flat, token_ids, 5) is None
        want = topk_by_position(flat, token_ids, 5)
        got = flat_topk(flat, token_ids, 5)
        assert same(got[0], want[0]) and got[1] == want[1]
    assert uniform_topk(FlatLogprobs(), [], 5) is None


def test_a_position_laid_out_otherwise_goes_through_the_dict_form():
    flat = flat_of([
        [(7, -0.1, 1), (7, -0.1, 1), (8, -2.0, 2)],
        [(9, -3.0, 2), (8, -0.5, 1), (9, -3.0, 2)],  # the first entry is not the sampled token
    ])  # fmt: skip
    lps, topk = flat_topk(flat, [7, 8, 5], 2)  # and a third token without logprobs
    assert lps[:2] == [-0.1, -0.5] and math.isnan(lps[2])
    assert topk == [[[7, -0.1], [8, -2.0]], [[8, -0.5], [9, -3.0]], []]


def test_completion_reads_either_form():
    rng = random.Random(3)
    token_ids, dicts, flat = draw(rng, 16, 5, outside=0.5, ties=False)

    def out(lps):
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids, text="t", finish_reason="length", logprobs=lps)])

    a, b = completion_of(out(dicts), 5), completion_of(out(flat), 5)
    assert a.topk == b.topk and same(a.logprobs, b.logprobs) and a.token_ids == b.token_ids


def test_sampling_fields_of_a_struct_and_of_a_plain_class():
    class Struct:  # msgspec.Struct keeps its fields here
        __struct_fields__ = ("max_tokens", "logprobs", "flat_logprobs")

    class Plain:
        def __init__(self, max_tokens=16, logprobs=None):
            pass

    assert vllm_surface.FLAT_LOGPROBS in vllm_surface.sampling_fields(Struct)
    assert vllm_surface.sampling_fields(Plain) == {"max_tokens", "logprobs"}


def test_the_engine_asks_for_flat_logprobs_where_vllm_has_them(fake_vllm):
    from vllm import SamplingParams

    assert vllm_surface.FLAT_LOGPROBS in vllm_surface.sampling_fields(SamplingParams)
    shim = SimpleNamespace(topk=5, flat_logprobs=True)
    assert VLLMEngine.logprob_kwargs(shim) == {"logprobs": 5, "flat_logprobs": True}
    shim.flat_logprobs = False  # a vLLM before 0.11.1
    assert VLLMEngine.logprob_kwargs(shim) == {"logprobs": 5}


class _Tok:
    """Records what the engine asks a tokenizer to decode."""

    def __init__(self):
        self.calls = []

    def decode(self, ids, skip_special_tokens=False):
        self.calls.append((list(ids), skip_special_tokens))
        return "|".join(map(str, ids))


def test_completion_text_skips_special_tokens_and_the_stopping_token():
    tok = _Tok()
    assert completion_text(tok, [5, 6, 2], "stop") == "5|6"  # the EOS that stopped it is not text
    assert completion_text(tok, [5, 6, 2], "length") == "5|6|2"
    assert completion_text(tok, [], "stop") == ""
    assert tok.calls == [([5, 6], True), ([5, 6, 2], True), ([], True)]


def test_the_engine_decodes_the_text_where_vllm_can_skip_it():
    c = SimpleNamespace(token_ids=[7, 8, 2], text="", finish_reason="stop", logprobs=None)
    out = SimpleNamespace(outputs=[c])
    tok = _Tok()
    here = SimpleNamespace(topk=5, flat_logprobs=True, decode_here=True, _text_tokenizer=None,
                           tokenizer=lambda: tok)  # fmt: skip
    here.logprob_kwargs = lambda: VLLMEngine.logprob_kwargs(here)
    assert VLLMEngine.output_kwargs(here) == {"logprobs": 5, "flat_logprobs": True, "detokenize": False}
    here.decode_here = False
    assert VLLMEngine.output_kwargs(here) == {"logprobs": 5, "flat_logprobs": True}
    assert VLLMEngine._decoded(here, c, [7, 8, 2], "stop") == "7|8"
    assert VLLMEngine._decoded(here, c, [7, 8], "length") == "7|8"
    assert len(tok.calls) == 2 and here._text_tokenizer is tok  # asked for once, then kept
    # A vLLM without SamplingParams.detokenize keeps its own text (run_wave's choice when not decode_here).
    assert vllm_text(SimpleNamespace(text="vllm's"), [7], "length") == "vllm's"
    assert completion_of(out, 5, lambda c, ids, finish: f"{ids}/{finish}").text == "[7, 8, 2]/stop"
