"""cascade_repro.run.envinfo: the environment goes into run.json and every report, so no secret may.

Reports get pasted into GitHub issues. A value is redacted when its *name* says secret (TOKEN, SECRET,
API_KEY, ...), and inline when it *looks* like a credential under an innocent name (``hf_...``,
``sk-...``, ``user:pass@`` in a URL).
"""

from __future__ import annotations

import json

import pytest

from cascade_repro.run import envinfo
from cascade_repro.run.envinfo import REDACTED, capture, redact_value, relevant_env

HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
OPENAI = "sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
MY_SECRET = "correct-horse-battery-staple"
URL_PASSWORD = "s3cr3tPa55"

SECRETS = {
    "HF_TOKEN": HF,
    "OPENAI_API_KEY": OPENAI,
    "MY_SECRET_THING": MY_SECRET,
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "VLLM_API_KEY": "plain-looking-value-123",
    "VLLM_HF_TOKEN_FALLBACK": HF,
    "CASCADE_REPRO_DB_PASSWORD": "hunter2hunter2",
}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_secret_names_redact_the_whole_value(name):
    assert redact_value(name, SECRETS[name]) == REDACTED


@pytest.mark.parametrize("name", ["github_token", "Auth_Header", "my_private_key", "DB_PASSWD", "x_apikey"])
def test_secret_name_match_is_case_insensitive(name):
    assert redact_value(name, "whatever") == REDACTED


def test_url_credentials_are_redacted_and_the_rest_of_the_url_kept():
    value = f"https://alice:{URL_PASSWORD}@mirror.example.com:8443/simple?x=1"
    assert redact_value("VLLM_MIRROR", value) == "https://<redacted>@mirror.example.com:8443/simple?x=1"
    # A bare token used as the user name.
    assert redact_value("VLLM_REPO", "https://ghp_abc@github.com/x") == "https://<redacted>@github.com/x"
    # Several URLs in one value.
    two = f"http://a:b@h1/ s3://k:{URL_PASSWORD}@bucket/p"
    out = redact_value("VLLM_URLS", two)
    assert URL_PASSWORD not in out and "a:b" not in out
    assert out == "http://<redacted>@h1/ s3://<redacted>@bucket/p"


@pytest.mark.parametrize(
    "token",
    [
        HF,
        OPENAI,
        "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2",
        "AKIAIOSFODNN7EXAMPLE",
        "xoxb-1234567890-abcdefghij",
    ],
)
def test_token_looking_values_are_redacted_under_innocent_names(token):
    assert redact_value("VLLM_EXTRA_ARGS", token) == REDACTED
    assert redact_value("VLLM_EXTRA_ARGS", f"--token {token} --x 1") == f"--token {REDACTED} --x 1"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_ATTENTION_BACKEND", "FLASH_ATTN"),
        ("VLLM_FLASH_ATTN_VERSION", "3"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("VLLM_CACHE_ROOT", "/home/u/.cache/vllm"),
        ("VLLM_HOST", "http://localhost:8000/v1"),
        ("VLLM_NOTE", "hf_short"),  # too short to be a token
    ],
)
def test_ordinary_values_pass_through(name, value):
    assert redact_value(name, value) == value


def test_relevant_env_keeps_only_run_shaping_prefixes_sorted_and_redacted():
    environ = {
        "VLLM_USE_V1": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "HF_HUB_OFFLINE": "1",
        "CASCADE_REPRO_CACHE": "/tmp/c",
        "VLLM_PROXY": f"http://bob:{URL_PASSWORD}@proxy:3128",
        "VLLM_SOMETHING": HF,
        "VLLM_API_KEY": "abc",
        "HOME": "/root",
        "PATH": "/usr/bin",
        **SECRETS,
    }
    env = relevant_env(environ)

    assert list(env) == sorted(env)
    assert "HOME" not in env and "PATH" not in env
    assert "HF_TOKEN" not in env and "OPENAI_API_KEY" not in env  # not run-shaping: not even listed
    assert env["VLLM_USE_V1"] == "1"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_PROXY"] == "http://<redacted>@proxy:3128"
    assert env["VLLM_SOMETHING"] == REDACTED
    assert env["VLLM_API_KEY"] == REDACTED
    assert env["CASCADE_REPRO_DB_PASSWORD"] == REDACTED
    dumped = json.dumps(env)
    for secret in (HF, OPENAI, AWS_SECRET, MY_SECRET, URL_PASSWORD, "hunter2"):
        assert secret not in dumped


def test_capture_never_contains_planted_secrets(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VLLM_INNOCENT", HF)
    monkeypatch.setenv("VLLM_MIRROR_URL", f"https://alice:{URL_PASSWORD}@mirror.example.com/")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    monkeypatch.setattr(envinfo, "_nvidia_smi", dict)  # no subprocess; the CPU path

    info = capture(include_gpu=False)
    dumped = json.dumps(info)

    for secret in (
        HF,
        OPENAI,
        AWS_SECRET,
        MY_SECRET,
        URL_PASSWORD,
        "hunter2hunter2",
        "plain-looking-value-123",
    ):
        assert secret not in dumped
    assert info["vllm_env"]["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"
    assert info["vllm_env"]["VLLM_INNOCENT"] == REDACTED
    assert info["vllm_env"]["VLLM_MIRROR_URL"] == "https://<redacted>@mirror.example.com/"
    assert {"python", "platform", "torch", "transformers", "vllm", "cascade_repro"} <= set(info)
    assert all(isinstance(v, str) for k, v in info.items() if k != "vllm_env")


def test_capture_on_a_machine_without_gpus_says_so(monkeypatch):
    monkeypatch.setattr(envinfo, "gpu_info", dict)
    info = capture(include_gpu=True)
    assert (info["gpu_name"], info["gpu_count"]) == ("none (CPU)", "0")


def test_url_password_containing_an_at_sign_is_fully_redacted():
    out = redact_value("VLLM_MIRROR", "https://alice:p@ss-w0rd@mirror.example.com/simple")
    assert "ss-w0rd" not in out
    assert out == "https://<redacted>@mirror.example.com/simple"


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        ({"url": "https://example.org/o/cascade-repro.git", "vcs_info": {"vcs": "git", "commit_id": "ab12" * 10}},
         {"repository": "https://example.org/o/cascade-repro.git", "commit": "ab12" * 10}),
        ({"url": "https://example.org/dl/cascade_repro-0.1.0.tar.gz", "archive_info": {}},
         {"archive": "https://example.org/dl/cascade_repro-0.1.0.tar.gz"}),
        ({"url": "file:///home/someone/cascade_repro-0.1.0-py3-none-any.whl", "archive_info": {}}, {}),
        ({"url": "file:///home/someone/src", "dir_info": {"editable": True}}, {}),
        (None, {}),
    ],
)  # fmt: skip
def test_an_installed_copy_records_where_pip_got_it(monkeypatch, direct_url, expected):
    """PEP 610's direct_url.json: an address another machine can install from, never a local path."""

    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return None if direct_url is None else json.dumps(direct_url)

    monkeypatch.setattr(envinfo.metadata, "distribution", lambda name: Dist())
    assert envinfo._installed_from() == expected


@pytest.mark.parametrize(("given", "count"), [("2x80", 2), ("8x141", 8), ("24,80", 2), ("none", 0)])
def test_the_gpu_count_follows_the_machine_the_packing_plans_for(monkeypatch, given, count):
    """``CASCADE_REPRO_GPUS`` stands in for the machine: ``--twin all``'s tp and the TP check count the
    same GPUs the packing places engines on, whatever CUDA_VISIBLE_DEVICES or nvidia-smi say here."""
    from cascade_repro.plan import gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv(gpus.ENV, given)
    assert envinfo.visible_gpu_count() == count == len(gpus.detect())


def _nvidia_smi_listing(monkeypatch, n):
    import shutil
    import subprocess

    listing = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})\n" for i in range(n))
    monkeypatch.setattr(shutil, "which", lambda name: "/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(
        subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr="")
    )


@pytest.mark.parametrize(
    ("visible", "listed", "count"),
    [
        (None, 4, 4),  # nvidia-smi's list
        ("0,1", 4, 2),  # no more than CUDA_VISIBLE_DEVICES names
        ("0,1,-1,2", 4, 2),  # CUDA stops at the first invalid entry
        ("0,1,2", 1, 1),  # nor more than the machine has
        ("", 4, 0),  # hidden
    ],
)
def test_the_gpu_count_is_nvidia_smis_within_cuda_visible_devices(monkeypatch, visible, listed, count):
    from cascade_repro.plan import gpus

    monkeypatch.delenv(gpus.ENV, raising=False)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _nvidia_smi_listing(monkeypatch, listed)
    assert envinfo.visible_gpu_count() == count


def test_without_nvidia_smi_cuda_visible_devices_alone_counts(monkeypatch):
    import shutil

    from cascade_repro.plan import gpus
    from cascade_repro.run import preparation

    monkeypatch.delenv(gpus.ENV, raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert envinfo.visible_gpu_count() == 2 == preparation.visible_gpus()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert envinfo.visible_gpu_count() == 0 == preparation.visible_gpus()
