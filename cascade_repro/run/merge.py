"""Merge the run directories of ``--shard i/n`` runs into one run (``pipeline.merge`` scores and reports it).

Every shard of a matrix holds the same plan (``run.json``) and samples for its own engine keys
only (see shard.py). Merging checks that the shards belong together, copies each shard's samples
and worker logs for its engine keys into the output directory, writes a merged ``run.json`` and
``pipeline.merge`` runs ``pipeline.finalize`` on it, so the merged run is scored exactly like an unsharded one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.errors import UsageError, naming
from cascade_repro.plan.shard import Shard, owners
from cascade_repro.rundir import layout, manifest, safety
from cascade_repro.rundir.manifest import Invocation, Manifest, Timings

# Outputs of an earlier merge into the same directory, replaced by this one.
_OUTPUTS = (*layout.TABLES, *layout.REPORTS, layout.PROMPTS)


@dataclass
class _ShardDir:
    path: Path
    run: Manifest
    shard: Shard
    prompts_sha: str


def shard_run_dir(path: Path) -> tuple[Path, str | None]:
    """The run directory ``path`` names: itself when it holds run.json, else the one run directory in
    it (a shard's ``--results-dir`` as a CI artifact holds its run one level down), with a note
    saying which it took. Several runs there is a UsageError naming them."""
    path = Path(path)
    if not path.is_dir() or (path / layout.RUN_JSON).exists():
        return path, None
    runs = sorted(
        p for p in path.iterdir() if p.is_dir() and not p.is_symlink() and (p / layout.RUN_JSON).is_file()
    )
    if not runs:
        return path, None  # reading it says "missing run.json"
    if len(runs) > 1:
        names = ", ".join(p.name for p in runs)
        raise UsageError(
            f"{path} holds {len(runs)} runs ({names}), not one shard: give the shard's run directory"
        )
    return runs[0], f"{path}: merging the one run it holds, {runs[0].name}"


def _read_shard(path: Path) -> _ShardDir:
    if not path.is_dir():
        raise UsageError(f"{path}: not a directory")
    # Its prompts, samples and logs are copied into the merged run: a link there would copy the
    # file it points at (a shard is a downloaded artifact).
    safety.refuse_run_links(path)
    raw = manifest.read_run_json(path)
    run = Manifest.from_json(raw)
    text = run.shard
    if not text:
        raise UsageError(f"{path} is not a shard (it was run without --shard); merge combines --shard runs")
    try:
        shard = Shard.parse(text)
    except UsageError:
        raise UsageError(f"{path}: run.json has an invalid shard {text!r}") from None
    # Checked on the file's JSON: the manifest reads a plan that is not an object as an empty one.
    if not isinstance(raw.get("plan"), dict) or not run.has("spec_hash"):
        raise UsageError(f"{path}: run.json has no plan or spec_hash")
    prompts = layout.prompts_path(path)
    try:
        sha = hashlib.sha256(prompts.read_bytes()).hexdigest()
    except OSError:
        raise UsageError(f"{path}: missing {layout.PROMPTS}") from None
    if _locked(path):
        raise UsageError(
            f"{path}: shard {shard} is still running (its lock is held); merge when it has finished"
        )
    return _ShardDir(path, run, shard, sha)


def _locked(run_dir: Path) -> bool:
    """True when another process holds the run's lock; reads only (a shard dir may be read-only)."""
    import fcntl

    try:  # O_NONBLOCK: a FIFO planted as the lock file must not hang the merge
        fd = os.open(run_dir / layout.LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def check_shards(dirs: list[Path], allow_partial: bool = False) -> tuple[list[_ShardDir], list[str]]:
    """Read and cross-check shard directories; return them sorted by index, and warnings.

    Errors (UsageError, one line): not a shard, different matrix, different plan or prompts,
    different shard counts, the same shard twice, and a missing shard that holds cells unless
    ``allow_partial`` (then a warning: its cells show as pending). A missing shard without cells
    (more shards than engine keys) is a warning either way.
    """
    if not dirs:
        raise UsageError("merge: give at least one shard directory")
    shards = [_read_shard(Path(d)) for d in dirs]
    first = shards[0]
    for s in shards[1:]:
        if s.run.spec_hash != first.run.spec_hash or s.run.stored("spec") != first.run.stored("spec"):
            raise UsageError(
                f"{s.path} is a different matrix from {first.path} ({_spec_difference(s.run, first.run)})"
            )
        # As stored: a key one tool version writes and another leaves out makes another plan.
        if s.run.plan.to_json() != first.run.plan.to_json():
            raise UsageError(
                f"{s.path} and {first.path} have the same spec but different plans (another tool version?)"
            )
        if s.shard.count != first.shard.count:
            raise UsageError(
                f"{s.path} is shard {s.shard} but {first.path} is shard {first.shard}: use the same n"
            )
        if s.prompts_sha != first.prompts_sha:
            raise UsageError(f"{s.path} and {first.path} ran different prompts (prompts.jsonl differs)")
    seen: dict[int, Path] = {}
    for s in shards:
        if s.shard.index in seen:
            raise UsageError(f"duplicate shard {s.shard}: {seen[s.shard.index]} and {s.path}")
        seen[s.shard.index] = s.path
    shards.sort(key=lambda s: s.shard.index)

    warnings: list[str] = []
    n = first.shard.count
    engines = first.run.plan.engines
    owner = owners(engines, n)
    # Shards past the number of engine keys hold nothing (shard.owners): not walked one by one.
    width = min(n, max(len(engines), 1))
    missing = {
        i: sum(len(ep.cells) for k, ep in engines.items() if owner[k] == i)
        for i in range(1, width + 1)
        if i not in seen
    }
    # A shard that would hold no cells (more shards than engine keys) loses nothing when missing.
    lost = [f"{i}/{n}" for i, n_cells in missing.items() if n_cells]
    if lost and not allow_partial:
        n_lost = sum(missing.values())
        n_all = sum(len(e.cells) for e in engines.values())
        raise UsageError(
            f"shard{'s' if len(lost) > 1 else ''} {', '.join(lost)} {'are' if len(lost) > 1 else 'is'} missing "
            f"({n_lost} of the matrix's {n_all} cells): give every shard's directory (or --allow-partial: "
            "the missing cells then show as pending and their pairs as error)"
        )
    for i, n_cells in missing.items():
        warnings.append(f"shard {i}/{n} is missing: its {n_cells} cells show as pending")
    if (empty := n - width - sum(1 for i in seen if i > width)) == 1:
        i = next(i for i in range(width + 1, n + 1) if i not in seen)  # at most len(seen) + 1 steps
        warnings.append(
            f"shard {i}/{n} is missing: it holds no engine key (the matrix has {len(engines)}), so nothing is pending"
        )
    elif empty:
        warnings.append(
            f"{empty:,} shards after {width}/{n} are missing: they hold no engine key (the matrix has "
            f"{len(engines)}), so nothing is pending"
        )
    for what in ("tool_version", "thresholds", "model_name"):
        values = {json.dumps(s.run.stored(what), sort_keys=True, default=str) for s in shards}
        if len(values) > 1:
            warnings.append(f"shards differ in {what}: {', '.join(sorted(values))}")
    gpus = {_gpu_line(s.run) for s in shards}
    if len(gpus) > 1:
        warnings.append(f"shards ran on different hardware/software: {'; '.join(sorted(gpus))}")
    return shards, warnings


def _spec_difference(a: Manifest, b: Manifest) -> str:
    """What differs between two shards' matrices, in a few words: the fields of the specs that
    differ (``max_tokens 32 vs 64``), or the hashes where the specs agree (a hash edited by hand).
    An edited spec keeps its old hash, so two equal hashes would say nothing."""
    sa, sb = a.stored("spec"), b.stored("spec")
    sa, sb = (x if isinstance(x, dict) else {} for x in (sa, sb))
    fields = sorted(k for k in {*sa, *sb} if sa.get(k, _ABSENT) != sb.get(k, _ABSENT))
    if not fields:
        return f"spec hash {a.spec_hash} vs {b.spec_hash}"

    def shown(spec: dict[str, Any], k: str) -> str:
        v = json.dumps(spec[k], sort_keys=True, default=str) if k in spec else "absent"
        return v if len(v) <= 40 else v[:37] + "..."

    parts = [f"{k} {shown(sa, k)} vs {shown(sb, k)}" for k in fields[:3]]
    more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
    return "spec differs: " + "; ".join(parts) + more


_ABSENT = object()


def _gpu_line(run: Manifest) -> str:
    """A short identity of a shard's environment (envinfo.capture keys): GPU and the versions that matter."""
    env = run.stack_env
    keys = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "transformers", "vllm", "vllm_flash_attn")
    return ", ".join(f"{k}={env[k]}" for k in keys if env.get(k)) or "unknown"


def _check_out(out_dir: Path, shards: list[_ShardDir]) -> None:
    """Refuse an output directory that is a shard or not a directory (before its lock is taken)."""
    out = out_dir.resolve()
    for s in shards:
        if s.path.resolve() == out:
            raise UsageError(f"the output directory {out_dir} is one of the shards: choose a new directory")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} exists and is not a directory")


def _prepare_out(out_dir: Path, shards: list[_ShardDir]) -> None:
    """Refuse an output directory that holds something else; clear an earlier merge. Called under
    the output's lock: another merge or a `report` writing there would lose its files to the clear."""
    merging = out_dir / layout.MERGING
    if merging.is_file():  # a merge cut short (killed mid-copy): its files are redone
        if merging.read_text(encoding="utf-8", errors="replace").strip() != shards[0].run.spec_hash:
            raise UsageError(f"{out_dir} holds a cut merge of another matrix: choose a new directory")
        _clear(out_dir)
    elif (out_dir / layout.RUN_JSON).exists():
        old = manifest.read_manifest(out_dir)
        if not old.has("shards") or old.stored("spec_hash") != shards[0].run.spec_hash:
            raise UsageError(
                f"{out_dir} holds another run, not a merge of this matrix: choose a new directory"
            )
        _clear(out_dir)
    elif any(p.name != layout.LOCK for p in out_dir.iterdir()):
        raise UsageError(f"{out_dir} exists and is not empty: choose a new directory")


def _clear(out_dir: Path) -> None:
    """Remove what an earlier (or cut) merge into ``out_dir`` wrote; links were refused before."""
    safety.remove_tree(out_dir, layout.SAMPLES)
    safety.remove_tree(out_dir, layout.REFERENCE)
    for p in out_dir.glob("worker-*.log"):
        p.unlink()
    for name in _OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)


def _copy(src: Path, dst: Path, link: bool) -> None:
    """Copy (or hard-link) a shard's file; a link is never followed (the shard was checked too)."""
    if src.is_symlink():
        raise UsageError(f"{src} is a symbolic link: refusing to copy it into the merged run")
    if link:
        try:
            os.link(src, dst, follow_symlinks=False)
            return
        except OSError:
            pass  # another filesystem: copy
    with naming(dst):  # a full disk names the copy it refused, not the shard's file
        shutil.copy2(src, dst, follow_symlinks=False)


def _unsharded_command(command: Any) -> str:
    """The shard's command line without ``--shard``: the command that runs the whole matrix."""
    text = shlex.join(str(c) for c in command) if isinstance(command, list) else str(command or "")
    return re.sub(r"\s--shard(?:=|\s+)\S+", "", text)


def _with_shard(inv: Invocation, shard: str) -> Invocation:
    """A copy of ``inv`` marked with its shard (the dict's ``{**inv, "shard": shard}``)."""
    out = dataclasses.replace(inv)
    out.update(shard=shard)
    return out


@dataclass
class Gathered:
    """Shards read and checked, before the output directory is locked: what ``assemble`` merges."""

    out_dir: Path
    shards: list[_ShardDir]
    warnings: list[str]
    notes: list[str]  # which run a results dir given as a shard held


def gather(out_dir: Path, shard_dirs: list[Path], allow_partial: bool = False) -> Gathered:
    """Read and cross-check the shards (``check_shards``) and refuse an output that is one of them."""
    out_dir = userpath.resolve(out_dir, "OUT_DIR")
    found = [shard_run_dir(userpath.resolve(d, "SHARD_DIR")) for d in shard_dirs]
    notes = [note for _, note in found if note]
    shards, warnings = check_shards([d for d, _ in found], allow_partial=allow_partial)
    _check_out(out_dir, shards)
    return Gathered(out_dir, shards, warnings, notes)


def assemble(found: Gathered, fail_on: str, link: bool = False, command: str = "") -> list[str]:
    """Copy the shards' files into the output directory and write its merged run.json, marked as a
    merge under way (``layout.MERGING``, removed once it is scored); return the warnings. Called
    holding the output's lock (``pipeline.merge`` scores under the same lock)."""
    out_dir, shards, warnings = found.out_dir, found.shards, list(found.warnings)
    first = shards[0]
    engines_plan = first.run.plan.engines
    owner = owners(engines_plan, first.shard.count)
    _prepare_out(out_dir, shards)
    layout.write_text_atomic(out_dir / layout.MERGING, first.run.spec_hash + "\n")
    (out_dir / layout.SAMPLES).mkdir(parents=True, exist_ok=True)
    _copy(layout.prompts_path(first.path), layout.prompts_path(out_dir), link=False)
    engines: dict[str, Any] = {}
    listed = []
    for s in shards:
        keys = [k for k in engines_plan if owner[k] == s.shard.index]
        for key in keys:
            src = layout.samples_path(s.path, key)
            if src.is_file():
                _copy(src, layout.samples_path(out_dir, key), link)
            else:
                warnings.append(
                    f"shard {s.shard} ({s.path}) has no samples for engine {key}: its cells show as pending"
                )
            log = layout.worker_log(s.path, key)
            if log.is_file():
                _copy(log, layout.worker_log(out_dir, key), link)
            ref = layout.reference_path(s.path, key)  # the shard's reference pass, if it ran
            if ref.is_file() and not ref.is_symlink():
                layout.reference_path(out_dir, key).parent.mkdir(parents=True, exist_ok=True)
                _copy(ref, layout.reference_path(out_dir, key), link)
            if isinstance(s.run.engines, dict) and key in s.run.engines:
                engines[key] = s.run.engines[key]
        stray = sorted(
            p.stem for p in (s.path / layout.SAMPLES).glob("*.jsonl") if p.stem in engines_plan and p.stem not in keys
        )  # fmt: skip
        if stray:
            warnings.append(
                f"{s.path}: ignored samples of engine(s) outside shard {s.shard}: {', '.join(stray)}"
            )
        # The shard's own fields as its run.json holds them (null where it has none).
        stored = s.run.stored
        listed.append(
            {
                "shard": str(s.shard),
                "source": str(s.path),
                "run_id": stored("run_id"),
                "created_at": stored("created_at"),
                "command": stored("command"),
                "tool_version": stored("tool_version"),
                "engine_keys": keys,
                "env": stored("env"),
                "timings": stored("timings"),
            }
        )
    run = copy.deepcopy(first.run)
    run.drop("shard")
    totals = [t for s in shards if isinstance(t := s.run.timings.total_s, int | float)]
    # ``update``, as the dict's: each field written, even one that equals its default.
    run.update(
        run_id=out_dir.resolve().name,
        created_at=min((str(s.run.created_at or "") for s in shards), default=""),
        merged_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=_unsharded_command(first.run.command),
        merge_command=command,
        shards=listed,
        shards_expected=first.shard.count,
        # The shards that hold engine keys (shard.owners: the others hold nothing to miss).
        shards_missing=[
            f"{i}/{first.shard.count}"
            for i in sorted(set(owner.values()))
            if i not in {s.shard.index for s in shards}
        ],  # fmt: skip
        engines=engines,
        fail_on=fail_on,
        # Wall time of the parallel run (the slowest shard), and the machine time it took in all.
        timings=Timings(total_s=max(totals, default=0.0), shards_sum_s=round(sum(totals), 2)),
        merge_warnings=warnings,
        # Every shard's invocations, then the merge itself (which has no env of its own).
        invocations=[
            *(_with_shard(i, str(s.shard)) for s in shards for i in (s.run.invocations or [])),
            Invocation.of(started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=command, kind="merge"),
        ],
    )
    manifest.write_manifest(out_dir, run)
    return warnings
