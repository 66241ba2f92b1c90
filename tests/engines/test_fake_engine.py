"""The fake engine (engines/fake.py): deterministic, batch-invariant, arms equal, faults where cascade runs."""

from __future__ import annotations

from cascade_repro.engines import get
from cascade_repro.engines.fake import ByteTokenizer, FakeEngine
from cascade_repro.prompts.chat import measure_prefix

TOK = ByteTokenizer()
SYSTEM = "Answer in one short sentence. " * 12  # > 256 bytes: a prefix cascade can run on


def prompts(n: int) -> tuple[list[list[int]], int]:
    measured = measure_prefix(TOK, SYSTEM, [f"question number {i}?" for i in range(n)])
    return measured.rendered, measured.tokens


def test_registered_without_weights_and_resumable_by_wave():
    info = get("fake")
    assert not info.has_weights and info.exact_wave_resume and not info.is_vllm
    assert isinstance(info.own_tokenizer(), ByteTokenizer)


def test_tokenizer_renders_a_chat_and_decodes_without_special_tokens():
    ids = TOK.apply_chat_template([{"role": "user", "content": "héllo"}], add_generation_prompt=True)
    assert ids[0] == TOK.IM_START and ids[-len(b"assistant\n") :] == list(b"assistant\n")
    assert TOK.decode(ids, skip_special_tokens=True) == "user\nhéllo\nassistant\n"
    assert TOK.decode(ids).startswith("<|im_start|>user\nhéllo<|im_end|>")


def test_answers_do_not_depend_on_batch_or_arm_without_a_fault():
    rendered, shared = prompts(8)
    eng = FakeEngine()
    whole, stats = eng.run_wave(rendered, "cascade", 24, shared)
    # 8 requests behind a long prefix: cascade runs while all 8 are live (the first answer ends at 12+).
    assert 12 <= stats.cascade_steps < stats.total_steps == 24
    flat, flat_stats = eng.run_wave(rendered, "flat", 24, shared)
    alone = [eng.run_wave([p], "cascade", 24, shared)[0][0] for p in rendered]
    assert flat_stats.cascade_steps == 0
    for a, b, c in zip(whole, flat, alone, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids and a.logprobs == b.logprobs == c.logprobs
        assert a.topk == c.topk and len(a.topk[0]) == 5 and a.topk[0][0][0] == a.token_ids[0]
    assert {c.finish_reason for c in whole} <= {"stop", "length"} and len({tuple(c.token_ids) for c in whole}) == 8


def test_a_fault_moves_only_the_cascade_steps():
    rendered, shared = prompts(8)  # 10 tokens: no answer ends, so every step is a cascade step
    clean = FakeEngine().run_wave(rendered, "cascade", 10, shared)[0]
    small = FakeEngine(inject="lse-shift=0.01").run_wave(rendered, "cascade", 10, shared)[0]
    gross = FakeEngine(inject="lse-layout").run_wave(rendered, "cascade", 10, shared)[0]
    late = FakeEngine(inject="lse-layout@5").run_wave(rendered, "cascade", 10, shared)[0]
    # A small shift drifts the logprobs without flipping a token; the gross fault flips tokens.
    assert [c.token_ids for c in small] == [c.token_ids for c in clean]
    moved = [abs(x - y) for c, s in zip(clean, small, strict=True) for x, y in zip(c.logprobs, s.logprobs, strict=True)]
    assert len(moved) == 80 and 0 < min(moved) and max(moved) <= 0.01
    assert sum(c.token_ids != g.token_ids for c, g in zip(clean, gross, strict=True)) >= 6
    # A late onset leaves the tokens before it alone.
    assert all(c.token_ids[:5] == g.token_ids[:5] for c, g in zip(clean, late, strict=True))
    # Where cascade cannot run (one request) the fault changes nothing: not exercised.
    one = FakeEngine(inject="lse-layout").run_wave(rendered[:1], "cascade", 10, shared)
    assert one[1].cascade_steps == 0 and one[0][0].token_ids == clean[0].token_ids
