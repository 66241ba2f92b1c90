"""FA2's split-KV decision (splitkv.py) against cases worked by hand, and the band it implies."""

from __future__ import annotations

import pytest

from cascade_repro.vllm_surface import cascade_rule, splitkv

H200_SMS = 132


def test_block_n_follows_head_dim():
    assert [splitkv.block_n(d) for d in (32, 64, 80, 128, 192, 256)] == [256, 256, 128, 128, 64, 64]


@pytest.mark.parametrize(
    ("bnm", "sms", "blocks", "want"),
    [
        # 0.8 x 264 = 211.2: 212 blocks of work already fill the SMs, 211 do not.
        (212, 264, 8, 1),
        (1000, 264, 8, 1),
        # One KV block: max_splits = min(128, 264, 1) = 1.
        (144, 264, 1, 1),
        # 48 requests x 3 KV heads = 144 over 264: efficiencies for 1..3 splits are
        # 144/264 = 0.545, 288/264 = 1.09 -> 1.09/2 = 0.545, 432/264 = 1.64 -> 0.818; the first at
        # >= 0.85 x 0.818 = 0.695 is 3 splits.
        (144, 264, 3, 3),
        # Two blocks: 1 split 0.545, 2 splits 0.545; both >= 0.85 x 0.545, so the first (1) wins.
        (144, 264, 2, 1),
        # 64 x 3 = 192: 0.727, 384/264 = 1.45 -> 0.727, 576/264 = 2.18 -> 0.727 with 3 blocks:
        # all equal, 1 split. With 4 blocks, 768/264 = 2.91 -> 0.970: 0.85 x 0.970 = 0.824, so 4.
        (192, 264, 3, 1),
        (192, 264, 4, 4),
        # 24 over 264 with 64 blocks: s splits give s/11 of a wave up to s = 11 (efficiency 1.0);
        # the first eligible count at >= 0.85 is 10 (10/11 = 0.91; ceil(64/10) = 7 != ceil(64/9) = 8).
        (24, 264, 64, 10),
        # Ineligible counts are skipped: with 8 blocks, 5-7 splits still give 2 blocks per split.
        # 200 over 264: efficiencies 0.758 (1-4 splits) and 0.866 (8); 0.758 >= 0.85 x 0.866, so 1.
        (200, 264, 8, 1),
    ],
)
def test_num_splits_heuristic_hand_worked(bnm, sms, blocks, want):
    assert splitkv.num_splits_heuristic(bnm, sms, blocks, 128) == want


def test_gqa_packing_is_the_bugs_branch():
    assert splitkv.gqa_packed(9, 3)
    assert not splitkv.gqa_packed(8, 8)  # MHA: no ngroups swap
    assert not splitkv.gqa_packed(32, 8, sliding_window=True)
    # MHA may split too (as 9 "heads", 1 query row), but not through the transposed-LSE branch.
    assert splitkv.decode_splits(16, 8, 8, 64, 1024, H200_SMS) > 1
    assert not splitkv.buggy_decode(16, 8, 8, 64, 1024, H200_SMS)


def test_embedded_model_splits_from_513_own_tokens_at_48_requests():
    # SmolLM2-135M: 9 query / 3 KV heads, head dim 64 -> KV blocks of 256 tokens.
    assert splitkv.decode_splits(48, 9, 3, 64, 512, H200_SMS) == 1
    assert splitkv.decode_splits(48, 9, 3, 64, 513, H200_SMS) == 3
    assert splitkv.split_from_suffix(48, 9, 3, 64, H200_SMS) == 513
    # 64 requests need a fourth block (see the hand-worked 192 case above).
    assert splitkv.split_from_suffix(64, 9, 3, 64, H200_SMS) == 769
    # 71 x 3 = 213 >= 211.2: never.
    assert splitkv.split_from_suffix(71, 9, 3, 64, H200_SMS) is None


def _decode_rule(prefix: int, q: int, kv: int, sms: int = H200_SMS):
    def fires(n: int) -> bool:
        return cascade_rule.decide(prefix, [1] * n, q, kv, num_sms=sms).fires

    return fires


@pytest.mark.parametrize(
    ("suffix", "want"),
    [(512, "none"), (513, "45-58"), (768, "45-58"), (769, "45-66"), (1025, "45-70"), (1536, "45-70")],
)
def test_band_of_the_embedded_model_on_an_h200(suffix, want):
    # Decode steps choose cascade from 45 requests (1584-token prefix: 13 tiles, 9 CTAs in 1 wave
    # against ceil(45 x 3 x 13 / 132) = 14) and FA2 stops splitting at 71 (71 x 3 >= 211.2).
    b = splitkv.band(_decode_rule(1584, 9, 3), 9, 3, 64, suffix, H200_SMS, max_requests=200)
    assert b.text() == want


@pytest.mark.parametrize(("suffix", "tp1", "tp2"), [(1024, (17, 24), (34, 49)), (2048, (17, 26), (34, 52))])
def test_band_for_eight_kv_heads_moves_with_tp(suffix, tp1, tp2):
    # 32 query / 8 KV heads, head dim 128 (KV blocks of 128): TP 1 keeps 8 KV heads per GPU, TP 2 four.
    # Cascade from: ceil(8 n x 13 tiles / 132) > 13 -> n >= 17 (TP 1); 4 KV heads -> n >= 34.
    # FA2 splits while n x KV heads < 211.2 (n <= 26, n <= 52), and while a split beats one
    # pass by its 85% rule: with 8 blocks (1024 tokens) 25 x 8 = 200 does not (0.758 >= 0.85 x
    # 0.866, see above), with 16 blocks it does.
    a = splitkv.band(_decode_rule(1584, 32, 8), 32, 8, 128, suffix, H200_SMS, max_requests=200)
    b = splitkv.band(_decode_rule(1584, 16, 4), 16, 4, 128, suffix, H200_SMS, max_requests=200)
    assert a.ranges == [tp1]
    assert b.ranges == [tp2]


def test_band_on_an_a100_matches_the_reports():
    # 108 SMs: 8 KV heads -> 14-20 (vLLM #22103 ran --max_num_seqs 16); 4 KV heads -> 28-40, the
    # "~30 concurrent requests" of #17652.
    a = splitkv.band(_decode_rule(1584, 32, 8, 108), 32, 8, 128, 1024, 108, max_requests=200)
    b = splitkv.band(_decode_rule(1584, 32, 4, 108), 32, 4, 128, 1024, 108, max_requests=200)
    assert a.ranges == [(14, 20)]
    assert b.ranges == [(28, 40)]


def test_band_ranges_and_text():
    assert splitkv.Band(100, (3, 4, 5, 9, 11, 12)).ranges == [(3, 5), (9, 9), (11, 12)]
    assert splitkv.Band(100, (3, 4, 5, 9)).text() == "3-5, 9"
    assert splitkv.Band(100, ()).text() == "none"
