"""jsonl.JsonlWriter with background=True writes the same bytes, in the same order, as in the
foreground; wait/sync/close drain it; a failed write is raised by the next call."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.rundir import codec, jsonl


def records(n: int) -> list:
    out: list = []
    for w in range(n):
        for i in range(4):
            out.append(codec.SampleRecord(cell_id="c", wave=w, prompt_index=i, token_ids=[w, i],
                                             logprobs=[-0.5 * i], topk=[[[1, -0.5]]]))  # fmt: skip
        out.append(codec.WaveRecord(cell_id="c", wave=w, batch=4, n_real=4, tokens=8))
    return out


def write_all(path: Path, background: bool) -> None:
    wr = jsonl.JsonlWriter(path, background=background)
    wr.write(codec.CellStart("c"))
    wr.write_line(b'{"type":"kept","raw":true}\n')
    for j, rec in enumerate(records(50)):
        wr.write(rec)
        if j % 5 == 4:
            wr.flush()
    wr.write({"type": "cell_done", "cell_id": "c", "n_samples": 200, "wall_s": 1.0})
    wr.close()


def test_background_writes_the_foreground_bytes(tmp_path: Path):
    write_all(tmp_path / "fg.jsonl", background=False)
    write_all(tmp_path / "bg.jsonl", background=True)
    fg = (tmp_path / "fg.jsonl").read_bytes()
    assert fg == (tmp_path / "bg.jsonl").read_bytes()
    assert fg.count(b"\n") == 1 + 1 + 250 + 1


def test_wait_and_sync_leave_everything_queued_on_disk(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    wr = jsonl.JsonlWriter(path, background=True)
    for rec in records(20):
        wr.write(rec)
    wr.flush()
    wr.wait()
    assert path.read_bytes().count(b"\n") == 100
    wr.write(codec.CellDone("c", n_samples=80))
    wr.sync()
    assert path.read_bytes().endswith(b'"n_samples":80,"wall_s":0.0}\n')
    wr.close()
    wr.close()  # a second close is a no-op


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path: Path):
    path = tmp_path / "e.jsonl"
    wr = jsonl.JsonlWriter(path, background=True)
    wr.write(codec.CellStart("c"))
    wr.write({"type": "bad", "value": object()})  # not JSON: fails on the thread
    with pytest.raises(TypeError, match="not JSON serializable"):
        # Raised by this write if the thread already failed, else by wait; either way the record
        # after the failure is not written.
        wr.write(codec.CellStart("after"))
        wr.wait()
    wr.close()
    assert path.read_text().splitlines() == ['{"type":"cell_start","cell_id":"c"}']
