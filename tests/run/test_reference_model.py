"""The reference model's two ways of scoring agree: each row on its own (``score``), or a prompt's
generations together with its own tokens read once (``score_prompt``, the CPU pass). A tiny random
Llama stands in for the model: what is checked is which positions are read, not what a model knows."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cascade_repro.run.reference import ReferenceModel  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("own_len", [0, 1, 9])
def test_a_prompts_rows_score_as_they_do_one_by_one(tiny, own_len, monkeypatch, tmp_path):
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    rng = random.Random(own_len)
    model = ReferenceModel(tiny, "fp64", "cpu", 3, False)
    prefix = [rng.randrange(97) for _ in range(20)]
    own = [rng.randrange(97) for _ in range(own_len)]
    gens = [[rng.randrange(97) for _ in range(n)] for n in (5, 1, 8)]
    # A prompt with no tokens of its own after the prefix: the prefix's last token predicts the first.
    alone = [
        model.score(prefix, [(own, g)])[0] if own else model.score(prefix[:-1], [(prefix[-1:], g)])[0]
        for g in gens
    ]
    together = model.score_prompt(prefix, own, gens)
    assert [r.lp for r in together] == [r.lp for r in alone]
    assert [r.top_ids for r in together] == [r.top_ids for r in alone]
    assert [len(r.lp) for r in together] == [5, 1, 8]


def test_a_prefix_prefilled_in_chunks_gives_the_kv_and_scores_of_one_forward(tiny, monkeypatch, tmp_path):
    from transformers import DynamicCache

    from cascade_repro.run import reference_model

    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    rng = random.Random(7)
    model = ReferenceModel(tiny, "fp64", "cpu", 3, False)
    prefix = [rng.randrange(97) for _ in range(150)]
    rows = [([rng.randrange(97) for _ in range(4)], [rng.randrange(97) for _ in range(6)])]

    def prefill(step: int):
        monkeypatch.setattr(reference_model, "TOKENS_PER_BATCH", {"cpu": step, "cuda": step})
        cache = DynamicCache()
        model._extend(cache, 0, prefix)
        return cache, model._score(cache, len(prefix), rows)

    whole, scored_whole = prefill(1000)
    chunked, scored_chunked = prefill(64)  # 64 + 64 + 22
    for a, b in zip(whole.layers, chunked.layers, strict=True):
        assert a.keys.shape[-2] == b.keys.shape[-2] == 150
        assert torch.allclose(a.keys, b.keys, rtol=0, atol=1e-12)
        assert torch.allclose(a.values, b.values, rtol=0, atol=1e-12)
    assert [r.lp for r in scored_chunked] == [r.lp for r in scored_whole]  # stored to 1e-9 nats


def test_the_arms_top_k_ids_are_scored_exactly_from_the_full_distribution(tiny, monkeypatch, tmp_path):
    """``want``: per row and step, ids whose reference logprob the record keeps (``arm_ids``/``arm_lp``):
    each equals the full log-softmax's, whether or not the id is in the reference's own top-k, and
    both ways of scoring give the same numbers."""
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    rng = random.Random(3)
    model = ReferenceModel(tiny, "fp64", "cpu", 3, False)
    prefix = [rng.randrange(97) for _ in range(20)]
    own = [rng.randrange(97) for _ in range(5)]
    gens = [[rng.randrange(97) for _ in range(n)] for n in (4, 2)]
    # Each step wants its own generated token (so arm_lp must equal lp), two random ids and one
    # id the reference ranks first (so arm_lp must equal its top-1 logprob).
    plain = model.score_prompt(prefix, own, gens)
    want = [
        [{g[t], rng.randrange(97), rng.randrange(97), plain[r].top_ids[t][0]} for t in range(len(g))]
        for r, g in enumerate(gens)
    ]
    together = model.score_prompt(prefix, own, gens, want)
    alone = [model.score(prefix, [(own, g)], [w])[0] for g, w in zip(gens, want, strict=True)]
    for rows in (together, alone):
        for r, g in enumerate(gens):
            row = rows[r]
            assert row.arm_ids == [sorted(w) for w in want[r]]
            by_id = row.arm_logprobs()
            for t, tok in enumerate(g):
                assert by_id[t][tok] == pytest.approx(plain[r].lp[t], abs=1e-9)
                assert by_id[t][plain[r].top_ids[t][0]] == pytest.approx(plain[r].top_lp[t][0], abs=1e-9)
                assert all(v <= 0 for v in row.arm_lp[t])
    assert [r.arm_lp for r in together] == [r.arm_lp for r in alone]
    assert plain[0].arm_ids is None  # nothing wanted: an older record's shape
    # an id past the vocabulary (a damaged samples file) is left out, not a failed pass
    (odd,) = model.score(prefix, [(own, gens[1])], [[{3, 10_000}, set()]])
    assert odd.arm_ids == [[3], []] and len(odd.arm_lp[0]) == 1
