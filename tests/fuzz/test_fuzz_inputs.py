"""Bad input never surfaces as a traceback (issue 7, item 4).

Hypothesis plants one fault at a random place in an otherwise valid prompt file (JSONL, CSV,
parquet) or Hub-like record list, and checks that the loader names that place: the file, the line
or row, and the field. Matrix TOML files and CLI values are fuzzed through the real command
(`CliRunner`, `--dry-run`). Every case must end with exit code 2 and one `error:` line (or a clean
exit 0 for input that happens to be valid), never a traceback, and nothing in the results dir:
failing prompt files are also fed to a real (non-dry) run, which must refuse them before it
writes anything. Regression tests for the bugs this fuzzing found sit at the end, and an atheris
harness (tests/fuzz/atheris_inputs.py) runs for a few thousand inputs when atheris is installed.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from support.cli import CliRunner

from cascade_repro import hub
from cascade_repro.cli import app
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.prompts.promptsets import load_prompt_set

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "80"}  # narrow: wrapping shows


# --- the contract -------------------------------------------------------------------------------------


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=OFFLINE)


def assert_clean_outcome(res, results: Path, *named: str) -> str | None:
    """Exit 0, or exit 2 with exactly one `error:` line naming one of `named`; never a traceback.

    Returns the error message (None on success). The results dir must not exist afterwards.
    """
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert not results.exists(), f"a failed or dry run left {sorted(results.rglob('*'))}"
    if res.exit_code == 0:
        return None
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    msg = lines[0].removeprefix("error: ")
    if named:
        flat = msg.replace("-", "_")
        # A value with control characters is named the way the message prints it: escaped, as repr does.
        forms = [f for n in named for f in (n, repr(n)[1:-1])]
        assert any(f.replace("-", "_") in flat for f in forms), (msg, named)
    return msg


def load_error(path_or_spec: str) -> str | None:
    """Load a prompt set; return None when valid, else the UsageError message (one line)."""
    try:
        load_prompt_set(path_or_spec)
    except UsageError as e:
        msg = str(e)
        assert "\n" not in msg and "\r" not in msg, msg
        return msg
    return None


def assert_run_refuses(path: Path, tmp: Path, expected: str) -> None:
    """A real (non-dry) run over a bad prompt file exits 2 with the loader's message, writing nothing."""
    results = tmp / "results"
    res = invoke("matrix", "--prompts", str(path), "--results-dir", str(results), "--quiet")
    msg = assert_clean_outcome(res, results)
    assert msg == expected


# --- planted faults: prompt files -----------------------------------------------------------------


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_prompt = _text.filter(lambda s: s.strip() != "")
_json_scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | _text
_kwarg = st.dictionaries(st.text(max_size=6), _json_scalar, max_size=3)

# field -> (wrong value, fragment the message must contain). Each is wrong on its own, in any record.
JSON_FAULTS = {
    "prompt": [(None, "field 'prompt' is missing"), (5, "field 'prompt' must be a string"),
               ([], "field 'prompt' must be a string"), ("  ", "field 'prompt' is empty"),
               (True, "field 'prompt' must be a string"), ("\ud800", "field 'prompt' contains an unpaired")],
    "key": [(1.5, "field 'key' must be a string or an integer"), ([], "field 'key'"), (True, "field 'key'"),
            ({"a": 1}, "field 'key'"), ("\udcff", "field 'key' contains an unpaired")],
    "instruction_id_list": [("a", "field 'instruction_id_list' must be a list"),
                            (7, "field 'instruction_id_list' must be a list"),
                            ([1], "field 'instruction_id_list' item 0 must be a string"),
                            ([None], "field 'instruction_id_list' item 0")],
    "kwargs": [("x", "field 'kwargs' must be a list"), ([1], "field 'kwargs' item 0 must be an object"),
               ([{}, {}, {}], "field 'kwargs' has 3 entries")],
    "lang": [(5, "field 'lang' must be a string"), (["ko"], "field 'lang' must be a string")],
}  # fmt: skip


@st.composite
def valid_record(draw, index: int) -> dict:
    rec: dict = {"prompt": draw(_prompt)}
    if draw(st.booleans()):
        rec["key"] = draw(st.sampled_from([f"k{index}", index + 10_000]))
    if draw(st.booleans()):
        ids = draw(st.lists(st.text(min_size=1, max_size=8), max_size=2))
        rec["instruction_id_list"] = ids
        if ids and draw(st.booleans()):
            rec["kwargs"] = [draw(_kwarg | st.none()) for _ in ids]
    if draw(st.booleans()):
        rec["lang"] = draw(st.sampled_from(["ko", "en", ""]))
    if draw(st.booleans()):
        rec["other"] = draw(_json_scalar)  # unknown fields are ignored
    return rec


@st.composite
def faulty_jsonl(draw):
    """(lines as bytes, 1-based line of the first fault or None, message fragment or None)."""
    n = draw(st.integers(0, 6))
    lines: list[bytes] = []
    first: tuple[int, str] | None = None
    keys: list = []
    for i in range(n):
        kind = draw(st.sampled_from(["valid"] * 4 + ["blank", "field", "utf8", "malformed", "array", "dup"]))
        lineno = len(lines) + 1
        frag = None
        if kind == "valid" or (kind == "dup" and not keys):
            rec = draw(valid_record(i))
            keys += [rec["key"]] if "key" in rec else []
            lines.append(json.dumps(rec).encode())
        elif kind == "blank":
            lines.append(draw(st.sampled_from([b"", b"   ", b"\t"])))
        elif kind == "field":
            field = draw(st.sampled_from(sorted(JSON_FAULTS)))
            value, frag = draw(st.sampled_from(JSON_FAULTS[field]))
            rec = {"prompt": "fine", "instruction_id_list": ["a"]}
            if value is None:
                rec.pop(field)
            else:
                rec[field] = value
            lines.append(json.dumps(rec).encode())
        elif kind == "utf8":
            lines.append(b'{"prompt": "caf' + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])) + b'"}')
            frag = "not valid UTF-8"
        elif kind == "malformed":
            lines.append(draw(st.sampled_from([b'{"prompt": "a",}', b"{prompt: 1}", b'{"prompt": "a"'])))
            frag = "malformed JSON"
        elif kind == "array":
            lines.append(json.dumps(draw(st.sampled_from([[], ["p"], 5, "p", None]))).encode())
            frag = "expected a JSON object"
        else:  # a key used before
            dup = draw(st.sampled_from(keys))
            lines.append(json.dumps({"key": dup, "prompt": "again"}).encode())
            frag = f"duplicate key {str(dup)!r}"
        if frag and first is None:
            first = (lineno, frag)
    return lines, first


@FUZZ
@given(case=faulty_jsonl(), crlf=st.booleans())
def test_jsonl_fault_is_named_by_file_line_and_field(tmp_path_factory, case, crlf):
    lines, first = case
    tmp = tmp_path_factory.mktemp("jsonl")
    path = tmp / "set.jsonl"
    path.write_bytes((b"\r\n" if crlf else b"\n").join(lines))
    msg = load_error(str(path))
    valid = [ln for ln in lines if ln.strip()]
    if first is None:
        if valid:
            assert msg is None, msg
            assert len(load_prompt_set(str(path)).records) == len(valid)
            return
        assert msg == f"no prompts in {path}"
    else:
        lineno, frag = first
        assert msg is not None and msg.startswith(f"{path} line {lineno}: "), (msg, first)
        assert frag in msg, (msg, frag)
    assert_run_refuses(path, tmp, msg)


CSV_FAULTS = [
    ("prompt", "", "field 'prompt' is empty"),
    ("instruction_id_list", "[1", "field 'instruction_id_list' is not valid JSON"),
    ("instruction_id_list", '{"a": 1}', "field 'instruction_id_list' must be a list, got object"),
    ("instruction_id_list", "[1]", "field 'instruction_id_list' item 0 must be a string"),
    ("kwargs", "[1]", "field 'kwargs' item 0 must be an object"),
    ("kwargs", '"x"', "field 'kwargs' must be a list"),
]
CSV_HEADER = ["key", "prompt", "instruction_id_list", "kwargs", "lang"]


@st.composite
def faulty_csv(draw):
    n = draw(st.integers(0, 6))
    rows: list[bytes] = []
    first = None
    for i in range(n):
        kind = draw(st.sampled_from(["valid"] * 4 + ["field", "extra", "utf8"]))
        row = [f"k{i}", draw(_prompt.filter(lambda s: "\r" not in s and "\n" not in s)), "", "", ""]
        frag = None
        if kind == "field":
            field, value, frag = draw(st.sampled_from(CSV_FAULTS))
            row[CSV_HEADER.index(field)] = value
            if field == "kwargs":
                row[CSV_HEADER.index("instruction_id_list")] = '["a"]'
        elif kind == "extra":
            row.append("surplus")
            frag = "row has more fields than the header"
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(row)
        line = buf.getvalue().encode()
        if kind == "utf8":
            line = line.replace(b"k", b"k\xfe", 1)
            frag = "not valid UTF-8"
        rows.append(line)
        if frag and first is None:
            first = (i + 2, frag)  # the header is line 1
    return rows, first


@FUZZ
@given(case=faulty_csv())
def test_csv_fault_is_named_by_file_line_and_field(tmp_path_factory, case):
    rows, first = case
    tmp = tmp_path_factory.mktemp("csv")
    path = tmp / "set.csv"
    path.write_bytes((",".join(CSV_HEADER) + "\n").encode() + b"".join(rows))
    msg = load_error(str(path))
    if first is None:
        if rows:
            assert msg is None, msg
            return
        assert msg == f"no prompts in {path}"
    else:
        lineno, frag = first
        assert msg is not None and msg.startswith(f"{path} line {lineno}: ") and frag in msg, (msg, first)
    assert_run_refuses(path, tmp, msg)


# Parquet columns are typed: a fault is a whole column of the wrong type, or one null/blank cell.
PARQUET_COLUMN_FAULTS = {
    "prompt": [(pa.array([1, 2, 3]), "field 'prompt' must be a string, got number"),
               (pa.array([b"a", b"b", b"c"]), "field 'prompt' must be a string, got bytes")],
    "key": [(pa.array([1.5, 2.5, 3.5]), "field 'key' must be a string or an integer"),
            (pa.array([[1], [2], [3]]), "field 'key' must be a string or an integer, got array")],
    "instruction_id_list": [(pa.array([[1], [2], [3]]), "field 'instruction_id_list' item 0 must be a string"),
                            (pa.array([1, 2, 3]), "field 'instruction_id_list' must be a list")],
    "kwargs": [(pa.array([[{"when": dt.datetime(2024, 1, 1)}]] * 3), "field 'kwargs' item 0 is not JSON data"),
               (pa.array([[{"blob": b"\x00"}]] * 3), "field 'kwargs' item 0 is not JSON data"),
               (pa.array([[1], [2], [3]]), "field 'kwargs' item 0 must be an object")],
    "lang": [(pa.array([1, 2, 3]), "field 'lang' must be a string")],
}  # fmt: skip


@FUZZ
@given(
    column=st.sampled_from(sorted(PARQUET_COLUMN_FAULTS)),
    pick=st.integers(0, 2),
    blank_row=st.none() | st.integers(0, 2),
    whole_column=st.booleans(),
)
def test_parquet_fault_is_named_by_file_row_and_field(tmp_path_factory, column, pick, blank_row, whole_column):
    tmp = tmp_path_factory.mktemp("parquet")
    path = tmp / "set.parquet"
    prompts = ["one", "two", "three"]
    cols = {"key": pa.array(["a", "b", "c"]), "prompt": pa.array(prompts),
            "instruction_id_list": pa.array([["x"], ["y"], ["z"]])}  # fmt: skip
    expected: tuple[int, str] | None = None
    if whole_column:
        faults = PARQUET_COLUMN_FAULTS[column]
        arr, frag = faults[pick % len(faults)]
        cols[column] = arr
        expected = (1, frag)
    if blank_row is not None:  # a null prompt (missing) or an empty one, in one row
        cells = [None if blank_row % 2 == 0 else "", "ok", "ok"]
        cols["prompt"] = pa.array(cells[-blank_row:] + cells[:-blank_row] if blank_row else cells)
        row = blank_row + 1
        frag = "field 'prompt' is missing" if blank_row % 2 == 0 else "field 'prompt' is empty"
        if expected is None or row < expected[0] or (column == "prompt" and whole_column):
            expected = (row, frag)
    pq.write_table(pa.table(cols), path)
    msg = load_error(str(path))
    if expected is None:
        assert msg is None, msg
        return
    # Within one row the loader checks instruction_id_list, key, prompt, kwargs, lang in that order.
    assert msg is not None and msg.startswith(f"{path} row "), msg
    assert "field '" in msg, msg
    if not (whole_column and blank_row is not None):
        row, frag = expected
        assert msg.startswith(f"{path} row {row}: ") and frag in msg, (msg, expected)
    assert_run_refuses(path, tmp, msg)


class _FakeDataset:
    """Just what promptsets reads from a `datasets.Dataset`: column_names and row iteration."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.column_names = sorted({k for r in rows for k in r}) or ["prompt"]

    def __iter__(self):
        return iter(self.rows)


_py_values = (
    st.none() | st.booleans() | st.integers() | st.floats() | _text | st.binary(max_size=4)
    | st.datetimes() | st.lists(_json_scalar, max_size=2) | st.dictionaries(_text, _json_scalar, max_size=2)
)  # fmt: skip


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(["key", "prompt", "instruction_id_list", "kwargs",
                                                      "lang"]), _py_values, max_size=5), max_size=4))  # fmt: skip
def test_hub_like_records_of_any_python_type_fail_by_row_and_field(rows):
    """Rows as `datasets` yields them (any Python value), through a stand-in `load_dataset`."""
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, split: _FakeDataset(rows)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "datasets", fake)
        mp.setattr(hub, "unreachable", lambda: None)  # the stand-in answers for the Hub
        msg = load_error("hf:someone/prompts")
        if msg is not None:
            assert msg.startswith(("hf:someone/prompts row ", "hf:someone/prompts: ", "no prompts in hf:")), msg
            if " row " in msg.split(":")[1]:
                assert "field '" in msg or "duplicate key" in msg, msg
        else:
            records = load_prompt_set("hf:someone/prompts").records
            json.dumps([list(r.kwargs) for r in records])  # everything loaded can be written to the run dir


# --- matrix TOML -------------------------------------------------------------------------------------


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


KEYS = sorted(MatrixSpec.__dataclass_fields__) + ["seed", "dtype", "fa_version", "backend", "fa-version"]
_toml_scalar = (
    st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _text.filter(lambda s: not s.startswith("hf:"))
    | st.sampled_from(["on", "off", "hf", "vllm", "auto", "float32", "2", "default", "cpu", "lse-layout", "toggle"])
)  # fmt: skip
_toml_values = st.recursive(
    _toml_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=6,
)


@FUZZ
@given(values=st.dictionaries(st.sampled_from(KEYS), _toml_values, max_size=4), table=st.booleans())
@example(values={"prompts": "\x1f"}, table=False)  # found in CI: the message prints the value escaped
@example(values={"arm_switch": {"x": "\x85"}}, table=False)  # a table's JSON kept U+0085 raw: two lines
def test_toml_of_random_values_for_known_keys(tmp_path_factory, values, table):
    tmp = tmp_path_factory.mktemp("toml")
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
    doc = ("[matrix]\n" if table else "") + body
    try:
        tomllib.loads(doc)
    except tomllib.TOMLDecodeError:
        assume(False)  # the generator's own mistake (e.g. fa-version and fa_version both given)
    cfg = tmp / "m.toml"
    cfg.write_text(doc, encoding="utf-8")
    results = tmp / "results"
    res = invoke("matrix", "--config", str(cfg), "--dry-run", "--results-dir", str(results))
    strings = [str(v) for v in values.values() if isinstance(v, str)]
    assert_clean_outcome(res, results, str(cfg), *values, *strings)


@FUZZ
@given(doc=st.text(max_size=60) | st.binary(max_size=60))
def test_toml_of_random_documents(tmp_path_factory, doc):
    tmp = tmp_path_factory.mktemp("toml")
    cfg = tmp / "m.toml"
    cfg.write_bytes(doc if isinstance(doc, bytes) else doc.encode("utf-8", "surrogatepass"))
    results = tmp / "results"
    res = invoke("matrix", "--config", str(cfg), "--dry-run", "--results-dir", str(results))
    assert_clean_outcome(res, results, str(cfg))


# --- CLI values ----------------------------------------------------------------------------------------

_argv_text = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)) | st.sampled_from(["\udcff", "\udc80"]),
    max_size=20,
)  # argv never holds NUL; undecodable bytes arrive as lone surrogates (surrogateescape)
_option_values = {
    "--batch": _argv_text | st.lists(st.integers(-3, 40).map(str), max_size=4).map(",".join),
    "--tp": _argv_text | st.sampled_from(["1", "2", "0", "1,1", "-1", "99999999999999999999"]),
    "--limit": _argv_text | st.integers(-(10**30), 10**30).map(str) | st.sampled_from([str(2**63), str(10**25)]),
    "--max-tokens": _argv_text | st.integers(-(10**30), 10**30).map(str),
    "--cascade": _argv_text | st.lists(st.sampled_from(["on", "off", "yes", "0", "x", ""]), max_size=3).map(",".join),
    "--fa-version": _argv_text | st.lists(st.sampled_from(["2", "3", "fa2", "default", "5", ""]), max_size=3).map(",".join),
    "--hf-overrides": _argv_text | st.recursive(_json_scalar, lambda i: st.lists(i, max_size=2) | st.dictionaries(st.text(max_size=3), i, max_size=2), max_leaves=5).map(json.dumps),
}  # fmt: skip
_CLICK_TYPED = {"--limit", "--max-tokens"}  # int options parsed by click itself


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(sorted(_option_values)), data=st.data())
def test_cli_values(tmp_path_factory, option, data):
    value = data.draw(_option_values[option])
    results = tmp_path_factory.mktemp("cli") / "results"
    res = invoke("matrix", "--dry-run", "--results-dir", str(results), "--limit", "2", option, value)
    if option in _CLICK_TYPED and res.exit_code == 2 and "Invalid value for" in res.stderr:
        # Click's own parse error: exit 2, no traceback, names the option, but in click's
        # multi-line "Usage / Try / Error box" format (cli/ would have to parse these itself).
        assert "Traceback" not in res.output and not results.exists()
        assert f"Invalid value for '{option}'" in " ".join(res.stderr.split()).replace("│ │", "")
        return
    assert_clean_outcome(res, results, option.lstrip("-"))


# --- regressions found by this fuzzing ---------------------------------------------------------------


def test_a_limit_beyond_sys_maxsize_means_every_prompt(tmp_path):
    results = tmp_path / "results"
    res = invoke("matrix", "--dry-run", "--limit", str(10**25), "--results-dir", str(results))
    assert res.exit_code == 0, res.output
    assert not results.exists()


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("system_prompt = 5", "system_prompt must be a string, got 5"),
        ("prompts = 5", "prompts must be a string, got 5"),
        ("model = [1]", "model must be a string"),
        ("device = 0", "device must be a string"),
        ("load_format = 3", "load_format must be a string"),
        ('trust_remote_code = "false"', "trust_remote_code must be true or false, got 'false'"),
        ('rerun = "no"', "rerun must be true or false"),
        ("enforce_eager = 1", "enforce_eager must be true or false"),
        ('seed = "a"', "seed values must be integers from 0 to 4294967295, got 'a'"),
        ("seed = [1.5]", "seed values must be integers from 0 to 4294967295, got 1.5"),
        ("hf_overrides = 5", "hf_overrides must be a table"),
        ('max_model_len = "x"', "max_model_len must be a positive integer"),
        ("topk = true", "topk must be between 1 and 20, got true"),
        ("engine_timeout = nan", "engine_timeout must be positive"),
        ("fa_version = true", "fa_version: expected 2, 3, 4 or default, got 'true'"),
        ("batch = " + "[" * 3000 + "]" * 3000, "invalid TOML: arrays or tables nested too deeply"),
    ],
)
def test_toml_values_of_the_wrong_type_are_named_with_the_file(tmp_path, line, named):
    cfg = tmp_path / "m.toml"
    cfg.write_text(line + "\n")
    results = tmp_path / "results"
    msg = assert_clean_outcome(invoke("matrix", "--config", str(cfg), "--dry-run", "--results-dir", str(results)), results)
    assert msg is not None and msg.startswith(f"{cfg}: ") and named in msg, msg


def test_parquet_kwargs_that_are_not_json_are_refused_before_the_run_dir_exists(tmp_path):
    """They used to load, then crash run.json's neighbour prompts.jsonl half-written, with a traceback."""
    path = tmp_path / "k.parquet"
    pq.write_table(pa.table({"prompt": ["hi"], "instruction_id_list": [["a"]],
                             "kwargs": [[{"when": dt.datetime(2020, 1, 1)}]]}), path)  # fmt: skip
    msg = load_error(str(path))
    assert msg == f"{path} row 1: field 'kwargs' item 0 is not JSON data: Object of type datetime is not JSON serializable"
    assert_run_refuses(path, tmp_path, msg)


def test_deeply_nested_hf_overrides_is_a_usage_error(tmp_path):
    results = tmp_path / "results"
    res = invoke("matrix", "--dry-run", "--hf-overrides", "[" * 100_000, "--results-dir", str(results))
    assert assert_clean_outcome(res, results, "hf-overrides") == "--hf-overrides is nested too deeply"


# --- atheris (coverage-guided), when installed ------------------------------------------------------


def test_atheris_harness_finds_no_crash(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    harness = Path(__file__).with_name("atheris_inputs.py")
    corpus = tmp_path / "corpus"  # seeds: one valid-looking file per format (first byte = format)
    corpus.mkdir()
    seeds = {
        "jsonl": b"\x00" + b'{"key": "a", "prompt": "hi", "instruction_id_list": ["x"], "kwargs": [{"n": 1}]}\n',
        "csv": b"\x01" + b'key,prompt,instruction_id_list\na,hi,"[""x""]"\n',
        "toml": b"\x03" + b'[matrix]\nbatch = [1, 8]\ncascade = ["on", "off"]\nfa_version = 2\nlimit = 4\n',
    }
    buf = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["hi"], "kwargs": [[{"n": 1}]], "instruction_id_list": [["x"]]}), buf)
    seeds["parquet"] = b"\x02" + buf.getvalue()
    for name, data in seeds.items():
        (corpus / name).write_bytes(data)
    env = {**os.environ, **OFFLINE}
    proc = subprocess.run(
        [sys.executable, str(harness), "-seed=1", "-runs=4000", "-max_len=2048",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Done" in proc.stderr or "DONE" in proc.stderr, proc.stderr[-2000:]


def test_parquet_with_invalid_utf8_text_is_a_usage_error(tmp_path):
    """Found by the atheris harness: pyarrow raised UnicodeDecodeError out of the loader."""
    path = tmp_path / "bad.parquet"
    bad = pa.array([b"fine", b"\xa7broken"], type=pa.binary()).view(pa.string())
    pq.write_table(pa.table({"prompt": bad}), path)
    msg = load_error(str(path))
    assert msg == f"{path} row 2: text is not valid UTF-8 (invalid start byte at byte 0)"
