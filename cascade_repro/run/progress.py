"""A matrix's progress: cells, waves, tokens/s and the time left, on a terminal or in a log.

On a terminal it is rich's live bar. Where stderr is not a terminal (CI, ``2> log``, ``| tee``) a
live bar prints nothing until it ends, so a 30-minute run looked hung: there it is plain lines, one
per engine start and finished cell, and one at least every ``HEARTBEAT_S`` (``tick``: also while a
long wave or an engine start finishes nothing, so the log never looks hung).

The time left follows this machine's own waves once one has finished (in this run or the earlier
invocation it resumes): the remaining waves per batch size times the run's own mean wave time at
that batch, a batch not seen yet at the table's time scaled by how much slower than the table the
seen waves ran, plus the engine starts still to come (as long as the ones seen took). Before that it
is the speed table's (``estimate.SPEEDS``) figure, labelled ``(speed table)``: the table was measured
on an idle box and a loaded one ran 20 times slower, so once the first wave has run longer than the
table says, its time so far stands in for the mean (``(first wave so far)``). Without a table it is
``ETA measuring``. The wave under way counts down with the clock; once it has run longer than its
batch's mean, its time so far joins that mean (it will take at least that long), so a stalled wave
raises the estimate line by line instead of repeating it. The exception is an engine's first wave
that compiles kernels (FA2's first run on a fresh machine: minutes): its time says nothing of the
waves to come, so it neither raises the estimate while it runs nor joins the means. An engine start
under way counts down from the expected start (the mean of the starts seen, else the table's), FA2's
compile added to it and then to that engine's first waves (``estimate.FA2_JIT_START_S``,
``FA2_JIT_WAVES_S``). ``tick`` redraws it on the bar too, whose text otherwise changes only when a
wave ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cascade_repro.plan import estimate

HEARTBEAT_S = 30.0
LISTED = 3  # engines named one by one on a progress line; more are grouped by state


class RunProgress:
    """What the runner reports while workers run; shows it as a bar or as lines."""

    def __init__(
        self,
        console: Any,
        *,
        show: bool,
        cells: Mapping[str, Mapping[str, Any]],
        n_prompts: int,
        max_tokens: int,
        table: estimate.SpeedTable | None,
        measured: Iterable[Mapping[str, Any]] = (),
        starts_left: int = 0,
        clock: Callable[[], float] = time.monotonic,
        plain: bool | None = None,
        parallel: int = 1,
    ) -> None:
        self.console = console
        self.show = show
        self.clock = clock
        self.t0 = clock()
        self.n_prompts, self.max_tokens, self.table = n_prompts, max_tokens, table
        self.batch_of = {cid: int(c["batch"]) for cid, c in cells.items()}
        self.key_of = {cid: str(c.get("engine_key") or "") for cid, c in cells.items()}
        # Engines side by side (plan/packing.py): about this many at once, each one's state shown.
        self.parallel = max(1, int(parallel))
        self.engines: dict[str, str] = {}
        self.cells_total = len(cells)
        self.waves_total = sum(estimate.wave_count(n_prompts, b) for b in self.batch_of.values())
        self.cells_done = self.waves_done = 0
        self.remaining: dict[int, int] = {}
        for b in self.batch_of.values():
            self.remaining[b] = self.remaining.get(b, 0) + estimate.wave_count(n_prompts, b)
        self.walls: dict[int, list[float]] = {}
        for w in measured:
            self._add_wall(w)
        self.starts_left = starts_left
        self.tokens = 0
        self.gen_s = 0.0
        self.copies: dict[str, int] = {}  # kept waves still to arrive, per cell (copied, not generated)
        self.current = ""
        self.status = ""
        self._last_line = -HEARTBEAT_S
        self._waves_at_line = -1
        self._wave_t0: float | None = None  # when the wave under way began (None: no engine up)
        self._running: int | None = None  # its batch size (None: between cells)
        self._starts_seen: list[float] = []
        # Engines whose first wave, still to come, compiles kernels -> when the engine came up (None:
        # not up, or no longer running).
        self._cold: dict[str, float | None] = {}
        self._starting: dict[str, float] = {}  # an engine start under way -> when it began
        is_terminal = bool(getattr(console, "is_terminal", False))
        self.plain = (not is_terminal) if plain is None else plain
        self._bar: Any = None
        if show and not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False,
            )  # fmt: skip
            self._t_cells = self._bar.add_task("cells", total=self.cells_total, info="")
            self._t_waves = self._bar.add_task("waves", total=self.waves_total, info="")

    # --- context --------------------------------------------------------------------------------

    def __enter__(self) -> RunProgress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.update(self._t_cells, info="")
            self._bar.__exit__(*exc)

    # --- events ---------------------------------------------------------------------------------

    def already_done(self, cell_ids: Iterable[str]) -> None:
        """Cells finished by an earlier invocation: counted as done, their waves too."""
        for cid in cell_ids:
            b = self.batch_of.get(cid)
            if b is None:
                continue
            n = estimate.wave_count(self.n_prompts, b)
            self.cells_done += 1
            self.waves_done += n
            self.remaining[b] -= n
            self._advance(cells=1, waves=n)

    def engine_starting(self, key: str, note: str = "", compiles: bool = False) -> None:
        """``compiles``: this engine's first wave compiles kernels for the GPU (FA2's first run on a
        fresh machine): that wave's time is a one-off, kept out of the time per wave."""
        if compiles:
            self._cold[key] = None
        self._starting[key] = self.clock()
        self.engines[key] = "starting" + (f" ({note})" if note else "")
        self.status = self._engines_text() or f"engine {key}: starting" + (f" ({note})" if note else "")
        self._wave_t0 = None  # an engine start is not a wave: its time is the starts' share
        self._refresh(force=True)

    def engine_up(self, key: str, start_s: float) -> None:
        self.starts_left = max(0, self.starts_left - 1)
        self._starting.pop(key, None)
        if key in self._cold:
            self._cold[key] = self.clock()  # its first waves compile the rest
        elif start_s > 0:
            self._starts_seen.append(float(start_s))  # a compiling start says nothing of the next ones
        self.engines[key] = f"up in {start_s:.0f} s"
        self.status = self._engines_text() or f"engine {key} up in {start_s:.0f} s"
        self._wave_t0 = self.clock()
        self._refresh(force=True)

    def engine_done(self, key: str) -> None:
        """A key's worker has ended (finished, failed or killed): no longer shown as running."""
        self.engines.pop(key, None)
        self._starting.pop(key, None)
        if self._cold.get(key) is not None:
            self._cold[key] = None  # its compile no longer counts down
        if len(self.engines) > 1 or self.status.startswith("engines "):
            self.status = self._engines_text()

    def _engines_text(self) -> str:
        """Every running engine's state, when more than one runs: ``engines k1: starting; k2: b8-cell``,
        each key without the part every key of the plan shares (``vllm-tp1-auto-...-s0-``); past
        :data:`LISTED` engines, grouped by state (``8 engines: starting async, sync; running graphs``),
        so a line stays readable with eight engines on a GPU."""
        if len(self.engines) < 2:
            return ""
        keys = sorted({*self.key_of.values(), *self.engines})
        shared = os.path.commonprefix(keys)
        shared = shared[: shared.rfind("-") + 1]  # whole parts of a key only
        short = {k: k[len(shared) :] or k for k in self.engines}
        if len(self.engines) <= LISTED:
            return "engines " + "; ".join(f"{short[k]}: {v}" for k, v in self.engines.items())
        groups: dict[str, list[str]] = {}
        for k, v in self.engines.items():
            state = "starting" if v.startswith("starting") else "up" if v.startswith("up in") else "running"
            groups.setdefault(state, []).append(short[k])
        return f"{len(self.engines)} engines: " + "; ".join(
            f"{st} {', '.join(ks)}" for st, ks in groups.items()
        )

    def _engine_at(self, cid: str) -> None:
        """A record of cell ``cid`` came in: its engine's state is that cell."""
        if (key := self.key_of.get(cid)) and key in self.engines:
            self.engines[key] = cid

    def record(self, rec: Mapping[str, Any]) -> None:
        """A control record the worker appended (cell_start, wave, cell_done, cell_error)."""
        from cascade_repro.rundir import codec

        t = rec.get("type")
        if t in (codec.CELL_START, codec.WAVE):
            self._engine_at(str(rec.get("cell_id", "")))
        if t == codec.CELL_START:
            self.current = str(rec.get("cell_id", ""))
            self._running = self.batch_of.get(self.current)
            if rec.get("kept_waves"):
                self.copies[self.current] = int(rec["kept_waves"])
        elif t == codec.WAVE:
            cid = str(rec.get("cell_id", ""))
            self.current, self.status = cid, self._engines_text()
            b = int(rec.get("batch") or self.batch_of.get(cid, 0))
            self.waves_done += 1
            if b in self.remaining:
                self.remaining[b] = max(0, self.remaining[b] - 1)
            compiled = False
            if self.copies.get(cid):
                self.copies[cid] -= 1  # a kept wave's copy: its time was measured by the earlier run
            else:
                self.tokens += int(rec.get("tokens") or 0)
                self.gen_s += float(rec.get("wall_s") or 0.0)
                if compiled := (key := self.key_of.get(cid, "")) in self._cold:
                    del self._cold[key]  # the wave that compiled: no measure of the ones to come
            if not compiled:
                self._add_wall(rec)
            self._wave_t0, self._running = self.clock(), b
            self._advance(waves=1)
            self._refresh()
        elif t in (codec.CELL_DONE, codec.CELL_ERROR):
            self._running = None
            self.cells_done += 1
            self._advance(cells=1)
            self._refresh(force=True)

    def tick(self) -> None:
        """Called while the runner waits on a worker: the bar's time left moves with the clock, and a
        log gets a line once ``HEARTBEAT_S`` have passed since the last one even though nothing
        finished."""
        if not self.show:
            return
        if self._bar is not None:
            self._refresh()
        elif self.clock() - self._last_line >= HEARTBEAT_S:
            self._refresh(force=True)

    def cells_failed(self, n: int) -> None:
        """Cells a dead worker never finished (marked as errors by the runner)."""
        self.cells_done += n
        self._advance(cells=n)
        self._refresh(force=True)

    # --- figures --------------------------------------------------------------------------------

    def rate(self) -> float | None:
        """Generated tokens per second of wave time in this invocation (copies of kept waves excluded);
        None until a wave has counted its tokens (a rate of 0 would read as a hung engine)."""
        return self.tokens / self.gen_s if self.gen_s > 0 and self.tokens > 0 else None

    def eta_s(self) -> float | None:
        """Seconds left; None without a wave of this machine or a speed table ("measuring")."""
        return self._eta()[0]

    def _eta(self) -> tuple[float | None, str]:
        """Seconds left and what they rest on: "" (this machine's finished waves), "speed table", or
        "first wave so far" (no wave finished yet, the one under way already longer than the table says)."""
        measured = any(self.walls.values())
        if not measured and self.table is None:
            return None, ""
        basis = "" if measured else "speed table"
        walls = {b: list(v) for b, v in self.walls.items()}
        running = self._running if self._wave_t0 is not None else None
        elapsed = self.clock() - self._wave_t0 if self._wave_t0 is not None else 0.0
        compiling = self.key_of.get(self.current) in self._cold
        if running is not None and self.remaining.get(running) and not compiling:
            expected = self._per_wave(running, walls)
            if expected is not None and elapsed > expected:
                walls.setdefault(running, []).append(elapsed)  # overdue: it takes at least this long
                basis = basis and "first wave so far"
        total = 0.0
        for batch, n in self.remaining.items():
            if not n:
                continue
            per = self._per_wave(batch, walls)
            if per is None:
                return None, ""
            total += n * per
            if batch == running:
                total -= min(elapsed, per)  # the wave under way: the part already spent
        # Engines side by side share the work: the waves and starts left, over how many run at once.
        return (total + self._starts_left_s()) / self.parallel, basis

    def _starts_left_s(self) -> float:
        """Seconds of engine starts still to come: one under way counts down with the clock, and one
        that compiles FA2's kernels adds their time to its start and then to its first waves."""
        now, per = self.clock(), self._start_seconds()
        under_way = list(self._starting.items())[: self.starts_left]
        left = (self.starts_left - len(under_way)) * per
        for key, t0 in under_way:
            jit = estimate.FA2_JIT_START_S if key in self._cold else 0.0
            left += max(per + jit - (now - t0), 0.0)
        for t_up in self._cold.values():
            if t_up is not None:
                left += max(estimate.FA2_JIT_WAVES_S - (now - t_up), 0.0)
        return left

    def _per_wave(self, batch: int, walls: Mapping[int, list[float]]) -> float | None:
        """One wave's seconds at ``batch``: its mean here, else the table's scaled by how much slower
        (or faster) than the table this machine ran the batches it has measured."""
        if walls.get(batch):
            return sum(walls[batch]) / len(walls[batch])
        table = self.table
        if table is None:
            r = self.rate()
            return batch * self.max_tokens / r if r else None
        seen = [(b, v) for b, v in walls.items() if v]
        predicted = sum(len(v) * estimate.wave_seconds(table, b, self.max_tokens) for b, v in seen)
        took = sum(sum(v) for _, v in seen)
        scale = took / predicted if predicted > 0 else 1.0
        return scale * estimate.wave_seconds(table, batch, self.max_tokens)

    def _start_seconds(self) -> float:
        if self._starts_seen:
            return sum(self._starts_seen) / len(self._starts_seen)
        return self.table.start_s if self.table is not None else 0.0

    def line(self) -> str:
        elapsed = int(self.clock() - self.t0)
        parts = [
            f"[{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}] "
            f"cells {self.cells_done}/{self.cells_total}, waves {self.waves_done}/{self.waves_total}",
        ]
        if self.status:
            parts.append(self.status)
        elif self.current:
            parts.append(self.current)
        if (r := self.rate()) is not None:
            parts.append(fmt_rate(r))
        parts.append(self._eta_text())
        return " · ".join(p for p in parts if p)

    def _eta_text(self) -> str:
        if self.waves_done >= self.waves_total:
            return ""
        eta, basis = self._eta()
        if eta is None:
            return "ETA measuring"
        return f"ETA {estimate.fmt_duration(eta)}" + (f" ({basis})" if basis else "")

    # --- drawing --------------------------------------------------------------------------------

    def _add_wall(self, w: Mapping[str, Any]) -> None:
        if (bw := estimate.wave_wall(w)) is not None:
            self.walls.setdefault(bw[0], []).append(bw[1])

    def _advance(self, cells: int = 0, waves: int = 0) -> None:
        if self._bar is None:
            return
        if cells:
            self._bar.advance(self._t_cells, cells)
        if waves:
            self._bar.advance(self._t_waves, waves)

    def _refresh(self, force: bool = False) -> None:
        if not self.show:
            return
        if self._bar is not None:
            self._bar.update(self._t_cells, info=self.status)
            r = self.rate()
            rate = fmt_rate(r) if r else ""
            info = " · ".join(p for p in (self.current, rate, self._eta_text()) if p)
            self._bar.update(self._t_waves, info=info)
            return
        now = self.clock()
        if force or (now - self._last_line >= HEARTBEAT_S and self.waves_done != self._waves_at_line):
            self.console.print(self.line(), highlight=False, soft_wrap=True, markup=False)
            self._last_line, self._waves_at_line = now, self.waves_done


def fmt_rate(tokens_per_s: float) -> str:
    """``1,234 tok/s``, ``64 tok/s``, ``3.2 tok/s``, ``0.31 tok/s``: a slow machine's rate is not 0."""
    r = tokens_per_s
    if r >= 10:
        return f"{r:,.0f} tok/s"
    return f"{r:.1f} tok/s" if r >= 1 else f"{r:.2g} tok/s"
