"""The background writer's GIL contention with a wave's RPCs, on CPU: is ``JsonlWriter.hold`` worth it?

On the H200 (benchmarks/RESULTS.md 1g) the records of one wave, encoded on the writer's thread as
the next wave starts, made that wave's ``reset_prefix_cache`` RPC grow from ~14 to ~37 ms at b64.
This models why, without vLLM: a server process answers the main thread's requests over a pipe, as
vLLM's engine core does. Each wave is:

- a **reset**: ``--reset-rpcs`` short round trips (the server answers at once), and
- a **generate**: ``--steps`` steps during which the server "runs the GPU" for ``--gpu-ms`` and
  sends an output, each taking ``--cpu-ms`` of Python work in the main thread (output processing).
  The server does not wait for the client between steps, as vLLM V1's engine core does not
  (``--lockstep``: it does).

As in vLLM's ``SyncMPClient``, the answers are received by a relay thread and handed to the main
thread through a queue (``--no-relay``: the main thread reads the pipe itself), so each answer
needs the GIL twice.

While the main thread waits on the pipe it releases the GIL; when the answer comes it must take the
GIL back, and a thread holding it keeps it for up to the switch interval (5 ms by default). The
writer encodes ``--batch`` real sample records (128 tokens, top-5, float32 logprobs, as the worker
writes them) in one of three modes, each wave in a rotating order:

- **none**: no writer work (the floor);
- **nohold**: the records queued as the wave starts (what the worker does);
- **hold**: queued behind ``hold()`` and released when the generate starts (the worker for a few
  hours: on the H200 the held JSON slowed the b64 generate by more than it saved in the reset,
  RESULTS.md 1i, a cost this model, with its light output handling, did not show).

    python benchmarks/bench_writer_contention.py --batch 64 --waves 12

Prints, per mode, the median reset and generate ms and the wave total. A CPU model of the mechanism
only: the GPU figures are the ones in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("none", "nohold", "hold")


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def serve(conn: Any) -> None:
    """The engine core: answer a request after the milliseconds it asks for (busy, like a GPU poll);
    ``(n, ms)`` runs n steps of ms each and sends an output after each, not waiting for the client,
    as vLLM V1's engine core does while requests are running."""
    while True:
        req = conn.recv()
        if req is None:
            return
        if isinstance(req, tuple):
            n, ms = req
            for _ in range(n):
                _spin(ms)
                conn.send(0)
            continue
        _spin(req)
        conn.send(0)


def records(batch: int, max_tokens: int, topk: int, seed: int = 0) -> list[Any]:
    from cascade_repro.run import runstore

    rng = random.Random(seed)

    def f32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]

    out = []
    for i in range(batch):
        lps = [f32(-abs(rng.gauss(0, 3))) for _ in range(max_tokens)]
        top = [[[rng.randrange(49152), f32(-abs(rng.gauss(0, 3)))] for _ in range(topk)] for _ in range(max_tokens)]
        out.append(runstore.SampleRecord(cell_id="c", wave=0, prompt_index=i, token_ids=[rng.randrange(49152) for _ in range(max_tokens)],
                                         text="x" * 400, finish_reason="length", logprobs=lps, topk=top))  # fmt: skip
    return out


def busy_python(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


class Relay:
    """vLLM's output thread: it receives the engine core's answers and queues them for the caller."""

    def __init__(self, conn: Any, relay: bool) -> None:
        import queue
        import threading

        self.conn = conn
        self.q: Any = queue.SimpleQueue() if relay else None
        if relay:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self.q.put(self.conn.recv())
            except EOFError:
                return

    def send(self, x: Any) -> None:
        self.conn.send(x)

    def recv(self) -> Any:
        if self.q is not None:
            return self.q.get(timeout=30)  # raises queue.Empty if the server died
        if not self.conn.poll(30):
            raise TimeoutError("the server process stopped answering")
        return self.conn.recv()


def wave(conn: Any, a: argparse.Namespace, writer: Any, recs: list[Any], mode: str) -> dict[str, float]:
    t0 = time.perf_counter()
    if mode != "none":
        if mode == "hold":
            writer.hold()
        for r in recs:
            writer.write(r)
        writer.flush()
    for _ in range(a.reset_rpcs):
        conn.send(a.rpc_ms)
        conn.recv()
    t1 = time.perf_counter()
    writer.release()
    if a.pipelined:
        conn.send((a.steps, a.gpu_ms))
    for _ in range(a.steps):
        if not a.pipelined:
            conn.send(a.gpu_ms)
        conn.recv()
        busy_python(a.cpu_ms)
    t2 = time.perf_counter()
    writer.wait()  # outside the wave: what is left is the next wave's business in a worker
    return {"reset_ms": (t1 - t0) * 1e3, "generate_ms": (t2 - t1) * 1e3, "wave_ms": (t2 - t0) * 1e3,
            "left_ms": (time.perf_counter() - t2) * 1e3}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--waves", type=int, default=12, help="waves per mode (one extra warm-up each)")
    ap.add_argument("--reset-rpcs", type=int, default=4, help="short round trips before the generate")
    ap.add_argument("--rpc-ms", type=float, default=0.5, help="server time of a short round trip")
    ap.add_argument("--steps", type=int, default=32, help="generate steps (round trips) per wave")
    ap.add_argument("--gpu-ms", type=float, default=20.0, help="server time per step")
    ap.add_argument("--cpu-ms", type=float, default=3.0, help="main-thread Python work per step")
    ap.add_argument("--lockstep", dest="pipelined", action="store_false",
                    help="each step waits for the client's request (default: the server runs the steps "
                         "back to back and the client keeps up, as vLLM V1's engine core does)")  # fmt: skip
    ap.add_argument("--no-relay", dest="relay", action="store_false", help="the main thread reads the pipe itself")
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    from cascade_repro.run import runstore

    recs = records(a.batch, a.max_tokens, a.topk)
    ours, theirs = mp.Pipe()
    # fork where there is one: the server needs only this function, and a spawned child would have to
    # import this script by name (it cannot when the script was loaded from its path).
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    server = ctx.Process(target=serve, args=(theirs,), daemon=True)
    server.start()
    link = Relay(ours, a.relay)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as d:
        writer = runstore.JsonlWriter(Path(d) / "s.jsonl", background=True)
        t = time.perf_counter()
        for r in recs:
            writer.write(r)
        writer.wait()
        json_ms = (time.perf_counter() - t) * 1e3
        for i in range(a.waves + 1):
            for j in range(len(MODES)):
                mode = MODES[(i + j) % len(MODES)]
                r = wave(link, a, writer, recs, mode)
                if i:  # the first round warms up
                    rows[mode].append(r)
        writer.close()
    ours.send(None)
    server.join(5)
    summary = {m: {k: round(statistics.median(r[k] for r in rows[m]), 2) for k in rows[m][0]} for m in MODES}
    result = {"args": {k: str(v) for k, v in vars(a).items()}, "json_ms_alone": round(json_ms, 2),
              "switch_interval_s": sys.getswitchinterval(), "summary": summary, "waves": rows}  # fmt: skip
    print(f"the records' JSON alone on the writer's thread: {json_ms:.1f} ms ({a.batch} records)")
    print("| mode | reset ms | generate ms | wave ms | writer left after the wave ms |")
    print("|---|---|---|---|---|")
    for m in MODES:
        s = summary[m]
        print(f"| {m} | {s['reset_ms']:.1f} | {s['generate_ms']:.1f} | {s['wave_ms']:.1f} | {s['left_ms']:.1f} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
