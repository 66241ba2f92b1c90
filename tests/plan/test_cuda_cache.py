"""cuda_cache.py: one CUDA compute cache per machine for the workers, unless the user chose one."""

from __future__ import annotations

from cascade_repro.plan import cuda_cache


def test_workers_get_the_tools_cache_with_4_gib(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path / "c"))
    env = cuda_cache.apply({})
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / "c" / "cuda-compute-cache")
    assert env["CUDA_CACHE_MAXSIZE"] == str(4 * 1024**3)
    assert (tmp_path / "c" / "cuda-compute-cache").is_dir()


def test_the_users_choice_stands(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path / "c"))
    env = cuda_cache.apply({"CUDA_CACHE_PATH": "/mine", "CUDA_CACHE_MAXSIZE": "123"})
    assert env == {"CUDA_CACHE_PATH": "/mine", "CUDA_CACHE_MAXSIZE": "123"}
    assert not (tmp_path / "c").exists()


def test_an_unwritable_cache_dir_leaves_cudas_default(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path / "file"))  # a file: mkdir below it fails
    env = cuda_cache.apply({})
    assert "CUDA_CACHE_PATH" not in env and env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)


def test_fa2_jit_note_once_per_gpu_model(tmp_path):
    env = {"CUDA_CACHE_PATH": str(tmp_path)}
    assert cuda_cache.needs_fa2_jit(2, "NVIDIA H200") and cuda_cache.needs_fa2_jit("2", "NVIDIA H100 80GB HBM3")
    assert not cuda_cache.needs_fa2_jit(3, "NVIDIA H200")  # FA3 ships Hopper code
    assert not cuda_cache.needs_fa2_jit(2, "NVIDIA A100-SXM4-80GB")  # sm_80: native code in the wheel
    assert not cuda_cache.needs_fa2_jit(None, "NVIDIA H200")  # vLLM's default there is FA3
    assert not cuda_cache.fa2_compiled(env, "NVIDIA H200")
    cuda_cache.mark_fa2_compiled(env, "NVIDIA H200")
    assert cuda_cache.fa2_compiled(env, "NVIDIA H200") and not cuda_cache.fa2_compiled(env, "NVIDIA H100")
    assert not cuda_cache.fa2_compiled({}, "NVIDIA H200")
