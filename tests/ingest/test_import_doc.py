"""docs/import.md's three commands on a verl run's TensorBoard dir: the first two run here (the
third opens the dashboard), and the output the page shows is what they print."""

import shlex
from pathlib import Path

from ingest.logs import verl_steps, write_verl_tensorboard

from trustlens.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "import.md"


def _blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced blocks opened with ```lang, in order."""
    found, body, inside = [], [], None
    for line in text.splitlines():
        if inside is None and line.startswith("```"):
            inside, body = line[3:].strip(), []
        elif inside is not None and line.strip() == "```":
            if inside == lang:
                found.append("\n".join(body) + "\n")
            inside = None
        elif inside is not None:
            body.append(line)
    return found


def test_the_doc_s_commands_give_the_alerts_it_shows(tmp_path, monkeypatch, capsys):
    text = DOC.read_text(encoding="utf-8")
    commands = _blocks(text, "bash")[0].strip().splitlines()
    assert len(commands) == 3 and commands[2].startswith("trustlens dashboard")
    monkeypatch.chdir(tmp_path)
    src = shlex.split(commands[0])[2]
    write_verl_tensorboard(tmp_path / src, verl_steps())  # verl's _TensorboardAdapter, its default folder
    for command in commands[:2]:
        argv = shlex.split(command)
        assert argv[0] == "trustlens"
        assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    shown = _blocks(text, "")[0].strip().splitlines()
    for line in shown:
        head = line.split("...")[0].rstrip(" ,.")
        assert head in out, head
    assert "above the published range" in out  # the doctor's level check
