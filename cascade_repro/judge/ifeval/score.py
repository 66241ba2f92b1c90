"""Instruction-following accuracy: per response, per cell, and cascade vs flat with a paired test.

Accuracy is prompt-level, as IFEval's headline numbers: a response passes when it follows every
instruction of its prompt. ``strict`` checks the response as it is; ``loose`` also accepts it when
one of IFEval's relaxed variants follows (first or last line removed, ``*`` removed; see
:func:`cascade_repro.judge.ifeval.verifiers.loose_variants`), instruction by instruction.

A prompt without instructions, or with an instruction id no verifier knows, or with kwargs no
verifier can use, is not scored (``strict``/``loose`` are ``None``) and leaves every mean; ``if_n``
says how many prompts were scored. The last two are never dropped silently: :func:`unscorable`
counts and names them from the prompt records alone (``prompts show`` and the report print its
:meth:`Unscorable.note`).

Cascade vs flat is compared prompt by prompt with McNemar's exact test on the discordant pairs
(prompts that pass strictly on one side only). This is informational: a verdict never depends on it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cascade_repro.judge.ifeval.verifiers import VERIFIERS, canonical_id, check, check_loose, kwargs_problem


def _instructions(record: Any) -> tuple[list[str], list[dict]]:
    """Read ``instruction_id_list`` and ``kwargs`` from a PromptRecord or a dict.

    A field that is not a list (a record that skipped the loaders' checks) counts as absent.
    """
    get = record.get if isinstance(record, Mapping) else (lambda k, d=None: getattr(record, k, d))
    ids = _as_list(get("instruction_id_list", None))
    kwargs = _as_list(get("kwargs", None))
    kwargs += [{}] * (len(ids) - len(kwargs))
    return ids, [k if isinstance(k, Mapping) else {} for k in kwargs]


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else []


def _known(instruction_id: Any) -> bool:
    """Whether a verifier takes this id (an id that is not text, from an unchecked record, is none)."""
    return isinstance(instruction_id, str) and canonical_id(instruction_id) in VERIFIERS


def score_response(record: Any, response: str) -> dict[str, Any]:
    """Score one response against its prompt record's instructions.

    Returns ``{"strict": bool|None, "loose": bool|None, "per_instruction": [{"id", "kwargs",
    "strict", "loose", "error"}...]}``; ``None`` when the prompt cannot be scored (no instructions,
    an unknown id, or kwargs a verifier cannot use; ``error`` says which).
    """
    ids, kwargs = _instructions(record)
    response = response if isinstance(response, str) else ""
    per: list[dict[str, Any]] = []
    for iid, kw in zip(ids, kwargs, strict=False):
        entry: dict[str, Any] = {"id": iid, "kwargs": dict(kw), "strict": None, "loose": None, "error": None}
        if not _known(iid):
            entry["error"] = f"no verifier for {iid!r}"
        else:
            try:
                entry["strict"] = check(iid, response, kw)
                entry["loose"] = entry["strict"] or check_loose(iid, response, kw)
            except ValueError as e:
                entry["error"] = str(e)
        per.append(entry)
    scorable = bool(per) and all(e["error"] is None for e in per)
    return {
        "strict": all(e["strict"] for e in per) if scorable else None,
        "loose": all(e["loose"] for e in per) if scorable else None,
        "per_instruction": per,
    }


@dataclass(frozen=True)
class Unscorable:
    """Prompts that carry instructions but can never be scored, and why (see :func:`unscorable`).

    ``unknown_ids`` maps each instruction id no verifier knows to the number of prompts carrying it;
    ``bad_kwargs`` maps ``"<id>: <what is wrong>"`` to the number of prompts whose kwargs for that id
    no verifier can use. A prompt counts once per entry, and once in ``n_unscored``.
    """

    n_prompts: int = 0
    n_unscored: int = 0
    unknown_ids: dict[str, int] = field(default_factory=dict)
    bad_kwargs: dict[str, int] = field(default_factory=dict)

    def note(self) -> str | None:
        """One line naming what left prompts unscored, or None when every prompt with instructions can be scored."""
        if not self.n_unscored:
            return None
        parts = []
        if self.unknown_ids:
            parts.append("no verifier for " + _counted(self.unknown_ids))
        if self.bad_kwargs:
            parts.append("kwargs no verifier can use: " + _counted(self.bad_kwargs))
        n = self.n_unscored
        return (
            f"IFEval: {n} of {self.n_prompts} {'prompt' if self.n_prompts == 1 else 'prompts'} "
            f"not scored ({'; '.join(parts)})."
        )


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} ({v} {'prompt' if v == 1 else 'prompts'})" for k, v in counts.items())


def unscorable(records: Iterable[Any]) -> Unscorable:
    """Count and name the prompts no response could get scored, from the prompt records alone.

    ``records`` are PromptRecords or dicts (a run's ``prompts.jsonl``). Prompts without instructions
    are not counted: they have nothing to score. Entries are ordered by prompts, most first, then by name.
    """
    unknown: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    n_prompts = n_unscored = 0
    for record in records:
        n_prompts += 1
        ids, kwargs = _instructions(record)
        seen_unknown: set[str] = set()
        seen_bad: set[str] = set()
        for iid, kw in zip(ids, kwargs, strict=False):
            if not _known(iid):
                seen_unknown.add(iid if isinstance(iid, str) else repr(iid))
            elif (problem := kwargs_problem(iid, dict(kw))) is not None:
                seen_bad.add(f"{iid}: {problem}")
        unknown.update(seen_unknown)
        bad.update(seen_bad)
        n_unscored += bool(seen_unknown or seen_bad)
    return Unscorable(n_prompts, n_unscored, _ordered(unknown), _ordered(bad))


def unknown_instruction_ids(records: Iterable[Any]) -> dict[str, int]:
    """Instruction ids no verifier knows → number of prompts carrying each (most first, then by id)."""
    return unscorable(records).unknown_ids


def _ordered(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def if_accuracy(samples: Mapping[int, str], prompts: Sequence[Any]) -> dict[str, Any]:
    """Prompt-level accuracy of one cell.

    ``samples`` maps prompt index → response text; ``prompts`` is the run's prompt list (index i is
    ``prompts[i]``). Returns ``{"if_strict", "if_loose", "if_n", "strict": {i: bool}, "loose": {i: bool}}``
    with NaN means when no prompt could be scored.
    """
    strict: dict[int, bool] = {}
    loose: dict[int, bool] = {}
    for i, text in samples.items():
        if not 0 <= i < len(prompts):
            continue
        s = score_response(prompts[i], text)
        if s["strict"] is not None:
            strict[i], loose[i] = s["strict"], s["loose"]
    return {
        "if_strict": _mean(strict.values()),
        "if_loose": _mean(loose.values()),
        "if_n": len(strict),
        "strict": strict,
        "loose": loose,
    }


def _mean(values) -> float:
    v = [float(x) for x in values]
    return sum(v) / len(v) if v else float("nan")


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (binomial test at 1/2).

    ``p = min(1, 2 * P(X <= min(b, c)))`` for ``X ~ Binomial(b + c, 1/2)``; 1.0 without discordant pairs.
    """
    n = b + c
    if n <= 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_if(test: Mapping[int, bool], ref: Mapping[int, bool]) -> dict[str, Any]:
    """Compare two cells' strict pass/fail on the prompts both scored.

    Returns ``if_n`` (prompts compared), ``if_test``/``if_ref`` (pass rates on them), ``if_delta``
    (test − ref), ``if_gained`` (test passes, ref fails), ``if_lost`` (test fails, ref passes) and
    ``p`` (McNemar exact, two-sided).
    """
    common = sorted(set(test) & set(ref))
    gained = sum(1 for i in common if test[i] and not ref[i])
    lost = sum(1 for i in common if ref[i] and not test[i])
    t = _mean(test[i] for i in common)
    r = _mean(ref[i] for i in common)
    return {
        "if_n": len(common),
        "if_test": t,
        "if_ref": r,
        "if_delta": t - r if common else float("nan"),
        "if_gained": gained,
        "if_lost": lost,
        "p": mcnemar_exact(gained, lost) if common else float("nan"),
    }
