"""The docs' rule lists and tables say what the code does: the rule lists of README.md and
docs/train.md and the rule tables of docs/rules.md hold every rule of the registry at its level
(and docs/rules.md its defaults), and docs/attach.md's table of verl's losses gives the rule
`verl_active_rule` picks for each row's settings. (--help's rule list: tests/test_cli_flags.py.)"""

import inspect
import re
from pathlib import Path

import pytest

from trustlens.integrations.verl.rules import verl_active_rule
from trustlens.rules import RULES

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = {"μ": "mu", "π_old": "old"}
# what the "decides" column of docs/rules.md's correction tables says of each level
DECIDES = {"token": "token", "response": "sequence", "batch": "batch"}
# the loss modes a row for "any" loss_mode is checked with
ANY_MODES = ("vanilla", "gspo")


def _read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _names(text: str) -> list[str]:
    """The `backticked` names in `text`."""
    return re.findall(r"`([^`]+)`", text)


def _by_level() -> dict[str, list[str]]:
    levels: dict[str, list[str]] = {}
    for name, rule in RULES.items():
        levels.setdefault(rule.level, []).append(name)
    return levels


def _rule_lists(text: str) -> dict[str, list[str]]:
    """{level: rules} of a list written "token rules (…): `a`, `b`; sequence rules: `c`; …"."""
    found = re.findall(r"\b(token|sequence|batch) rules\b[^:;.]*:(.*?)(?:;|\.(?:\s|$))", text, re.I | re.S)
    return {level.lower(): _names(names) for level, names in found}


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of `text`: each a list of rows (header first, the --- row left out),
    each row its cells, stripped, with `\\|` kept inside a cell."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(cell) <= set("-: ") for cell in cells):
                tables[-1].append(cells)
        previous = line
    return tables


@pytest.mark.parametrize("doc", ["README.md", "docs/train.md"])
def test_a_docs_rule_list_holds_every_rule_at_its_level(doc):
    lists = _rule_lists(_read(doc))
    assert {level: sorted(names) for level, names in lists.items()} == {
        level: sorted(names) for level, names in _by_level().items()
    }


def _rule_tables() -> list[list[list[str]]]:
    return [table for table in _tables(_read("docs/rules.md")) if table[0][0] == "rule"]


def test_docs_rules_tables_hold_every_rule_once():
    rows = [_names(row[0]) for table in _rule_tables() for row in table[1:]]
    assert all(len(names) == 1 for names in rows), rows
    assert sorted(names[0] for names in rows) == sorted(RULES)


def _thresholds(text: str) -> tuple[float | None, ...]:
    """(low, high) of a "low / high" cell: "0.2 / 0.28", "– / 0.28", or "–" for neither."""
    return tuple(None if t == "–" else float(t) for t in ("– / –" if text == "–" else text).split(" / "))


def test_docs_rules_tables_give_the_registry_defaults_and_levels():
    for table in _rule_tables():
        header = table[0]
        for row in table[1:]:
            cell = dict(zip(header, row, strict=True))
            rule = RULES[_names(cell["rule"])[0]]
            if "anchor" in cell:  # the token rules' table
                assert rule.level == "token"
                assert ANCHORS[cell["anchor"]] == rule.anchor, rule.name
                assert _thresholds(cell["low / high"]) == (rule.low, rule.high), rule.name
            else:
                assert DECIDES[cell["decides"].split(",")[0]] == rule.level, rule.name


def _settings(text: str) -> list[dict[str, object]]:
    """The `rollout_correction` settings a verl-table cell names: one dict per alternative
    ("`a=1` or `a=2`"; "`a=1`, `b=2`" is one alternative), [{}] for "–"."""
    if text == "–":
        return [{}]
    alternatives = []
    for alternative in text.split(" or "):
        pairs = (name.split("=", 1) for name in _names(alternative))
        alternatives.append({key: {"true": True, "false": False}.get(value, value) for key, value in pairs})
    return alternatives


def _verl_rows() -> list[tuple[str, dict[str, object], str | None]]:
    """(loss_mode, rollout_correction, active rule) of every case of docs/attach.md's verl table."""
    (table,) = [t for t in _tables(_read("docs/attach.md")) if t[0][0] == "verl `policy_loss.loss_mode`"]
    assert table[0][1:3] == ["`algorithm.rollout_correction`", "active rule"]
    cases = []
    for mode_cell, correction, rule_cell, _note in table[1:]:
        modes = list(ANY_MODES) if mode_cell == "any" else _names(mode_cell)
        rules = [None] if rule_cell == "none" else _names(rule_cell)
        if len(rules) == 1:
            rules *= len(modes)
        assert len(rules) == len(modes), (mode_cell, rule_cell)
        cases += [(m, s, r) for m, r in zip(modes, rules, strict=True) for s in _settings(correction)]
    return cases


def test_verl_table_gives_the_rule_the_hook_records():
    cases = _verl_rows()
    assert len(cases) >= 20
    for mode, correction, rule in cases:
        actor = {"policy_loss": {"loss_mode": mode}}
        got = verl_active_rule(actor, {"rollout_correction": correction} if correction else None)
        assert got.name == rule, (mode, correction, got)


def test_verl_table_names_every_loss_mode_and_rejection_level_the_hook_maps():
    cases = _verl_rows()
    source = inspect.getsource(inspect.getmodule(verl_active_rule))
    named = set(re.findall(r'mode == "(\w+)"', source))
    named |= {m for group in re.findall(r"mode in \(([^)]*)\)", source) for m in re.findall(r'"(\w+)"', group)}
    assert {"vanilla", "gspo", "geo_mean", "clip_cov", "kl_cov", "cispo", "gpg"} <= named
    assert named <= {mode for mode, _, _ in cases}
    rejections = set(re.findall(r'"(\w+)": "(rs_\w+)"', source))
    assert len(rejections) == 6
    assert rejections <= {(c["rollout_rs"], rule) for _, c, rule in cases if "rollout_rs" in c}


DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])


def _tables_with_lead(text: str) -> list[tuple[str, list[str]]]:
    """(the text before it, its header) of every table of `text`: the lines since the last
    heading or table."""
    found, lead, previous = [], [], ""
    for line in text.splitlines():
        if line.startswith("|") and not previous.startswith("|"):
            found.append((" ".join(" ".join(lead).split()), [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]))
        if line.startswith(("#", "|")):
            lead = []
        else:
            lead.append(line)
        previous = line
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_measured_alert_or_stop_table_names_the_command_that_made_it(doc):
    """A table of measured alerts or stops (a column of first critical alerts, alerted runs, or the
    step a run stopped after) is led by the command that measures it; a stop table also says that
    its steps vary across machines."""
    for lead, header in _tables_with_lead(doc.read_text(encoding="utf-8")):
        columns = " ".join(header).lower()
        if not re.search(r"first critical|alerted|stopped after", columns):
            continue
        assert re.search(r"`(python benchmarks/\w+\.py|trustlens claims)\b", lead), header
        if "stopped after" in columns:
            assert "vary across machines" in lead, header


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_determinism_is_claimed_for_one_machine_only(doc):
    """ "Deterministic for a seed" holds on one machine: each claim of it says so."""
    text = " ".join(doc.read_text(encoding="utf-8").split())
    for match in re.finditer(r"deterministic for", text, re.I):
        sentence = text[text.rfind(". ", 0, match.start()) + 1 : text.find(". ", match.end())]
        assert "machine" in sentence, sentence
