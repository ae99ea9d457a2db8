"""`trustlens dashboard [RUNS_DIR] [--port P]`: start the Streamlit dashboard on recorded runs.

The app's files live in the repository's top-level `app/` folder; an installed wheel carries them
under `<prefix>/share/trustlens/app` (pyproject `data-files`), found the way `trustlens.paths`
finds `data/`. The runs folder reaches the app through the environment variable RUNS_ENV.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# The environment variable the app reads its runs folder (or single run) from.
RUNS_ENV = "TRUSTLENS_RUNS"
# The app's entry script, inside the app folder.
ENTRY = "trustlens_app.py"

_SOURCE_APP = Path(__file__).resolve().parent.parent / "app"
_INSTALLED_APP = Path(sys.prefix) / "share" / "trustlens" / "app"


def app_dir() -> Path:
    """The folder of the Streamlit app: the checkout's app/, else the installed copy."""
    for candidate in (_SOURCE_APP, _INSTALLED_APP):
        if (candidate / ENTRY).is_file():
            return candidate
    raise FileNotFoundError(
        f"trustlens dashboard app not found (looked for {ENTRY} in {_SOURCE_APP} and {_INSTALLED_APP}); "
        "reinstall trustlens"
    )


def default_runs() -> Path:
    """What the dashboard opens with no argument: the shipped sample run."""
    from trustlens.paths import data_path

    return data_path("sample_run")


def streamlit_command(port: int, host: str, open_browser: bool) -> list[str]:
    """The `streamlit run` command line of the app (the runs folder goes in the environment)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(app_dir() / ENTRY),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "false" if open_browser else "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
        "--browser.serverAddress", host,
        "--global.developmentMode", "false",
    ]


def launch(path: str | Path | None = None, port: int = 8501, host: str = "127.0.0.1",
           open_browser: bool = False) -> int:
    """Run the dashboard on `path` (a folder of runs or one run; default the shipped sample run)
    until it is stopped; return the exit code of the Streamlit process.

    Bound to `host` (localhost by default: the dashboard shows model text and has no login).
    """
    path = default_runs() if path is None else Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"runs folder {str(path)!r} does not exist or is not a folder")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
    env = dict(os.environ, **{RUNS_ENV: str(path.resolve())})
    cmd = streamlit_command(port, host, open_browser)
    print(f"trustlens dashboard: serving {path} at http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


def _run(args: argparse.Namespace) -> int:
    return launch(args.runs_dir, port=args.port, host=args.host, open_browser=args.open)


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens dashboard`."""
    parser.add_argument("runs_dir", nargs="?", default=None, metavar="RUNS_DIR",
                        help="a folder of recorded runs, or one run (default: the shipped sample run)")
    parser.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--open", action="store_true", help="open a browser tab")
    parser.set_defaults(func=_run)
