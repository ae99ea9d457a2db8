import html
import re
from html.parser import HTMLParser

import pytest

from trustlens.core.render import (
    MANY_RULES_COLOUR,
    MAX_RINGS,
    MISSING_BACKGROUND,
    NEGATIVE_RGB,
    POSITIVE_RGB,
    colored_tokens_html,
    csv_cell,
    diverging_colour,
    escape_markdown,
    legend_html,
    quantity_centre,
    quoted_token,
    rule_colours,
    token_text,
    visible_text,
    visible_token,
)

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(2)">',
    "[click](javascript:alert(3))",
    '" onmouseover="alert(4)',
    "' style='x",
    "&lt;b&gt;",
    "\u202egnp.exe",
]


class _Collect(HTMLParser):
    """Every tag, attribute and text run the browser's parser would see."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)

    def handle_data(self, data):
        self.text.append(data)


def _parse(markup: str) -> _Collect:
    p = _Collect()
    p.feed(markup)
    p.close()
    return p


def test_diverging_colour_ends_and_centre():
    assert diverging_colour(0.0, 0.0, 1.0) == "rgb(255,255,255)"
    assert diverging_colour(1.0, 0.0, 1.0) == "rgb({},{},{})".format(*POSITIVE_RGB)
    assert diverging_colour(-5.0, 0.0, 1.0) == "rgb({},{},{})".format(*NEGATIVE_RGB)
    # halfway: each channel halfway between white and the end colour
    r, g, b = (round(255 + (c - 255) * 0.5) for c in POSITIVE_RGB)
    assert diverging_colour(1.5, 1.0, 1.0) == f"rgb({r},{g},{b})"
    assert diverging_colour(None, 0.0, 1.0) == MISSING_BACKGROUND
    assert diverging_colour(3.0, 3.0, 0.0) == "rgb(255,255,255)"


def test_quantity_centre():
    assert quantity_centre("ratio") == 1.0
    assert quantity_centre("advantage") == 0.0


def test_visible_text_shows_invisible_characters():
    assert visible_text("a\nb\tc d") == "a↵b⇥c d"
    assert visible_text("\u202eabc\u200b") == "\\u202eabc\\u200b"
    assert visible_text(None) == "∅"


def test_escape_markdown_makes_every_special_inert():
    out = escape_markdown("[x](javascript:alert(1)) *b* <i>$a$ :red[z]")
    for ch in "[]()*<>$:":
        assert re.search(r"(?<!\\)" + re.escape(ch), out) is None, ch
    assert escape_markdown("plain words") == "plain words"


def test_colored_tokens_one_span_per_token_with_colours_and_rings():
    tokens = ["a", "b", "c"]
    markup = colored_tokens_html(
        tokens,
        [1.0, None, -2.0],
        quantity="advantage",
        blocked={"ppo": [True, False, True], "dppo_binary_tv": [False, False, True]},
        hover={"ratio": [1.5, 0.9, None]},
    )
    spans = re.findall(r'<span style="([^"]*)" title="([^"]*)">([^<]*)</span>', markup)
    assert [s[2] for s in spans] == tokens
    colours = rule_colours(["ppo", "dppo_binary_tv"])
    # scale = max |v| = 2 → token a is half-saturated blue, c fully red, b missing
    r, g, b = (round(255 + (c - 255) * 0.5) for c in POSITIVE_RGB)
    assert f"background:rgb({r},{g},{b})" in spans[0][0]
    assert f"background:{MISSING_BACKGROUND}" in spans[1][0]
    assert "background:rgb({},{},{})".format(*NEGATIVE_RGB) in spans[2][0]
    assert f"box-shadow:0 0 0 2px {colours['ppo']};" in spans[0][0]
    assert "box-shadow" not in spans[1][0]
    assert f"0 0 0 2px {colours['ppo']}, 0 0 0 4px {colours['dppo_binary_tv']}" in spans[2][0]
    titles = [html.unescape(s[1]) for s in spans]
    assert "advantage = 1" in titles[0] and "ratio = 1.5" in titles[0] and "blocked by: ppo" in titles[0]
    assert "advantage = n/a" in titles[1] and "blocked by: none" in titles[1]
    assert "blocked by: ppo, dppo_binary_tv" in titles[2]


def test_positions_with_no_row_are_marked_between_the_tokens():
    # a sampled run kept positions 2, 3 and 7 of a response: 0–1 and 4–6 have no row
    markup = colored_tokens_html(["a", "b", "c"], [1.0, 1.0, 1.0], positions=[2, 3, 7])
    spans = re.findall(r'<span style="[^"]*" title="([^"]*)">([^<]*)</span>', markup)
    assert [text for _, text in spans] == ["…", "a", "b", "…", "c"]
    titles = [html.unescape(title) for title, _ in spans]
    assert titles[0].startswith("position(s) 0–1: not recorded") and titles[3].startswith("position(s) 4–6:")
    assert titles[1].startswith("#2  a") and titles[4].startswith("#7  c")
    one = colored_tokens_html(["a", "b"], [1.0, 1.0], positions=[0, 2])  # one missing: "1", not "1–1"
    assert "position(s) 1: not recorded" in html.unescape(one)
    # every position recorded (a full run): no marker, as without positions
    assert colored_tokens_html(["a", "b"], [1.0, 1.0], positions=[0, 1]) == colored_tokens_html(["a", "b"], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"positions has 1 entries but tokens has 2"):
        colored_tokens_html(["a", "b"], [1.0, 1.0], positions=[0])


def test_colored_tokens_newline_breaks_line():
    markup = colored_tokens_html(["x\n", "y"], [0.0, 0.0])
    assert "↵</span><br>" in markup


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_only_ever_text(text):
    markup = colored_tokens_html(
        [text, "ok"], [0.5, 0.1], quantity=text, blocked={text: [True, False]}, hover={text: [text, 1.0]}
    )
    parsed = _parse(markup + legend_html([text], quantity=text))
    assert set(parsed.tags) <= {"div", "span", "br"}
    assert {name for name, _ in parsed.attrs} <= {"style", "title"}
    # the text round-trips exactly (up to the visible stand-ins) as text content and hover text
    assert visible_text(text) in "".join(parsed.text)
    assert any(visible_text(text) in value for name, value in parsed.attrs if name == "title")
    for name, value in parsed.attrs:
        if name == "style":
            assert "<" not in value and "javascript" not in value.lower()


def test_colored_tokens_rejects_length_mismatch():
    with pytest.raises(ValueError, match=r"values has 1 entries but tokens has 2"):
        colored_tokens_html(["a", "b"], [1.0])
    with pytest.raises(ValueError, match=r"blocked\['ppo'\] has 3 entries"):
        colored_tokens_html(["a", "b"], [1.0, 2.0], blocked={"ppo": [True, True, False]})


def test_legend_lists_each_rule():
    markup = legend_html(["ppo", "cispo"], quantity="ratio")
    assert "blocked by ppo" in markup and "blocked by cispo" in markup
    assert "ratio &lt; 1" in markup


def test_visible_token_shows_every_whitespace():
    assert visible_token(" the") == "␣the"
    assert visible_token("\t\n") == "⇥↵"
    assert visible_token("a b ") == "a␣b␣"
    assert visible_token(None) is None


def test_csv_cell_neutralises_formulas():
    for bad in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"):
        assert csv_cell(bad) == "'" + bad
    assert csv_cell("plain") == "plain" and csv_cell(None) is None


def test_rule_colours_fixed_and_distinct():
    from trustlens.rules import RULES

    every = rule_colours(list(RULES))
    assert len(set(every.values())) == len(RULES) >= 12  # one colour per built-in rule
    # the same rule has the same colour whatever else is shown, and in any order
    assert rule_colours(["dppo_binary_tv"]) == {"dppo_binary_tv": every["dppo_binary_tv"]}
    assert rule_colours(["grpo_tis", "ppo"])["ppo"] == every["ppo"]
    assert rule_colours(["ppo", "my_rule"])["my_rule"] == rule_colours(["my_rule"])["my_rule"]


def test_hover_text_shows_infinite_kl():
    markup = colored_tokens_html(["a"], [1.0], quantity="ratio", hover={"topk_kl": [float("inf")]})
    assert "topk_kl = ∞" in markup


def test_many_rules_on_one_token_get_one_ring_and_a_count():
    """Up to MAX_RINGS rules: a ring each; more: one dashed ring and the count, names on hover."""
    rules = ["ppo", "ppo_clip_higher", "minirl", "dppo_binary_tv", "cispo"]
    blocked = {r: [True, i < MAX_RINGS, False] for i, r in enumerate(rules)}
    markup = colored_tokens_html(["a", "b", "c"], [1.0, 1.0, 1.0], blocked=blocked)
    tokens = re.findall(r'<span style="([^"]*)" title="([^"]*)">(.*?)</span>(?=<span|</div>)', markup)
    (many, many_title, many_text), (two, _, two_text), (none, _, none_text) = tokens
    assert MAX_RINGS == 2 and f"outline:2px dashed {MANY_RULES_COLOUR}" in many and "box-shadow" not in many
    assert re.fullmatch(r'a<span style="[^"]*">5</span>', many_text)  # the count beside the text
    assert "blocked by: " + ", ".join(rules) in html.unescape(many_title)
    colours = rule_colours(rules)
    assert f"0 0 0 2px {colours['ppo']}, 0 0 0 4px {colours['ppo_clip_higher']}" in two and "outline" not in two
    assert two_text == "b" and none_text == "c" and "outline" not in none and "box-shadow" not in none
    # the legend names the dashed ring when more rules than MAX_RINGS are shown
    assert "blocked by more than 2 rules" in legend_html(rules, quantity="ratio")
    assert "more than" not in legend_html(rules[:2], quantity="ratio")


def test_a_token_is_spelt_one_way():
    """Spaces as ␣ and invisible characters escaped: in the inspector, a table cell, a figure."""
    from trustlens.plots import token_labels

    assert token_text(" the\n") == "␣the↵" and token_text(None) == "∅"
    assert visible_token(" the") == "␣the" and visible_token(None) is None
    assert quoted_token(" 59") == "‹␣59›"
    assert token_labels([" 59", " 59", "a b"]) == ["‹␣59›", "‹␣59› #2", "‹a␣b›"]
    markup = colored_tokens_html([" 59"], [1.0])
    assert ">␣59</span>" in markup and "#0  ␣59" in html.unescape(markup)


def test_csv_safe_guards_every_text_column_of_every_caller():
    import polars as pl

    from trustlens.core.render import csv_safe

    cells = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "plain", None]
    guarded = ["'" + c for c in cells[:6]] + ["plain", None]
    df = pl.DataFrame({"s": cells, "n": list(range(8))}).with_columns(
        pl.col("s").cast(pl.Categorical).alias("cat"),
        pl.col("s").cast(pl.Enum(sorted({c for c in cells if c is not None}))).alias("enum"),
    )
    out = csv_safe(df)
    for column in ("s", "cat", "enum"):  # the analyses' String, the dashboard's Categorical, an Enum
        assert out[column].to_list() == guarded, column
        assert out.schema[column] == pl.String
    assert out["n"].to_list() == list(range(8))  # numbers stay numbers
    assert csv_safe(pl.DataFrame({"n": [1]})).equals(pl.DataFrame({"n": [1]}))
    text = out.write_csv()
    assert "\n=" not in text and ",=" not in text
    # one guard for every caller: the dashboard's downloads and the seed tables use this one
    from trustlens.analysis import seeds

    assert seeds.csv_safe is csv_safe
