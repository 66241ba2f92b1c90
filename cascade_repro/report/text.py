"""Formatting primitives shared by every report format: numbers, p-values, safe text, tables."""

from __future__ import annotations

import json
import math
import re
from typing import Any

MISSING = "—"

# Bidi overrides can make displayed text differ from its bytes ("Trojan Source"); drop them.
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROL_ALL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
# A terminal's escape sequences (CSI such as "\x1b[4m", OSC such as a hyperlink): collect_env's GPU
# topology is underlined by nvidia-smi even into a pipe. Dropping the ESC byte alone would leave "[4m".
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_XML_INVALID = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_BACKTICKS = re.compile("`+")
# Only what could open a tag, comment or entity; a bare "<1e-6" stays readable in the raw file.
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_MD_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")
# Every character GitHub's markdown gives a meaning inside a line: emphasis (* _), strikethrough
# (~: pair ids hold one, and "a~b, c~d" rendered struck through), code (`), links and images ([ ]),
# table cells (|), math ($), and the backslash that escapes them.
_MD_INLINE = re.compile(r"([\\`*_~\[\]|$])")


# What names the user's machine in a path: the installation's site-packages, a home folder.
_SITE_PACKAGES = re.compile(r"(?:[A-Za-z]:)?[/\\][^\s'\"]*?[/\\](?:site|dist)-packages(?=[/\\])")
_HOME = re.compile(
    r"(?<![\w.~-])(?:/home/[^/\s'\"]+|/Users/[^/\s'\"]+|/root|[A-Za-z]:\\Users\\[^\\\s'\"]+)(?=[/\\\s'\"]|$)"
)


def is_missing(v: Any) -> bool:
    """Return True for None, NaN and pandas NA."""
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    # pd.NA / NaT compare as neither equal nor unequal to themselves.
    try:
        return bool(v != v)
    except (TypeError, ValueError):
        return False


def plain(v: Any) -> Any:
    """Convert numpy/pandas scalars and containers to JSON-safe Python values (NaN → None)."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if hasattr(v, "tolist") and not isinstance(v, str):
        return plain(v.tolist())
    if is_missing(v):
        return None
    if isinstance(v, float) and math.isinf(v):
        return None
    return v


def as_int(v: Any) -> int | None:
    """Return v as int, or None when missing or not a whole number."""
    if is_missing(v):
        return None
    if isinstance(v, bool):
        return int(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def fmt_int(v: Any) -> str:
    """Format a count; fall back to str() for non-integers."""
    i = as_int(v)
    if i is not None:
        return str(i)
    return MISSING if is_missing(v) else str(v)


def fmt_float(v: Any, spec: str = ".3f") -> str:
    """Format a float with a format spec, or the missing marker."""
    if is_missing(v):
        return MISSING
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def fmt_p(p: Any) -> str:
    """Format a p-value with 3 significant digits; tiny values read `<1e-6`."""
    if is_missing(p):
        return MISSING
    p = float(p)
    return "<1e-6" if p < 1e-6 else f"{p:.3g}"


def fmt_sig_pair(a: Any, b: Any, digits: int = 3) -> tuple[str, str]:
    """Two values side by side in significant digits, more of them (up to 6) where ``digits`` would
    print two different values alike: "1.0001e-04 vs 1.0002e-04", never "0.0001 vs 0.0001"."""
    if is_missing(a) or is_missing(b):
        return (MISSING if is_missing(a) else f"{float(a):.{digits}g}",
                MISSING if is_missing(b) else f"{float(b):.{digits}g}")  # fmt: skip
    x, y = float(a), float(b)
    for d in range(digits, 7):
        sa, sb = f"{x:.{d}g}", f"{y:.{d}g}"
        if sa != sb or x == y:
            return sa, sb
    return sa, sb


def fmt_ratio(k: Any, n: Any) -> str:
    """Format `k/n`, or the missing marker when either side is missing."""
    if is_missing(k) or is_missing(n):
        return MISSING
    return f"{fmt_int(k)}/{fmt_int(n)}"


def fmt_ci(mean: Any, lo: Any, hi: Any) -> str:
    """Format a signed mean with its 95% interval."""
    if is_missing(mean):
        return MISSING
    s = fmt_float(mean, "+.3f")
    if not (is_missing(lo) or is_missing(hi)):
        s += f" [{fmt_float(lo, '+.3f')}, {fmt_float(hi, '+.3f')}]"
    return s


def text_of(v: Any) -> str:
    """Return str(v), or the missing marker."""
    return MISSING if is_missing(v) else str(v)


def clean(s: str) -> str:
    """Drop control and bidi characters but keep newlines and tabs."""
    return _CONTROL.sub("", s.replace("\r\n", "\n").replace("\r", "\n"))


def terminal_output(s: str) -> str:
    """A program's terminal output as text (collect_env's): its escape sequences dropped whole, then
    :func:`clean`. Only for output a tool wrote to a terminal; a name or a prompt keeps "[2J" visible
    where its ESC byte goes, so it still names the file or shows what was there."""
    return clean(_ANSI.sub("", s))


def one_line(s: str) -> str:
    """Collapse newlines and tabs into spaces and drop every other control character."""
    s = re.sub(r"[\r\n\t]+", " ", s)
    return _CONTROL_ALL.sub("", s)


def portable_paths(s: str) -> str:
    """Text with the user's machine taken out of its paths: an installation's site-packages reads
    `<site-packages>`, a home folder `~` (reports are pasted into public issues; the host name is
    not recorded for the same reason)."""
    return _HOME.sub("~", _SITE_PACKAGES.sub("<site-packages>", s))


def portable_json(v: Any) -> Any:
    """``portable_paths`` over every string of a JSON value (keys too)."""
    if isinstance(v, str):
        return portable_paths(v)
    if isinstance(v, dict):
        return {portable_json(k): portable_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [portable_json(x) for x in v]
    return v


def truncate(s: str, limit: int) -> str:
    """Cut s to at most limit characters, ending with an ellipsis when cut."""
    return s if len(s) <= limit else s[: limit - 1] + "…"


def md_cell(v: Any, limit: int = 160) -> str:
    """Make any value safe inside one GitHub markdown table cell."""
    s = truncate(one_line(text_of(v)), limit)
    # Truncate first so an escape sequence is never cut in half.
    return md_inline(s)


def md_inline(s: str) -> str:
    """Escape text for GitHub markdown inside a line: it renders as the very characters given."""
    return _MD_INLINE.sub(r"\\\1", md_escape_html(s))


def md_escape_html(s: str) -> str:
    """Neutralise HTML tags and entities in markdown text without touching plain `<` or `&`."""
    return _MD_TAG.sub("&lt;", _MD_ENTITY.sub("&amp;", s))


class Strong(str):
    """A table cell that renders emphasised."""

    __slots__ = ()


def md_table_rows(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """The lines of a GitHub markdown table: headers cut at 160 characters, cells at 300, every
    character that could break the table escaped; a :class:`Strong` cell in bold."""

    def cell(v: str) -> str:
        s = md_cell(v, limit=300)
        return f"**{s}**" if isinstance(v, Strong) else s

    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def json_text(v: Any) -> str:
    """A JSON report file: sorted keys, indented, NaN and infinities as null (``plain``)."""
    # allow_nan=False: plain() must already have turned every NaN into null.
    return json.dumps(plain(v), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def fence_for(text: str, minimum: int = 3) -> str:
    """Return a backtick fence longer than any backtick run inside text."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    return "`" * max(minimum, longest + 1)


def xml_safe(s: str) -> str:
    """Drop characters that XML 1.0 cannot carry, even escaped."""
    return _XML_INVALID.sub("", s)


def plural(n: int, word: str) -> str:
    """`n word` with an English plural when n != 1: `1 pair`, `2 pairs`, `2 mismatches`."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}{'es' if word.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def text_or_missing(v: Any) -> str:
    """Like text_of, but an empty string (the scorer's "none") also reads as the missing marker."""
    s = text_of(v)
    return MISSING if s == "" else s


def fmt_x(v: Any) -> str:
    """Format a ratio with about three significant digits: 1.35, 12.3, 134."""
    if is_missing(v):
        return MISSING
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(f):
        return str(f)
    a = abs(f)
    # Two decimals below 10 so ratios near 1 (1.04 vs 1.14) stay distinguishable.
    return f"{f:.2f}" if a < 10 else f"{f:.1f}" if a < 100 else f"{f:.0f}"


def fmt_x_ci(v: Any, lo: Any, hi: Any) -> str:
    """Format a ratio with its 95% interval, e.g. `1.35 [1.25, 1.46]`."""
    if is_missing(v):
        return MISSING
    s = fmt_x(v)
    if not (is_missing(lo) or is_missing(hi)):
        s += f" [{fmt_x(lo)}, {fmt_x(hi)}]"
    return s


def fmt_threshold_p(threshold: Any, p: Any) -> str:
    """Format the drift rule's bar and p-value, e.g. `> 1.14, p=0.0005`."""
    parts = []
    if not is_missing(threshold):
        parts.append(f"> {fmt_x(threshold)}")
    if not is_missing(p):
        parts.append(fmt_p_eq(p))
    return ", ".join(parts) or MISSING


def fmt_p_eq(p: Any) -> str:
    """`p=0.0714`, or `p<1e-6` for a tiny one (not `p=<1e-6`)."""
    s = fmt_p(p)
    return f"p{s}" if s.startswith("<") else f"p={s}"
