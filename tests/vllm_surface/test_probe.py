"""The vLLM probe plugin on CPU: the fake flash_attn module, the control file, counters, injection."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
from conftest import FAKE_VLLM_ROOT

from cascade_repro.vllm_surface import probe

torch = pytest.importorskip("torch")

# The one fake of vllm/v1/attention/backends/flash_attn.py (tests/fake_vllm, vLLM 0.26's call
# structure): the builder method and FlashAttentionImpl.forward call the module functions by their
# global names, and cascade_attention calls merge_attn_states(output, prefix_output, prefix_lse,
# suffix_output, suffix_lse). Each test patches a fresh copy of it.
FAKE_FLASH_ATTN = FAKE_VLLM_ROOT / "vllm" / "v1" / "attention" / "backends" / "flash_attn.py"


def make_fake(name: str = "fake_flash_attn") -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, FAKE_FLASH_ATTN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def decide(mod: types.ModuleType, prefix: int, n_reqs: int):
    return mod.FlashAttentionMetadataBuilder().use_cascade_attention(
        common_prefix_len=prefix,
        query_lens=[1] * n_reqs,
        num_query_heads=9,
        num_kv_heads=3,
        use_alibi=False,
        use_sliding_window=False,
        use_local_attention=False,
        num_sms=132,
        dcp_world_size=1,
    )


def tensors(h: int = 3, t: int = 5, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    po = torch.randn(t, h, d, generator=g)
    so = torch.randn(t, h, d, generator=g)
    pl = torch.randn(h, t, generator=g)
    sl = torch.randn(h, t, generator=g)
    return torch.empty(t, h, d), po, pl, so, sl


def run_cascade(mod: types.ModuleType, seed: int = 0) -> torch.Tensor:
    out, po, pl, so, sl = tensors(seed=seed)
    mod.FlashAttentionImpl(2).forward(out, (po, pl, so, sl), common_prefix_len=512)
    return out


@pytest.fixture
def patched(tmp_path: Path):
    mod = make_fake()
    st = probe.ProbeState(tmp_path / "probe")
    done = probe.patch_flash_attn(mod, st, rebind=[])
    return mod, st, done


def control(st: probe.ProbeState, wave, force_off=False, inject=None, seq=[0]) -> None:  # noqa: B006
    seq[0] += 1
    probe.write_control(st.dir, wave, force_off, inject, seq[0])


def test_patch_reports_what_it_wrapped(patched):
    mod, st, done = patched
    assert done == [
        "fake_flash_attn.use_cascade_attention",
        "fake_flash_attn.cascade_attention",
        "fake_flash_attn.merge_attn_states",
        "fake_flash_attn.FlashAttentionImpl.__init__",
    ]
    assert st.patched == done


def test_counts_decisions_and_executions_per_wave(patched):
    mod, st, _ = patched
    control(st, "cell-a/0")
    assert decide(mod, 512, 8) is True
    assert decide(mod, 512, 4) is False  # too few requests: the heuristic says no
    for _ in range(3):
        run_cascade(mod)
    snap = st.sync("cell-a/0")
    c = snap["waves"]["cell-a/0"]
    assert (c["decisions_true"], c["decisions_false"], c["forced_off"], c["cascade_calls"]) == (1, 1, 0, 3)
    assert c["max_common_prefix_len"] == 512 and c["last_common_prefix_len"] == 512
    assert c["max_reqs"] == 8 and c["fa_versions"] == [2]
    # A new wave starts from zero; the old one stays in the counts file.
    control(st, "cell-a/1")
    decide(mod, 256, 8)
    st.sync()
    files = probe.read_count_files(st.dir)
    assert len(files) == 1 and files[0]["pid"] == st.pid
    assert files[0]["waves"]["cell-a/0"]["decisions_true"] == 1
    assert files[0]["waves"]["cell-a/1"]["decisions_true"] == 1
    assert files[0]["waves"]["cell-a/1"]["cascade_calls"] == 0


def test_force_off_skips_the_heuristic_and_counts_false(patched):
    mod, st, _ = patched
    control(st, "flat/0", force_off=True)
    before = len(mod.heuristic_calls)
    assert decide(mod, 1024, 64) is False
    assert len(mod.heuristic_calls) == before  # the original was not asked
    c = st.sync()["waves"]
    assert c == {}  # all_waves=False and no wave named
    c = st.sync("flat/0")["waves"]["flat/0"]
    assert (c["decisions_true"], c["decisions_false"], c["forced_off"]) == (0, 1, 1)
    # Switching back restores the heuristic.
    control(st, "casc/0", force_off=False)
    assert decide(mod, 1024, 64) is True
    assert len(mod.heuristic_calls) == before + 1


def test_no_wave_means_no_counting(patched):
    mod, st, _ = patched
    control(st, None)
    decide(mod, 512, 8)
    run_cascade(mod)
    assert st.sync()["waves"] == {} and st.waves == {}


def test_control_file_change_is_seen_without_sync(patched):
    mod, st, _ = patched
    control(st, "w/0", force_off=True)
    assert decide(mod, 512, 8) is False
    control(st, "w/1", force_off=False)
    assert decide(mod, 512, 8) is True  # the wrapper's stat check picked up the new file
    assert st.wave == "w/1" and st.waves["w/0"]["forced_off"] == 1


def test_counts_file_is_written_every_n_decisions(tmp_path):
    mod = make_fake()
    st = probe.ProbeState(tmp_path, flush_every=2)
    probe.patch_flash_attn(mod, st, rebind=[])
    probe.write_control(tmp_path, "w", False, None, 1)
    decide(mod, 512, 8)
    decide(mod, 512, 8)
    data = json.loads(st.counts_path.read_text())
    assert data["waves"]["w"]["decisions_true"] == 2
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_impl_init_records_fa_version(patched):
    mod, st, _ = patched
    mod.FlashAttentionImpl(3)
    assert st.fa_versions == {3} and st.attn_impls == {"FlashAttentionImpl"}
    assert json.loads(st.counts_path.read_text())["fa_versions"] == [3]


def test_patching_twice_wraps_the_originals(patched, tmp_path):
    mod, st, _ = patched
    orig = mod.use_cascade_attention._cascade_repro_original
    st2 = probe.ProbeState(tmp_path / "second")
    probe.patch_flash_attn(mod, st2, rebind=[])
    assert mod.use_cascade_attention._cascade_repro_original is orig
    control(st2, "w")
    decide(mod, 512, 8)
    assert st2.sync("w")["waves"]["w"]["decisions_true"] == 1
    assert st.waves == {}


def test_names_imported_elsewhere_are_rebound(tmp_path):
    mod = make_fake()
    other = types.ModuleType("vllm_fake_other")
    other.cascade_attention = mod.cascade_attention
    other.use_cascade_attention = mod.use_cascade_attention
    other.merge_attn_states = mod.merge_attn_states
    keep = mod.merge_attn_states
    st = probe.ProbeState(tmp_path)
    done = probe.patch_flash_attn(mod, st, rebind=[other])
    assert other.cascade_attention is mod.cascade_attention
    assert other.use_cascade_attention is mod.use_cascade_attention
    assert other.merge_attn_states is keep  # other backends' merge stays untouched
    assert "vllm_fake_other.cascade_attention" in done


def test_misread_lse_matches_the_reference_injection():
    from cascade_repro.engines.cascade_attention import transpose_lse_layout

    lse = torch.randn(6, 10)  # [H, T]
    got = probe.misread_lse(lse)
    assert got.shape == lse.shape and got.is_contiguous()
    assert torch.equal(got, transpose_lse_layout(lse[None])[0])
    assert not torch.equal(got, lse)
    # vLLM's CUDA merge kernel reads lse[h * T + t] from the raw buffer, ignoring strides.
    h, t = lse.shape

    def kernel_read(x):
        return torch.as_strided(x, (h, t), (t, 1), x.storage_offset())

    assert torch.equal(kernel_read(got), transpose_lse_layout(lse[None])[0])
    # A strided transposed view would be read unchanged by such a kernel: no injection at all.
    strided = lse.contiguous().view(-1).view(t, h).t()
    assert torch.equal(kernel_read(strided), lse)
    assert probe.misread_lse(torch.randn(2, 3, 4)).shape == (2, 3, 4)  # not [H, T]: untouched


def test_inject_passes_the_transposed_suffix_lse_only_inside_cascade(patched):
    mod, st, _ = patched
    control(st, "clean")
    clean = run_cascade(mod)
    _, _, _, _, sl = tensors()
    assert torch.equal(mod.merged[-1], sl)

    control(st, "inj", inject="lse-layout")
    assert decide(mod, 512, 8) is True  # as in vLLM, the step's decision re-reads the control file
    injected = run_cascade(mod)
    seen = mod.merged[-1]
    assert seen.is_contiguous() and torch.equal(seen, probe.misread_lse(sl))
    assert not torch.allclose(clean, injected)
    assert st.sync("inj")["waves"]["inj"]["inject_calls"] == 1

    # merge_attn_states called outside cascade_attention (e.g. the DCP path) is left alone.
    out, po, pl, so, sl2 = tensors(seed=1)
    mod.merge_attn_states(out, po, pl, so, sl2)
    assert mod.merged[-1] is sl2
    # keyword form
    with_kw = []
    orig = mod.merge_attn_states._cascade_repro_original
    wrapped = probe.wrap_merge(lambda *a, **k: with_kw.append(k["suffix_lse"]), st)
    st.in_cascade = True
    wrapped(out, po, pl, so, suffix_lse=sl2)
    st.in_cascade = False
    assert torch.equal(with_kw[-1], probe.misread_lse(sl2))
    # The wrapper keeps vLLM's own function, and wrapping it again wraps that, not the wrapper.
    assert orig is not mod.merge_attn_states and orig.__name__ == "merge_attn_states"
    assert probe._original(probe.wrap_merge(mod.merge_attn_states, st)) is orig


def test_lse_shift_hands_the_merge_the_prefix_lse_plus_x_nats_inside_cascade_only(patched):
    mod, st, _ = patched
    control(st, "shift", inject="lse-shift=0.25")
    assert decide(mod, 512, 8) is True
    run_cascade(mod)
    _, _, pl, _, sl = tensors()
    assert torch.allclose(mod.merged_prefix[-1], pl + 0.25)
    assert torch.equal(mod.merged[-1], sl)  # the suffix LSE is untouched
    assert st.sync("shift")["waves"]["shift"]["inject_calls"] == 1
    # keyword form, and the caller's tensor is not modified in place
    got = []
    wrapped = probe.wrap_merge(lambda *a, **k: got.append(k["prefix_lse"]), st)
    before = pl.clone()
    st.in_cascade = True
    wrapped(None, None, prefix_lse=pl, suffix_output=None, suffix_lse=sl)
    st.in_cascade = False
    assert torch.allclose(got[-1], before + 0.25) and torch.equal(pl, before)
    # An unparseable value in the control file is no injection, never an exception inside vLLM.
    control(st, "bad", inject="lse-shift=lots")
    decide(mod, 512, 8)
    run_cascade(mod)
    assert torch.equal(mod.merged_prefix[-1], pl)


def test_decode_steps_are_counted_apart_from_prefill_steps(patched):
    mod, st, _ = patched
    control(st, "w")
    assert decide(mod, 512, 8) is True  # every request with one query token: a decode step
    assert mod.FlashAttentionMetadataBuilder().use_cascade_attention(
        common_prefix_len=512, query_lens=[40] * 8, num_query_heads=9, num_kv_heads=3, use_alibi=False,
        use_sliding_window=False, use_local_attention=False, num_sms=132, dcp_world_size=1,
    ) is True  # fmt: skip
    c = st.sync("w")["waves"]["w"]
    assert (c["decisions_true"], c["decisions_true_decode"]) == (2, 1)
    assert probe.aggregate([st.snapshot()], "w")["decisions_true_decode"] == 1


def test_flat_arm_never_injects(patched):
    mod, st, _ = patched
    control(st, "flat", force_off=True, inject=None)
    assert decide(mod, 512, 8) is False
    run_cascade(mod)
    _, _, _, _, sl = tensors()
    assert torch.equal(mod.merged[-1], sl)


def test_worker_base_gets_the_sync_method(tmp_path):
    wb = types.ModuleType("fake_worker_base")

    class WorkerWrapperBase:
        def __init__(self):
            self.rpc_rank = 1

    wb.WorkerWrapperBase = WorkerWrapperBase
    st = probe.ProbeState(tmp_path)
    assert probe.patch_worker_base(wb, st) == [probe.RPC_METHOD]
    probe.write_control(tmp_path, "w", False, None, 1)
    st.refresh()
    st.record_decision(True, False, 512, 8)
    snap = getattr(WorkerWrapperBase(), probe.RPC_METHOD)("w")
    assert snap["rpc_rank"] == 1 and snap["waves"]["w"]["decisions_true"] == 1
    json.dumps(snap)  # travels through msgpack/pickle as plain data


def test_aggregate_takes_the_per_rank_value():
    a = {
        "pid": 1,
        "waves": {
            "w": {
                **probe.new_counters(),
                "decisions_true": 3,
                "decisions_false": 7,
                "cascade_calls": 90,
                "max_common_prefix_len": 2080,
                "fa_versions": [3],
            }
        },
    }
    b = {
        "pid": 2,
        "waves": {
            "w": {
                **probe.new_counters(),
                "decisions_true": 3,
                "decisions_false": 7,
                "cascade_calls": 90,
                "max_common_prefix_len": 2080,
                "fa_versions": [3],
            }
        },
    }
    c = {"pid": 3, "waves": {}}  # the LLM process: no model, no counts
    agg = probe.aggregate([a, b, c, None], "w")
    assert agg["procs"] == 2
    assert (agg["decisions_true"], agg["decisions_false"], agg["cascade_calls"]) == (3, 7, 90)
    assert agg["cascade_calls_sum"] == 180 and agg["fa_versions"] == [3]
    assert probe.aggregate([c], "w")["decisions_true"] == 0
    facts = probe.process_facts([{"pid": 1, "fa_versions": [2], "attn_impls": ["FlashAttentionImpl"]}, None])
    assert facts["fa_versions"] == [2] and facts["procs"] == 1


@pytest.fixture
def clean_hooks(monkeypatch):
    monkeypatch.setattr(probe, "_STATE", None)
    monkeypatch.setattr(probe, "_FINDER", None)
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


def test_register_is_inert_without_the_env(monkeypatch, clean_hooks):
    monkeypatch.delenv(probe.ENV_VAR, raising=False)
    probe.register()
    assert probe.state() is None


def test_register_activates_and_announces_the_process(monkeypatch, tmp_path, clean_hooks):
    monkeypatch.setenv(probe.ENV_VAR, str(tmp_path / "p"))
    probe.register()
    st = probe.state()
    assert st is not None and st.dir == tmp_path / "p"
    files = probe.read_count_files(tmp_path / "p")
    assert [f["pid"] for f in files] == [st.pid]
    probe.register()  # a second call in the same process changes nothing
    assert probe.state() is st


def test_post_import_hook_patches_a_module_when_it_is_imported(tmp_path, monkeypatch, clean_hooks):
    pkg = tmp_path / "crp_fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copyfile(FAKE_FLASH_ATTN, pkg / "flash_attn.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    st = probe.ProbeState(tmp_path / "probe")
    seen = []
    probe.when_imported(
        "crp_fakepkg.flash_attn", lambda m: seen.append(probe.patch_flash_attn(m, st, rebind=[]))
    )
    assert not seen
    try:
        mod = importlib.import_module("crp_fakepkg.flash_attn")
        assert seen and hasattr(mod.use_cascade_attention, "_cascade_repro_original")
        assert mod.__loader__.get_filename("crp_fakepkg.flash_attn").endswith("flash_attn.py")
        probe.write_control(st.dir, "w", True, None, 1)
        assert decide(mod, 512, 8) is False and st.waves["w"]["forced_off"] == 1
        # Already imported: the hook runs at once.
        again = []
        probe.when_imported("crp_fakepkg.flash_attn", again.append)
        assert again == [mod]
    finally:
        for name in ("crp_fakepkg.flash_attn", "crp_fakepkg"):
            sys.modules.pop(name, None)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_its_own_counts(monkeypatch, tmp_path, clean_hooks):
    d = tmp_path / "p"
    monkeypatch.setenv(probe.ENV_VAR, str(d))
    probe.register()
    st = probe.state()
    probe.write_control(d, "w", False, None, 1)
    pid = os.fork()
    if pid == 0:  # child: vLLM's forked engine core does not call register() again
        code = 0
        try:
            s = probe.state()
            s.refresh()
            s.record_decision(True, False, 512, 8)
            s.sync("w")
            code = 0 if s.pid == os.getpid() else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    files = {f["pid"]: f for f in probe.read_count_files(d)}
    assert set(files) == {st.pid, pid}
    assert files[pid]["waves"]["w"]["decisions_true"] == 1
    assert files[st.pid]["waves"] == {}


def test_decode_cascade_calls_and_fa2_split_path_are_counted(tmp_path):
    st = probe.ProbeState(tmp_path)
    st.num_sms = 132  # an H200 (read from the GPU in vLLM's processes)
    control(st, "w")
    st.refresh(force=True)
    calls = []
    wrapped = probe.wrap_cascade(lambda *a, **k: calls.append(k), st)

    def step(n, own, fa=2, qlen=1, heads=(9, 3), d=64):
        q = torch.empty(n, heads[0], d)
        kc = torch.empty(4, 16, heads[1], d)
        cu = torch.arange(n + 1)
        wrapped(None, q, kc, kc, cu_query_lens=cu, max_query_len=qlen, max_kv_len=1584 + own,
                common_prefix_len=1584, fa_version=fa)  # fmt: skip

    step(48, 400)  # 2 KV blocks of 256: one split
    step(48, 600)  # 3 blocks: 3 splits, the bug's branch
    step(64, 600)  # 64 x 3 KV heads: 1 split at 3 blocks
    step(48, 600, fa=3)  # FA3 has no such branch
    step(48, 600, qlen=7)  # a prefill step: not a decode call
    step(48, 600, heads=(8, 8))  # MHA: no GQA packing
    c = st.sync("w")["waves"]["w"]
    assert c["cascade_calls"] == 6 and len(calls) == 6
    assert c["decode_cascade_calls"] == 5
    assert c["fa2_split_calls"] == 1
    assert c["max_decode_suffix"] == 600
    # An unexpected call shape counts nothing and still calls vLLM.
    wrapped(None, "not a tensor", max_query_len=1)
    assert st.sync("w")["waves"]["w"]["decode_cascade_calls"] == 5 and len(calls) == 7


# --- one round trip per wave: the control file's size, step timing, bounded waves ------------------


@pytest.mark.parametrize("seq", range(6))
def test_control_file_size_has_the_parity_of_seq(tmp_path, seq):
    # Two consecutive controls always differ in size, so a stat sees the change even when the mtime
    # is too coarse to and the new file reuses the old inode number.
    probe.write_control(tmp_path, "k/w00001-cascade" if seq % 3 else None, bool(seq % 2), None, seq)
    path = tmp_path / probe.CONTROL_FILE
    assert path.stat().st_size % 2 == seq % 2
    assert json.loads(path.read_text())["seq"] == seq


def test_a_new_control_is_seen_although_the_signature_tricks_fail(tmp_path, monkeypatch):
    st = probe.ProbeState(tmp_path)
    probe.write_control(tmp_path, None, False, None, 1)
    st.refresh()
    # Same inode and mtime as the old file (coarse clock, inode reused): only the size tells.
    old = os.stat(tmp_path / probe.CONTROL_FILE)
    probe.write_control(tmp_path, None, False, None, 2)  # the same text length but for the padding
    real_stat = os.stat

    def stat(path, *a, **k):
        s = real_stat(path, *a, **k)
        if Path(path).name != probe.CONTROL_FILE:
            return s
        return types.SimpleNamespace(st_ino=old.st_ino, st_mtime_ns=old.st_mtime_ns, st_size=s.st_size)

    monkeypatch.setattr(probe.os, "stat", stat)
    st.refresh()
    assert st.seq == 2


def test_steps_are_timed_by_the_kind_of_the_step_they_start(tmp_path):
    st = probe.ProbeState(tmp_path)
    ticks = iter([10.0, 10.5, 10.6, 10.7, 11.0, 99.0])
    st.clock = lambda: next(ticks)
    st.apply(probe.control_data("w", False, None, 1))
    st.record_decision(True, False, 512, 8, decode=False)  # prefill step: 10.0 -> 10.5
    st.record_decision(True, False, 512, 8, decode=True)  # cascade decode: 10.5 -> 10.6
    st.record_decision(True, False, 512, 8, decode=True)  # cascade decode: 10.6 -> 10.7
    st.record_decision(False, False, 512, 8, decode=True)  # flat decode: 10.7 -> 11.0
    st.record_decision(False, False, 512, 4, decode=True)  # the wave's last step: not timed
    c = st.waves["w"]
    assert c["prefill_n"] == 1 and c["prefill_s"] == pytest.approx(0.5)
    assert c["decode_cascade_n"] == 2 and c["decode_cascade_s"] == pytest.approx(0.2)
    assert c["decode_flat_n"] == 1 and c["decode_flat_s"] == pytest.approx(0.3)
    # A new wave starts its own chain: the gap between waves is charged to nobody.
    st.apply(probe.control_data("w2", False, None, 2))
    st.record_decision(False, False, 512, 8, decode=True)
    assert st.waves["w2"]["decode_flat_n"] == 0


def test_uncounted_decisions_are_not_timed(tmp_path):
    st = probe.ProbeState(tmp_path)
    st.clock = iter([1.0, 2.0, 3.0]).__next__
    st.apply(probe.control_data(None, False, None, 1))
    st.record_decision(False, False, 512, 1)  # the warm-up
    st.apply(probe.control_data("w", False, None, 2))
    st.record_decision(False, False, 512, 8, decode=True)
    assert st.waves["w"]["decode_flat_n"] == 0  # the warm-up's stamp did not carry over


def test_aggregate_takes_the_slowest_rank_for_step_times():
    w = {"w": {**probe.new_counters(), "decode_cascade_s": 0.5, "decode_cascade_n": 4}}
    w2 = {"w": {**probe.new_counters(), "decode_cascade_s": 0.7, "decode_cascade_n": 4}}
    agg = probe.aggregate([{"waves": w}, {"waves": w2}], "w")
    assert agg["decode_cascade_s"] == 0.7 and agg["decode_cascade_n"] == 4 and agg["prefill_s"] == 0.0


def test_sync_snapshots_before_the_handed_control_applies(tmp_path):
    st = probe.ProbeState(tmp_path)
    st.apply(probe.control_data("w", False, "lse-layout", 1))
    st.record_decision(True, False, 512, 8)
    snap = st.sync("w", probe.control_data(None, False, None, 2))
    assert (
        snap["wave"] == "w" and snap["inject"] == "lse-layout" and snap["waves"]["w"]["decisions_true"] == 1
    )
    assert st.wave is None and st.inject is None and st.seq == 2
    st.record_decision(True, False, 512, 8)  # not counted: no wave
    assert st.waves["w"]["decisions_true"] == 1
    on_disk = probe.read_count_files(tmp_path)[0]
    assert on_disk["waves"]["w"]["decisions_true"] == 1 and on_disk["wave"] is None


def test_a_long_engine_keeps_only_the_last_waves(tmp_path):
    st = probe.ProbeState(tmp_path)
    for i in range(probe.KEEP_WAVES + 5):
        st.apply(probe.control_data(f"w{i}", False, None, i + 1))
        st.record_decision(False, False, 512, 8)
    assert len(st.waves) == probe.KEEP_WAVES
    last = f"w{probe.KEEP_WAVES + 4}"
    assert last in st.waves and "w0" not in st.waves
    st.flush()
    assert len(probe.read_count_files(tmp_path)[0]["waves"]) == probe.KEEP_WAVES


def test_force_on_overrides_the_cost_model_within_the_hard_conditions(tmp_path):
    def declines(common_prefix_len, query_lens, num_query_heads, num_kv_heads, use_alibi,
                 use_sliding_window, use_local_attention, num_sms, dcp_world_size):  # fmt: skip
        return False  # the cost model says flash-decoding wins

    st = probe.ProbeState(tmp_path)
    rule = probe.wrap_decision(declines, st)

    def call(prefix=512, n=8, q=1, **kw):
        args = dict(common_prefix_len=prefix, query_lens=[q] * n, num_query_heads=9, num_kv_heads=3,
                    use_alibi=False, use_sliding_window=False, use_local_attention=False, num_sms=132,
                    dcp_world_size=1)  # fmt: skip
        args.update(kw)
        return rule(**args)

    st.apply(probe.control_data("w", False, None, 1))
    assert call() is False  # not forced: the heuristic's answer
    st.apply(probe.control_data("w", False, None, 2, force_on=True))
    assert call() is True
    assert call(prefix=255) is False and call(n=7) is False  # below vLLM's hard limits
    assert call(use_sliding_window=True) is False and call(dcp_world_size=2) is False
    assert call(q=40) is False  # a prefill step: only decode steps are the cost model's
    # Positional arguments, as vLLM 0.10.2 passes them (no dcp_world_size there).
    assert rule(512, [1] * 8, 9, 3, False, False, False, 132, 1) is True
    c = st.waves["w"]
    assert c["forced_on"] == 2 and c["decisions_true"] == 2 and c["decisions_true_decode"] == 2
    st.apply(probe.control_data("w", True, None, 3, force_on=True))
    assert call() is False  # the flat arm's force_off wins


def test_graph_steps_are_counted_from_either_model_runner(tmp_path):
    """V1 (0.26.0 to 0.33.0): the mode _determine_batch_execution_and_padding returns first; V2 (the
    only runner of 0.34.0): CudaGraphManager.run_fullgraph / run_pw_graph. Only inside a wave."""
    import enum

    class CUDAGraphMode(enum.Enum):
        NONE = 0
        PIECEWISE = 1
        FULL = 2

    class GPUModelRunner:
        def __init__(self):
            self.modes = [CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE]

        def _determine_batch_execution_and_padding(self):
            return (self.modes.pop(0), "desc", False, None, None)

    class CudaGraphManager:
        def run_fullgraph(self, desc):
            return desc

        def run_pw_graph(self, model, inputs):
            return inputs

    class ModelCudaGraphManager(CudaGraphManager):
        def run_fullgraph(self, desc):
            return super().run_fullgraph(desc)

    v1 = types.ModuleType("fake_v1_runner")
    v1.GPUModelRunner = GPUModelRunner
    v2 = types.ModuleType("fake_cudagraph_utils")
    v2.CudaGraphManager, v2.ModelCudaGraphManager = CudaGraphManager, ModelCudaGraphManager
    st = probe.ProbeState(tmp_path)
    assert probe.patch_v1_graphs(v1, st) == [
        "fake_v1_runner.GPUModelRunner._determine_batch_execution_and_padding"
    ]
    assert len(probe.patch_v2_graphs(v2, st)) == 2
    runner, mgr = GPUModelRunner(), ModelCudaGraphManager()
    runner._determine_batch_execution_and_padding()  # FULL, outside a wave: not counted
    st.apply({"wave": "w1", "seq": 1})
    runner._determine_batch_execution_and_padding()  # PIECEWISE
    runner._determine_batch_execution_and_padding()  # NONE
    assert mgr.run_fullgraph("d") == "d" and mgr.run_pw_graph(None, {"x": 1}) == {"x": 1}
    c = st.waves["w1"]
    assert (c["graph_full_steps"], c["graph_piecewise_steps"], c["graph_eager_steps"]) == (1, 2, 1)
    # Patched once: a second patch wraps the originals, not the wrappers.
    probe.patch_v2_graphs(v2, st)
    mgr.run_fullgraph("d")
    assert st.waves["w1"]["graph_full_steps"] == 2
    agg = probe.aggregate([st.snapshot()], "w1")
    assert (agg["graph_full_steps"], agg["graph_piecewise_steps"]) == (2, 2)


def test_the_scheduler_hook_counts_requests_per_step_and_async_steps(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "fake_sched", FAKE_VLLM_ROOT / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    AsyncScheduler = type("AsyncScheduler", (mod.Scheduler,), {})
    st = probe.ProbeState(tmp_path)
    probe.patch_scheduler(mod, st)
    st.apply({"wave": "w1", "seq": 1})
    for cls, wave in ((mod.Scheduler, "w1"), (AsyncScheduler, "w2")):
        st.apply({"wave": wave, "seq": 2})
        s = cls(100)
        for i in range(3):
            s.add(f"r{i}", 60)
        while s.pending():
            s.schedule()
        s.schedule()  # a decode step: all three
    w1, w2 = st.waves["w1"], st.waves["w2"]
    assert (w1["sched_steps"], w1["max_sched_reqs"], w1["async_sched_steps"], w1["prefill_chunks"]) == (
        3,
        3,
        0,
        1,
    )
    assert (w2["sched_steps"], w2["async_sched_steps"]) == (3, 3)


def test_worker_facts_read_the_runner_and_each_layers_kv_cache(tmp_path):
    class Impl:
        def forward(self, layer, q, k, v, kv_cache, meta, output=None):
            output.copy_(q)
            return None  # vLLM's custom op ignores the return: the output argument is what counts

    class Layer:
        def __init__(self, dtype, tensor):
            self.impl, self.kv_cache_dtype, self.kv_cache = Impl(), dtype, tensor

    class GPUModelRunner:
        def __init__(self, layers):
            self.layers = layers

        def get_model(self):
            return types.SimpleNamespace(modules=lambda: [object(), *self.layers])

    layers = [
        Layer("fp8", torch.zeros(2, dtype=torch.uint8)),
        Layer("fp8", [torch.zeros(2, dtype=torch.uint8)]),
    ]
    worker = types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=GPUModelRunner(layers)))
    st = probe.ProbeState(tmp_path)
    facts = probe.worker_facts(worker, st)
    assert facts["model_runner"].endswith(".GPUModelRunner")
    assert (
        facts["layer_kv_cache_dtypes"],
        facts["kv_cache_tensor_dtypes"],
        facts["kv_cache_element_bytes"],
    ) == (["fp8"], ["uint8"], [1])
    assert facts["out_scale_wrapped"] == ["Impl"]
    st.apply({"wave": "w1", "inject": "out-scale=1", "seq": 1})
    q, out = torch.ones(3), torch.zeros(3)
    Impl().forward(None, q, None, None, None, None, output=out)
    assert torch.equal(out, q * 2) and st.waves["w1"]["scaled_calls"] == 1
    out = torch.zeros(3)
    Impl().forward(None, q, None, None, None, None, out)  # output by position
    assert torch.equal(out, q * 2)
