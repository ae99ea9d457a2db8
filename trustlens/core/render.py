"""Safe HTML and Markdown for untrusted model text: a response drawn as coloured tokens.

Token and prompt text comes from models and users, so everything here escapes it: every piece of
text goes through `html.escape(quote=True)` before it reaches markup (element content and
attribute values alike), no `<script>`, event handler or URL is ever produced, and invisible or
direction-changing characters are shown as visible escapes so that text cannot disguise itself.

`colored_tokens_html` draws one response the way CircuitsVis' `colored_tokens` does: each token a
small inline box whose background follows a diverging colour scale of a chosen quantity (blue
above the centre, red below, white at the centre, saturation ∝ |value − centre| / the largest such
distance in the response), blocked tokens outlined in one colour per rule, and every value in the
token's hover text (the native `title` tooltip: no JavaScript needed).
"""

from __future__ import annotations

import html
import math
import string
import unicodedata
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

# Colours of the diverging scale: value above the centre → POSITIVE, below → NEGATIVE.
POSITIVE_RGB = (33, 102, 172)
NEGATIVE_RGB = (178, 24, 43)
MISSING_BACKGROUND = "#e0e0e0"
# One fixed colour per built-in rule, the same on every page and figure (Okabe-Ito first, then
# other well-separated hues). A rule outside the registry (a custom rule) takes one of
# EXTRA_COLOURS chosen by a hash of its name, so it too keeps its colour everywhere.
RULE_COLOURS: dict[str, str] = {
    "ppo": "#E69F00",
    "ppo_clip_higher": "#8C564B",
    "minirl": "#CC79A7",
    "dppo_binary_tv": "#009E73",
    "dppo_binary_kl": "#0072B2",
    "dppo_topk_tv": "#56B4E9",
    "dppo_topk_kl": "#9467BD",
    "dppo_binary_tv_recompute": "#BCBD22",
    "dppo_binary_kl_recompute": "#17BECF",
    "cispo": "#D55E00",
    "pg_is": "#7F7F7F",
    "grpo_tis": "#000000",
    "icepop": "#66A61E",
    "dual_clip": "#FDB462",
    "gspo": "#E7298A",
    "gmpo": "#7570B3",
    "rs_token": "#A6761D",
    "rs_seq": "#1B9E77",
    "rs_geo": "#B2DF8A",
    "grpo_seq_tis": "#393B79",
    "clip_cov": "#FB8072",
    "kl_cov": "#80B1D3",
}
EXTRA_COLOURS = ("#F0E442", "#1F3A93", "#E377C2", "#2CA02C", "#A50026", "#FF7F0E", "#6A3D9A", "#B15928")
# Colours of things compared that are not rules (runs), in the order given.
SERIES_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#8C564B")
OUTLINE_PX = 2
# A token blocked by more than MAX_RINGS rules gets one dashed ring in MANY_RULES_COLOUR and the
# count of its rules beside its text (their names in its hover text): a dozen stacked rings
# would be unreadable and push the lines apart.
MAX_RINGS = 2
MANY_RULES_COLOUR = "#444"
_MANY_RULES_RING = f"outline:{OUTLINE_PX}px dashed {MANY_RULES_COLOUR};outline-offset:1px;"
_COUNT_STYLE = (
    f"display:inline-block;margin-left:3px;padding:0 3px;border-radius:6px;font-size:0.75em;line-height:1.3;"
    f"background:{MANY_RULES_COLOUR};color:#fff;vertical-align:top"
)
# a legend entry: one unbroken line, its ring (OUTLINE_PX, dashed: 1 px further out) clear of its neighbours
_CHIP_STYLE = (
    f"display:inline-block;white-space:nowrap;line-height:1.4;padding:1px 4px;margin:{OUTLINE_PX + 2}px "
    f"{OUTLINE_PX + 1}px;border-radius:3px;"
)
# the marker of positions with no token row, between two drawn tokens
_GAP_STYLE = "display:inline-block;padding:1px 2px;margin:1px 2px;color:#888;font-family:monospace"

# Quantities whose natural centre is not 0 (the ratio is 1 where π = μ).
_CENTRES = {"ratio": 1.0}

# Visible stand-ins for whitespace that would otherwise vanish or break the layout.
_VISIBLE = {"\n": "↵", "\r": "␍", "\t": "⇥"}
# ... and for a token in a table cell, where a space at either end is invisible too.
_VISIBLE_TOKEN = {**_VISIBLE, " ": "␣"}
# A CSV cell starting with one of these is read as a formula by spreadsheets.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_MARKDOWN_SPECIAL = frozenset(string.punctuation)


def quantity_centre(quantity: str) -> float:
    """The value drawn white for `quantity`: 1 for the ratio, 0 for everything else."""
    return _CENTRES.get(quantity, 0.0)


def visible_text(text: str | None) -> str:
    """`text` with control, format and bidirectional characters replaced by visible escapes
    (e.g. U+202E → "\\u202e"), newlines by "↵", carriage returns by "␍" and tabs by "⇥"; None
    becomes "∅". Not escaped for HTML: pass the result through `html.escape`."""
    return _visible(text, _VISIBLE)


def token_text(text: str | None) -> str:
    """A token's text as every page, figure and report spells it: as `visible_text`, and every
    space shown as "␣" (a leading or trailing space — most BPE tokens have one — is otherwise
    invisible); None becomes "∅". Where nothing else marks where a token starts and ends (prose,
    an axis label), `quoted_token` adds the marks."""
    return _visible(text, _VISIBLE_TOKEN)


def quoted_token(text: str | None) -> str:
    """`token_text` between ‹ and ›, for a token named in prose or on an axis."""
    return f"‹{token_text(text)}›"


def visible_token(text: str | None) -> str | None:
    """A token's text for a table cell (`token_text`); None stays None (a missing value)."""
    return None if text is None else token_text(text)


def strict_json(value: Any) -> Any:
    """`value` (dicts, lists, tuples, scalars) with non-finite floats as strings ("inf", "nan"),
    so that `json.dumps(..., allow_nan=False)` writes strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def csv_safe(table: pl.DataFrame) -> pl.DataFrame:
    """`table` with every text cell a spreadsheet would run as a formula (`csv_cell`: starting
    with =, +, -, @, tab or CR) prefixed with an apostrophe, so that it opens as text: the one
    guard of every CSV trustlens writes (the dashboard's downloads, `train compare`'s tables).
    Text columns are String, Categorical and Enum (written as String); other columns and nulls
    are unchanged. Token text, run and rule names come from runs and are untrusted."""
    import polars as pl

    fixes = []
    for name, dtype in table.schema.items():
        if dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)):
            text = pl.col(name).cast(pl.String)
            risky = pl.any_horizontal(text.str.starts_with(start) for start in FORMULA_START)
            fixes.append(pl.when(risky).then(pl.lit("'") + text).otherwise(text).alias(name))
    return table.with_columns(fixes) if fixes else table


def csv_cell(text: str | None) -> str | None:
    """`text` safe for a CSV cell opened in a spreadsheet: a cell starting with =, +, -, @, tab
    or carriage return is prefixed with an apostrophe so it is shown as text, not run as a
    formula (OWASP's CSV-injection advice). Other text is unchanged."""
    if text is not None and text.startswith(FORMULA_START):
        return "'" + text
    return text


def _visible(text: str | None, table: Mapping[str, str]) -> str:
    if text is None:
        return "∅"
    out = []
    for ch in text:
        if ch in table:
            out.append(table[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs", "Zl", "Zp"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def escape_markdown(text: str | None) -> str:
    """`text` made inert for `st.markdown`: every ASCII punctuation character backslash-escaped
    (links, emphasis, HTML tags, `$` maths, `:emoji:` and `:color[...]` directives all need one),
    control characters shown as escapes, and line breaks shown as "↵" so the text stays one line."""
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in visible_text(text))


def _finite(v: object) -> float | None:
    """`v` as a float when it is a finite number, else None (null, NaN, inf)."""
    if v is None:
        return None
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def diverging_colour(value: float | None, centre: float, scale: float) -> str:
    """The CSS background of `value`: white at `centre`, full POSITIVE/NEGATIVE colour at
    |value − centre| ≥ `scale`, linear in between; MISSING_BACKGROUND for None."""
    if value is None:
        return MISSING_BACKGROUND
    t = 0.0 if scale <= 0 else min(abs(value - centre) / scale, 1.0)
    target = POSITIVE_RGB if value >= centre else NEGATIVE_RGB
    r, g, b = (round(255 + (c - 255) * t) for c in target)
    return f"rgb({r},{g},{b})"


def _text_colour(value: float | None, centre: float, scale: float) -> str:
    """Black on light backgrounds, white on saturated ones."""
    if value is None or scale <= 0:
        return "#000"
    return "#fff" if abs(value - centre) / scale > 0.6 else "#000"


def _format_value(v: object) -> str:
    """A hover-text rendering of one value: 4 significant digits for floats, "n/a" for null."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "−∞"  # e.g. a KL where π gave the token probability 0
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def rule_colour(rule: str) -> str:
    """The fixed colour of `rule` (RULE_COLOURS; a custom rule's by a hash of its name)."""
    if rule in RULE_COLOURS:
        return RULE_COLOURS[rule]
    return EXTRA_COLOURS[zlib.crc32(rule.encode()) % len(EXTRA_COLOURS)]


def rule_colours(rules: Sequence[str]) -> dict[str, str]:
    """The fixed colour of each rule (`rule_colour`): the same rule has the same colour on every
    page and figure, whatever other rules are shown."""
    return {rule: rule_colour(rule) for rule in rules}


def series_colours(names: Sequence[str]) -> dict[str, str]:
    """Colours of compared series that are not rules (runs), in the order given."""
    return {name: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, name in enumerate(names)}


def colored_tokens_html(
    tokens: Sequence[str | None],
    values: Sequence[object],
    *,
    quantity: str = "value",
    centre: float | None = None,
    scale: float | None = None,
    blocked: Mapping[str, Sequence[bool | None]] | None = None,
    hover: Mapping[str, Sequence[object]] | None = None,
    positions: Sequence[int] | None = None,
) -> str:
    """One response as HTML: a <div> of inline <span>s, one per token.

    tokens   decoded token texts (untrusted; escaped here)
    values   the colouring quantity per token (None/NaN = missing, drawn grey)
    quantity its name, shown in the hover text
    centre   the value drawn white (default `quantity_centre(quantity)`)
    scale    |value − centre| drawn fully saturated (default: the largest in `values`)
    blocked  rule → per-token "blocked" flags: each blocked token gets a ring in the rule's colour
             (rings stack when up to MAX_RINGS rules block it; more get one dashed ring and
             their count, MANY_RULES_COLOUR)
    hover    extra column → per-token values listed in the hover text
    positions each token's position in the response (the `pos` column), ascending: shown in the
             hover text, and a run of positions with no row between two tokens (a sampled run
             keeps only some tokens) is drawn as one grey "…" saying which are missing; default
             0, 1, 2, …
    """
    n = len(tokens)
    blocked = dict(blocked or {})
    hover = dict(hover or {})
    for name, seq in (
        ("values", values),
        *((f"blocked[{k!r}]", v) for k, v in blocked.items()),
        *((f"hover[{k!r}]", v) for k, v in hover.items()),
        *((("positions", positions),) if positions is not None else ()),
    ):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but tokens has {n}")
    centre = quantity_centre(quantity) if centre is None else float(centre)
    nums = [_finite(v) for v in values]
    if scale is None:
        scale = max((abs(v - centre) for v in nums if v is not None), default=0.0)
    colours = rule_colours(list(blocked))

    at = list(range(n)) if positions is None else [int(p) for p in positions]
    spans = []
    for i, (tok, v) in enumerate(zip(tokens, nums, strict=True)):
        expected = at[i - 1] + 1 if i else 0
        if at[i] > expected:
            missing = f"{expected}" if at[i] == expected + 1 else f"{expected}–{at[i] - 1}"
            title = html.escape(f"position(s) {missing}: not recorded (a sampled run keeps only some tokens)")
            spans.append(f'<span style="{_GAP_STYLE}" title="{title}">…</span>')
        blockers = [r for r, flags in blocked.items() if flags[i]]
        many = len(blockers) > MAX_RINGS
        rings = [] if many else [colours[r] for r in blockers]
        ring = OUTLINE_PX * max(len(rings), 2 if many else 0)  # px beyond the text's box
        shadow = ", ".join(f"0 0 0 {OUTLINE_PX * (k + 1)}px {c}" for k, c in enumerate(rings))
        style = (
            f"display:inline-block;white-space:pre;padding:1px 2px;"
            f"margin:{ring + 1}px {max(ring + 1, 2)}px;"  # its rings clear of its neighbours
            f"border-radius:3px;font-family:monospace;line-height:1.4;"
            f"background:{diverging_colour(v, centre, scale)};color:{_text_colour(v, centre, scale)};"
            + (f"box-shadow:{shadow};" if shadow else "")
            + (_MANY_RULES_RING if many else "")
        )
        lines = [f"#{at[i]}  {token_text(tok)}", f"{quantity} = {_format_value(v)}"]
        lines += [f"{k} = {_format_value(seq[i])}" for k, seq in hover.items()]
        lines.append("blocked by: " + (", ".join(blockers) if blockers else "none"))
        title = html.escape("\n".join(lines), quote=True)
        text = html.escape(token_text(tok), quote=True)
        count = f'<span style="{_COUNT_STYLE}">{len(blockers)}</span>' if many else ""
        spans.append(f'<span style="{style}" title="{title}">{text}{count}</span>')
        if tok is not None and "\n" in tok:
            spans.append("<br>")
    return f'<div style="line-height:2.2;word-wrap:break-word">{"".join(spans)}</div>'


def legend_html(rules: Sequence[str], *, quantity: str, centre: float | None = None) -> str:
    """The key to `colored_tokens_html`: the colour scale's ends, each rule's outline, and the
    dashed ring with a count of a token that more than MAX_RINGS of `rules` block."""
    centre = quantity_centre(quantity) if centre is None else float(centre)
    q = html.escape(visible_text(quantity), quote=True)
    pos = "rgb({},{},{})".format(*POSITIVE_RGB)
    neg = "rgb({},{},{})".format(*NEGATIVE_RGB)
    items = [
        f'<span style="{_CHIP_STYLE}background:{neg};color:#fff">{q} &lt; {centre:g}</span>',
        f'<span style="{_CHIP_STYLE}background:{pos};color:#fff">{q} &gt; {centre:g}</span>',
        f'<span style="{_CHIP_STYLE}background:{MISSING_BACKGROUND}">missing</span>',
    ]
    for rule, colour in rule_colours(rules).items():
        name = html.escape(visible_text(rule), quote=True)
        items.append(f'<span style="{_CHIP_STYLE}box-shadow:0 0 0 {OUTLINE_PX}px {colour}">blocked by {name}</span>')
    if len(rules) > MAX_RINGS:
        items.append(
            f'<span style="{_CHIP_STYLE}{_MANY_RULES_RING}">blocked by more than '
            f'{MAX_RINGS} rules<span style="{_COUNT_STYLE}">n</span></span>'
        )
    return f'<div style="margin:4px 0 8px 0">{" ".join(items)}</div>'
