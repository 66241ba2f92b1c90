"""The reference pass applies a run's sampling penalties as vLLM's sampler does: checked against a
plain loop over vLLM's definition, and through the reference model's two ways of scoring. A tiny
random Llama stands in for the model (what is checked is the arithmetic and which tokens count)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cascade_repro.run.penalties import Penalties  # noqa: E402
from cascade_repro.run.reference import ReferenceModel  # noqa: E402

VOCAB = 97


def vllm_step(logits, prompt, out, rep, freq, pres):
    """One step as vllm/model_executor/layers/utils.py's apply_penalties computes it, element by element."""
    x = logits.clone()
    for v in range(x.shape[0]):
        if v in prompt or v in out:
            x[v] = x[v] / rep if x[v] > 0 else x[v] * rep
        x[v] -= freq * out.count(v)
        x[v] -= pres * (1.0 if v in out else 0.0)
    return x


@pytest.mark.parametrize(("rep", "freq", "pres"), [(1.3, 0.0, 0.0), (0.8, 0.0, 0.0), (1.2, 0.4, -0.3)])
def test_each_position_sees_the_prompt_and_the_output_before_it(rep, freq, pres):
    rng = random.Random(3)
    prompt = [rng.randrange(20) for _ in range(6)]
    gen = [rng.randrange(30) for _ in range(9)]  # repeats on purpose
    logits = torch.randn((len(gen), VOCAB), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = Penalties(rep, freq, pres).apply(logits, prompt, gen)
    for t in range(len(gen)):
        want = vllm_step(logits[t], prompt, gen[:t], rep, freq, pres)
        assert torch.allclose(got[t], want, rtol=0, atol=1e-12), t
    assert not torch.equal(got, logits)


def test_no_penalty_leaves_the_reference_alone():
    assert Penalties.of({}) is None
    assert Penalties.of({"repetition_penalty": 1.0}) is None
    assert Penalties.of({"repetition_penalty": 1.5}) == Penalties(1.5, 0.0, 0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def test_the_reference_scores_the_penalized_distribution(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    rng = random.Random(5)
    prefix = [rng.randrange(VOCAB) for _ in range(12)]
    own = [rng.randrange(VOCAB) for _ in range(5)]
    gens = [[rng.randrange(VOCAB) for _ in range(n)] for n in (6, 3)]
    plain = ReferenceModel(tiny, "fp64", "cpu", 3, False)
    model = ReferenceModel(tiny, "fp64", "cpu", 3, False)
    model.penalties = Penalties(1.4, 0.1, 0.2)
    together = model.score_prompt(prefix, own, gens)
    alone = [model.score(prefix, [(own, g)])[0] for g in gens]
    assert [r.lp for r in together] == [r.lp for r in alone]
    # By hand: the model's logits over prompt + generation, penalized step by step, then log_softmax.
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float64).eval()
    for gen, row in zip(gens, together, strict=True):
        ids = torch.tensor([prefix + own + gen])
        with torch.no_grad():
            logits = hf(ids).logits[0, len(prefix) + len(own) - 1 : -1]
        want = torch.log_softmax(model.penalties.apply(logits, prefix + own, gen), dim=-1)
        chosen = want.gather(1, torch.tensor(gen)[:, None])[:, 0].tolist()
        assert row.lp == pytest.approx(chosen, abs=1e-7)
        assert row.top_ids == want.topk(3, dim=-1).indices.tolist()
    unpenalized = plain.score_prompt(prefix, own, gens)
    assert [r.lp for r in unpenalized] != [r.lp for r in together]
