"""The reference cascade attention (engines/cascade_attention.py) and the shared prefix it relies on (chat.py).

Cascade attention must be *exactly* ordinary attention, rearranged: one pass over a single copy of
the shared prefix, one pass over each request's own suffix, merged by log-sum-exp. These tests check
that identity against PyTorch SDPA (``flat_attention``) and against a naive softmax written out
below, with the masks built the way the hf engine builds them (every KV row is
``[prefix | pads | suffix | generated]``), for grouped-query attention (9 query heads over 3 KV heads).

Inputs are seeded float64 random tensors (never zeros, which would hide mixed-up heads). The cascade
path computes in float32 like the kernels do, hence the 1e-5 tolerance against the float64 reference.
"""

from __future__ import annotations

import math

import pytest
import torch

from cascade_repro.engines import cascade_attention as ca
from cascade_repro.engines.cascade_attention import (
    CascadeState,
    cascade_attention,
    flat_attention,
    merge_attn_states,
    partial_attention,
    transpose_lse_layout,
)
from cascade_repro.errors import UsageError
from cascade_repro.prompts.chat import (
    common_prefix_len,
    measure_prefix,
    prompt_hash,
    render,
    short_prefix_warning,
)

H, KVH, D = 9, 3, 8
SCALE = 1 / math.sqrt(D)
ATOL = 1e-5  # float32 compute vs float64 reference


def naive_attention(q, k, v, mask, scale):
    """Textbook attention in float64, KV heads copied out so query head h reads KV head h // G."""
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, dim=1)
    v = v.double().repeat_interleave(g, dim=1)
    scores = (q.double() @ k.transpose(-1, -2)) * scale  # [B, H, Q, L]
    scores = scores.masked_fill(~mask, float("-inf"))  # mask [B, 1, Q, L] is the same for every head
    return torch.softmax(scores, dim=-1) @ v


def engine_batch(suffix_lens, prefix, generated=0, decode=False, seed=0):
    """Random q, k, v and the engine's mask for rows ``[prefix | pads | suffix | generated]``.

    Prefill (``decode=False``): the queries are the padded suffix block, pads included (a pad query
    sees the prefix and itself). Decode: one query per row, at the last column.
    """
    gen = torch.Generator().manual_seed(seed)
    b, s = len(suffix_lens), max(suffix_lens)
    total = prefix + s + generated
    valid = torch.zeros(b, total, dtype=torch.bool)
    valid[:, :prefix] = True
    for i, n in enumerate(suffix_lens):
        valid[i, prefix + s - n : prefix + s] = True
    valid[:, prefix + s :] = True
    nq = 1 if decode else s
    cols = torch.arange(total)
    qcol = torch.arange(total - nq, total)
    causal = cols[None, :] <= qcol[:, None]
    own = cols[None, :] == qcol[:, None]
    mask = ((causal[None] & valid[:, None, :]) | own[None])[:, None]  # [B, 1, Q, L]

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = rnd(b, H, nq, D)
    k, v = rnd(b, KVH, total, D), rnd(b, KVH, total, D)
    k[:, :, :prefix] = rnd(1, KVH, prefix, D)  # the shared prefix: identical in every row
    v[:, :, :prefix] = rnd(1, KVH, prefix, D)
    return q, k, v, mask


CASES = {
    "decode": dict(suffix_lens=[5, 3, 7, 1], prefix=40, generated=3, decode=True),
    "prefill": dict(suffix_lens=[5, 3, 7, 1], prefix=40),
    "prefill-one-row": dict(suffix_lens=[6], prefix=33),
    "decode-one-row": dict(suffix_lens=[4], prefix=32, generated=2, decode=True),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prefix_len", [0, 1, 16, 32])
def test_cascade_equals_flat_and_naive_attention(case, prefix_len):
    q, k, v, mask = engine_batch(**CASES[case], seed=prefix_len)

    naive = naive_attention(q, k, v, mask, SCALE)
    flat = flat_attention(q, k, v, mask, SCALE)
    cascade = cascade_attention(q, k, v, mask, SCALE, prefix_len)

    assert cascade.shape == flat.shape == q.shape
    assert cascade.dtype == torch.float64
    torch.testing.assert_close(flat, naive, atol=1e-12, rtol=0)
    torch.testing.assert_close(cascade, naive, atol=ATOL, rtol=0)
    assert cascade.abs().min() > 0  # a real mix of values, not an all-zero coincidence


def test_cascade_over_the_whole_shared_prefix():
    """The engine's usual case: the prefix pass covers every shared column."""
    q, k, v, mask = engine_batch([5, 2, 9, 4, 1, 3, 6, 8], prefix=48, generated=1, decode=True, seed=11)
    torch.testing.assert_close(
        cascade_attention(q, k, v, mask, SCALE, 48), naive_attention(q, k, v, mask, SCALE), atol=ATOL, rtol=0
    )


def test_cascade_reads_only_row_0_of_the_prefix():
    """One copy of the prefix KV serves every request, so other rows' prefix memory is never read."""
    q, k, v, mask = engine_batch([3, 5], prefix=16, decode=True, seed=2)
    expected = cascade_attention(q, k, v, mask, SCALE, 16)
    k2, v2 = k.clone(), v.clone()
    k2[1:, :, :16] = 1e3  # garbage in rows > 0 of the prefix
    v2[1:, :, :16] = -1e3
    torch.testing.assert_close(cascade_attention(q, k2, v2, mask, SCALE, 16), expected, atol=0, rtol=0)


def test_non_contiguous_queries_as_transformers_passes_them():
    """transformers hands over q as view(B, Q, H, D).transpose(1, 2): the GQA grouping must still hold."""
    q, k, v, mask = engine_batch([4, 2, 3], prefix=24, seed=5)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_t.is_contiguous()
    torch.testing.assert_close(
        cascade_attention(q_t, k, v, mask, SCALE, 16),
        naive_attention(q, k, v, mask, SCALE),
        atol=ATOL,
        rtol=0,
    )
    torch.testing.assert_close(
        flat_attention(q_t, k, v, mask, SCALE), naive_attention(q, k, v, mask, SCALE), atol=1e-12, rtol=0
    )


def test_low_precision_inputs_return_their_dtype_and_stay_close():
    q, k, v, mask = engine_batch([4, 2, 3], prefix=24, decode=True, seed=9)
    out = cascade_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, SCALE, 16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, mask, SCALE), atol=0.03, rtol=0)


# --- partial attention and the LSE merge ------------------------------------------------------------


def test_partial_attention_returns_the_log_sum_exp_of_the_scores():
    q, k, v, mask = engine_batch([3, 2], prefix=8, seed=3)
    out, lse = partial_attention(q, k, v, mask, SCALE)
    g = H // KVH
    for i in range(2):
        for j in range(H):
            scores = (q[i, j] @ k[i, j // g].T * SCALE).masked_fill(~mask[i, 0], float("-inf"))
            torch.testing.assert_close(lse[i, j].double(), torch.logsumexp(scores, -1), atol=1e-5, rtol=0)
    assert out.dtype == lse.dtype == torch.float32


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    q, k, v, _ = engine_batch([2], prefix=4, seed=4)
    mask = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=torch.bool)
    out, lse = partial_attention(q, k, v, mask, SCALE)
    assert torch.all(out == 0)
    assert torch.all(lse == float("-inf"))


@pytest.mark.parametrize("split", [1, 7, 19, 29])
def test_merge_of_two_partials_equals_softmax_over_the_concatenated_keys(split):
    gen = torch.Generator().manual_seed(split)
    q = torch.randn(2, H, 3, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, KVH, 30, D, generator=gen, dtype=torch.float64)
    v = torch.randn(2, KVH, 30, D, generator=gen, dtype=torch.float64)
    everything = torch.ones(2, 1, 3, 30, dtype=torch.bool)

    a_out, a_lse = partial_attention(q, k[:, :, :split], v[:, :, :split], None, SCALE)
    b_out, b_lse = partial_attention(q, k[:, :, split:], v[:, :, split:], None, SCALE)
    merged = merge_attn_states(a_out, a_lse, b_out, b_lse)

    torch.testing.assert_close(
        merged.double(), naive_attention(q, k, v, everything, SCALE), atol=ATOL, rtol=0
    )
    # The merge is symmetric in its two halves.
    torch.testing.assert_close(merge_attn_states(b_out, b_lse, a_out, a_lse), merged, atol=1e-6, rtol=0)


def test_merge_with_an_empty_side_returns_the_other_side():
    out_a = torch.tensor([[1.0, 2.0]])
    out_b = torch.tensor([[5.0, -3.0]])
    for empty in (float("-inf"), float("inf")):  # vLLM's kernels mark empty KV with +inf as well
        merged = merge_attn_states(out_a, torch.tensor([0.3]), out_b, torch.tensor([empty]))
        torch.testing.assert_close(merged, out_a)


def test_merge_weights_by_exp_lse():
    # Weights e^0 : e^ln3 = 1 : 3.
    merged = merge_attn_states(
        torch.tensor([[4.0]]), torch.tensor([0.0]), torch.tensor([[8.0]]), torch.tensor([math.log(3)])
    )
    torch.testing.assert_close(merged, torch.tensor([[7.0]]))


# --- the fault injection: LSE read in the wrong layout ----------------------------------------------


def test_transpose_lse_layout_small_example():
    """[B=1, H=2, Q=3] LSE 10*h + q, written token-major ([0,10,1,11,2,12]) and read head-major."""
    lse = torch.tensor([[[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]])
    assert transpose_lse_layout(lse).tolist() == [[[0.0, 10.0, 1.0], [11.0, 2.0, 12.0]]]


def test_transpose_lse_layout_is_a_transpose_when_heads_equal_tokens():
    lse = torch.randn(
        2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )  # T = B*Q = 6 = H
    once = transpose_lse_layout(lse)
    assert not torch.equal(once, lse)
    assert torch.equal(transpose_lse_layout(once), lse)  # an involution only when H == T


@pytest.mark.parametrize(("b", "h", "q"), [(2, 9, 3), (4, 3, 1), (1, 2, 5)])
def test_transpose_lse_layout_is_not_an_involution_when_heads_differ_from_tokens(b, h, q):
    lse = torch.randn(b, h, q, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    twice = transpose_lse_layout(transpose_lse_layout(lse))
    assert twice.shape == lse.shape
    assert not torch.equal(twice, lse)
    assert sorted(transpose_lse_layout(lse).flatten().tolist()) == sorted(
        lse.flatten().tolist()
    )  # a permutation


def test_transpose_lse_layout_is_a_no_op_for_one_token_or_one_head():
    one_token = torch.randn(1, 9, 1, dtype=torch.float64)
    assert torch.equal(transpose_lse_layout(one_token), one_token)
    one_head = torch.randn(3, 1, 4, dtype=torch.float64)
    assert torch.equal(transpose_lse_layout(one_head), one_head)


@pytest.mark.parametrize("case", ["decode", "prefill"])
def test_injected_fault_changes_the_output_when_several_tokens_and_heads(case):
    q, k, v, mask = engine_batch(**CASES[case], seed=21)
    flat = flat_attention(q, k, v, mask, SCALE)
    clean = cascade_attention(q, k, v, mask, SCALE, 32)
    broken = cascade_attention(q, k, v, mask, SCALE, 32, inject="lse-layout")

    torch.testing.assert_close(clean, flat, atol=ATOL, rtol=0)
    assert (broken - flat).abs().max() > 1e-2


def test_injected_fault_is_invisible_for_a_single_decode_token():
    """B*Q == 1: the layouts coincide, which is why the field bug needed batches to show up."""
    q, k, v, mask = engine_batch(**CASES["decode-one-row"], seed=22)
    broken = cascade_attention(q, k, v, mask, SCALE, 32, inject="lse-layout")
    torch.testing.assert_close(broken, flat_attention(q, k, v, mask, SCALE), atol=ATOL, rtol=0)


def test_lse_shift_is_graded_and_weighs_the_prefix_e_to_the_x_times_more():
    q, k, v, mask = engine_batch(**CASES["decode"], seed=23)
    flat = flat_attention(q, k, v, mask, SCALE)
    errors = [
        (cascade_attention(q, k, v, mask, SCALE, 32, inject=f"lse-shift={x}") - flat).abs().max().item()
        for x in (0.01, 0.1, 1.0)
    ]
    assert errors[0] < errors[1] < errors[2]  # a ladder: larger shifts, larger errors
    assert errors[0] > 10 * ATOL  # even the smallest is more than rounding
    # As a weighted mix: attention to the prefix keys only and to the suffix keys only, merged
    # with the prefix's share of the softmax mass multiplied by e**x.
    x = 0.5
    got = cascade_attention(q, k, v, mask, SCALE, 32, inject=f"lse-shift={x}")
    p_out, p_lse = partial_attention(q, k[:, :, :32], v[:, :, :32], None, SCALE)
    s_out, s_lse = partial_attention(q, k[:, :, 32:], v[:, :, 32:], mask[..., 32:], SCALE)
    w = torch.sigmoid(p_lse + x - s_lse)[..., None]
    torch.testing.assert_close(got, (w * p_out + (1 - w) * s_out).to(q.dtype), atol=ATOL, rtol=0)


# --- when cascade runs: CascadeState.begin_step ------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix_len", "n_requests", "block", "use", "aligned"),
    [
        (256, 8, 16, True, 256),
        (300, 64, 16, True, 288),  # aligned down to a whole block
        (271, 8, 16, True, 256),
        (255, 8, 16, False, 0),  # below 256 tokens
        (270, 8, 48, False, 0),  # 270 aligns down to 240 with 48-token blocks: too short
        (287, 8, 32, True, 256),
        (1000, 7, 16, False, 0),  # fewer than 8 requests
        (0, 64, 16, False, 0),
    ],
)
def test_begin_step_applies_vllms_hard_conditions(prefix_len, n_requests, block, use, aligned):
    st = CascadeState(arm="cascade", prefix_len=prefix_len, block_size=block)
    assert st.begin_step(n_requests) is use
    assert (st.use_now, st.common_prefix_len) == (use, aligned)


def test_flat_arm_never_uses_cascade():
    st = CascadeState(arm="flat", prefix_len=4096)
    assert st.begin_step(256) is False
    assert st.common_prefix_len == 0


def test_begin_step_counts_steps_and_decisions_until_reset():
    st = CascadeState(arm="cascade", prefix_len=300)
    decisions = [st.begin_step(n) for n in (16, 8, 7, 1)]  # requests finish as the wave decodes
    assert decisions == [True, True, False, False]
    assert (st.steps_total, st.steps_cascade, st.decisions) == (4, 2, decisions)
    st.reset_counters()
    assert (st.steps_total, st.steps_cascade, st.calls, st.decisions) == (0, 0, 0, [])


def test_attention_forward_follows_the_state_and_returns_transformers_layout(monkeypatch):
    q, k, v, mask = engine_batch([5, 2, 9, 4, 1, 3, 6, 8], prefix=32, decode=True, seed=30)
    state = CascadeState(arm="cascade", prefix_len=32, block_size=16)
    monkeypatch.setattr(ca, "STATE", state)
    monkeypatch.setattr(ca, "MIN_COMMON_PREFIX", 16)  # a small prefix keeps the test fast

    state.begin_step(8)
    out, weights = ca.attention_forward(None, q, k, v, mask, scaling=SCALE)
    assert weights is None
    assert out.shape == (8, 1, H, D)  # [B, Q, H, D]
    assert state.calls == 1
    torch.testing.assert_close(out.transpose(1, 2), naive_attention(q, k, v, mask, SCALE), atol=ATOL, rtol=0)

    state.arm = "flat"
    state.begin_step(8)
    ca.attention_forward(None, q, k, v, mask, scaling=SCALE)
    assert state.calls == 1  # the flat arm does not count as a cascade call


def test_attention_forward_insists_on_the_engines_boolean_mask():
    q, k, v, mask = engine_batch([2], prefix=4, seed=31)
    with pytest.raises(RuntimeError, match="4-D boolean mask"):
        ca.attention_forward(None, q, k, v, mask.float())
    with pytest.raises(RuntimeError, match="4-D boolean mask"):
        ca.attention_forward(None, q, k, v, None)


# --- chat.py: the shared prefix in tokens -------------------------------------------------------------


class FakeTokenizer:
    """A chat template in miniature: BOS=1, <system>=2, <user>=3, <end>=4, <assistant>=5, text = code points."""

    chat_template = "fake"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        ids = [1]
        for m in messages:
            ids += [2 if m["role"] == "system" else 3, *map(ord, m["content"]), 4]
        return ids + ([5] if add_generation_prompt else [])


class FakeBaseTokenizer:
    """No chat template: called like a Hugging Face tokenizer."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + list(map(ord, text))}


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ([], 0),
        ([[1, 2, 3]], 3),
        ([[1, 2, 3], [1, 2, 4]], 2),
        ([[1, 2], [1, 2, 3]], 2),
        ([[1, 2, 3], [1, 2, 3], [1, 9, 3]], 1),
        ([[5], [6]], 0),
        ([[], [1]], 0),
    ],
)
def test_common_prefix_len(lists, expected):
    assert common_prefix_len(lists) == expected


def test_render_uses_the_chat_template_with_a_generation_prompt():
    assert render(FakeTokenizer(), "S", "u") == [1, 2, ord("S"), 4, 3, ord("u"), 4, 5]
    assert render(FakeTokenizer(), "", "u") == [1, 3, ord("u"), 4, 5]  # no system message at all


def test_render_accepts_a_batch_encoding_from_the_template():
    class DictTemplate(FakeTokenizer):
        def apply_chat_template(self, *a, **kw):
            return {"input_ids": super().apply_chat_template(*a, **kw)}

    assert render(DictTemplate(), "S", "u") == render(FakeTokenizer(), "S", "u")


def test_render_without_a_template_keeps_the_system_prompt_first():
    assert render(FakeBaseTokenizer(), "S", "u") == [1, ord("S"), ord("\n"), ord("\n"), ord("u")]


def test_measure_prefix_measures_the_shared_prefix_in_tokens():
    measured = measure_prefix(
        FakeTokenizer(), "abc", ["xy", {"prompt": "xz"}]
    )  # a text or a prompts.jsonl record
    rendered, shared = measured.rendered, measured.tokens
    assert rendered == [
        [1, 2, 97, 98, 99, 4, 3, 120, 121, 4, 5],
        [1, 2, 97, 98, 99, 4, 3, 120, 122, 4, 5],
    ]
    assert shared == 8  # BOS, <system>, a, b, c, <end>, <user>, x


@pytest.mark.parametrize(
    ("prompts", "shared"),
    [
        (["same", "same"], 10),  # identical prompts of 11 tokens: the last one stays with the request
        (["q"], 7),  # one prompt of 8 tokens: everything but its last token
        (["ab", "abc"], 7),  # up to and including "ab"
    ],
)
def test_measure_prefix_leaves_every_request_at_least_one_token_of_its_own(prompts, shared):
    measured = measure_prefix(FakeTokenizer(), "s", prompts)
    assert measured.tokens == shared
    assert all(len(r) - measured.tokens >= 1 for r in measured.rendered)
    assert measured.hashes() == [prompt_hash(r) for r in measured.rendered]


def test_measure_prefix_of_no_prompts_is_a_usage_error():
    with pytest.raises(UsageError, match="the prompt set is empty"):
        measure_prefix(FakeTokenizer(), "s", [])


def test_the_short_prefix_warning_is_said_below_vllms_hard_condition_only():
    assert short_prefix_warning(255) == "shared prefix is 255 tokens (< 256): cascade cannot fire"
    assert short_prefix_warning(256) is None and short_prefix_warning(None) is None


def test_prompt_hash_is_a_stable_short_hash_of_the_token_ids():
    h = prompt_hash([1, 2, 3])
    assert h == prompt_hash((1, 2, 3)) and len(h) == 16
    assert prompt_hash([12, 3]) != prompt_hash([1, 23]) != h
