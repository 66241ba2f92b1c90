"""runstore.JsonlWriter with background=True writes the same bytes, in the same order, as in the
foreground; wait/sync/close drain it; a failed write is raised by the next call; hold keeps what
follows it until release (or wait, or its time limit)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cascade_repro.run import runstore


def records(n: int) -> list:
    out: list = []
    for w in range(n):
        for i in range(4):
            out.append(runstore.SampleRecord(cell_id="c", wave=w, prompt_index=i, token_ids=[w, i],
                                             logprobs=[-0.5 * i], topk=[[[1, -0.5]]]))  # fmt: skip
        out.append(runstore.WaveRecord(cell_id="c", wave=w, batch=4, n_real=4, tokens=8))
    return out


def write_all(path: Path, background: bool) -> None:
    wr = runstore.JsonlWriter(path, background=background)
    wr.write(runstore.CellStart("c"))
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
    wr = runstore.JsonlWriter(path, background=True)
    for rec in records(20):
        wr.write(rec)
    wr.flush()
    wr.wait()
    assert path.read_bytes().count(b"\n") == 100
    wr.write(runstore.CellDone("c", n_samples=80))
    wr.sync()
    assert path.read_bytes().endswith(b'"n_samples":80,"wall_s":0.0}\n')
    wr.close()
    wr.close()  # a second close is a no-op


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path: Path):
    path = tmp_path / "e.jsonl"
    wr = runstore.JsonlWriter(path, background=True)
    wr.write(runstore.CellStart("c"))
    wr.write({"type": "bad", "value": object()})  # not JSON: fails on the thread
    with pytest.raises(TypeError, match="not JSON serializable"):
        # Raised by this write if the thread already failed, else by wait; either way the record
        # after the failure is not written.
        wr.write(runstore.CellStart("after"))
        wr.wait()
    wr.close()
    assert path.read_text().splitlines() == ['{"type":"cell_start","cell_id":"c"}']


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def _until_lines(path: Path, n: int, timeout: float = 5.0) -> int:
    """Poll until the file has n lines (the writer's thread works on its own time); return the count."""
    deadline = time.monotonic() + timeout
    while _lines(path) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return _lines(path)


def test_hold_keeps_what_follows_until_release(tmp_path: Path):
    path = tmp_path / "h.jsonl"
    wr = runstore.JsonlWriter(path, background=True)
    wr.write(runstore.CellStart("c"))
    wr.flush()
    wr.hold()
    for rec in records(2):
        wr.write(rec)
    wr.flush()
    assert _until_lines(path, 1) == 1  # the line before the hold is written (on a loaded box, not at once)
    time.sleep(0.2)  # the thread had time to write the rest, had it not been held
    assert _lines(path) == 1
    wr.release()
    assert _until_lines(path, 11) == 11
    wr.hold()
    wr.write(runstore.CellDone("c", n_samples=8))
    wr.sync()  # waiting releases the hold: resume's cell_done reaches the disk
    assert path.read_text().splitlines()[-1].startswith('{"type":"cell_done"')
    wr.hold()
    wr.write(runstore.CellStart("d"))
    wr.close()  # so does closing
    assert _lines(path) == 13


def test_a_hold_nobody_releases_ends_after_its_limit(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    wr = runstore.JsonlWriter(path, background=True)
    wr.HOLD_MAX_S = 0.2
    wr.hold()
    wr.write(runstore.CellStart("c"))
    wr.flush()
    assert _until_lines(path, 1) == 1
    wr.close()


def test_hold_and_release_do_nothing_in_the_foreground(tmp_path: Path):
    path = tmp_path / "f.jsonl"
    wr = runstore.JsonlWriter(path)
    wr.hold()
    wr.write(runstore.CellStart("c"))
    wr.flush()
    assert _lines(path) == 1
    wr.release()
    wr.close()


def test_a_release_frees_every_earlier_hold_even_when_the_thread_comes_late(tmp_path: Path):
    """hold, release, hold again before the thread reached the first hold: the first hold's records
    must not wait for the second release (they were released already)."""
    path = tmp_path / "l.jsonl"
    wr = runstore.JsonlWriter(path, background=True)
    wr.hold()  # the thread waits here
    wr.write(runstore.CellStart("first"))
    wr.flush()
    wr.hold()
    wr.write(runstore.CellStart("second"))
    wr._released = 1  # what release() after the first hold alone would have recorded
    with wr._go:
        wr._go.notify()
    _until_lines(path, 1)
    time.sleep(0.1)  # had the second hold let "second" through, it would be here by now
    assert path.read_text().splitlines() == ['{"type":"cell_start","cell_id":"first"}']
    wr.release()
    wr.wait()
    assert _lines(path) == 2
    wr.close()
