"""vLLM's collect_env output: captured in a child process, redacted, shown collapsed in report.md and issue.md."""

from __future__ import annotations

from cascade_repro.run import envinfo


def test_collect_env_is_captured_and_redacted(fake_vllm, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm))
    text = envinfo.vllm_collect_env()
    assert text is not None and "vLLM Version                 : 0.26.0-fake" in text
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in text
    assert "HF_TOKEN=<redacted>" in text and "hf_abcdefghijklmnop" not in text


def test_no_vllm_no_collect_env(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert envinfo.vllm_collect_env() is None


def test_report_md_and_issue_md_carry_it_collapsed(tmp_path):
    import importlib.util
    import sys
    from pathlib import Path

    # test_report.py's run builder, by its file: the folder holding it is not on the path when this
    # module runs on a worker that collected no report test.
    spec = importlib.util.spec_from_file_location("test_report", Path(__file__).parents[1] / "report" / "test_report.py")
    tr = sys.modules.get("test_report") or importlib.util.module_from_spec(spec)
    if "test_report" not in sys.modules:
        sys.modules["test_report"] = tr
        spec.loader.exec_module(tr)
    from cascade_repro.minimize.render import _collect_env_block
    from cascade_repro.report.load import load_run
    from cascade_repro.report.markdown import MarkdownFormatter
    from cascade_repro.rundir.manifest import Manifest

    # nvidia-smi underlines its topology's header even into a pipe: the escapes go, the text stays.
    topo = "\x1b[4mGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV18"
    run = {**tr.RUN, "vllm_collect_env": f"vLLM Version : 0.26.0\nPyTorch version : 2.11.0\n{topo}"}
    md = MarkdownFormatter().render(load_run(tr.build_run(tmp_path / "run", run)))
    assert "<details><summary>vLLM's collect_env</summary>" in md and "PyTorch version : 2.11.0" in md
    assert "GPU0\tGPU1\tCPU Affinity\n" in md and "\x1b" not in md and "[4m" not in md
    block = "\n".join(_collect_env_block(Manifest.from_json(run)))
    assert "\x1b" not in block and "[0m" not in block and "GPU0\t X" in block
    assert block.startswith("<details>") and "vLLM Version : 0.26.0" in block and block.rstrip().endswith("</details>")
    assert _collect_env_block(Manifest.from_json({})) == []
