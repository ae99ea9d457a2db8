"""`trustlens dashboard [RUNS_DIR] [--port P]`: start the Streamlit dashboard on recorded runs.

The app's files live in the repository's top-level `app/` folder; an installed wheel carries them
under `<prefix>/share/trustlens/app` (pyproject `data-files`), found the way `trustlens.paths`
finds `data/`. The runs folder reaches the app through the environment variable RUNS_ENV.

The server runs as `python -m trustlens.dashboard run APP …`: this module imports the libraries
every page uses (`PRELOAD`) in the main thread and then hands over to Streamlit's command line.
Imported lazily instead, the first page loads of several browser tabs at once would import
pandas in several script threads at once and some would see a partially initialised module.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from trustlens.core.argument_checks import check_port, port_arg, text_arg

# The environment variable the app reads its runs folder (or single run) from.
RUNS_ENV = "TRUSTLENS_RUNS"
# The app's entry script, inside the app folder.
ENTRY = "trustlens_app.py"
# Imported before the server starts (see the module docstring).
PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.pandas_compat",
    "polars",
    "plotly.graph_objects",
    "plotly.subplots",
    "plotly.io",
    "trustlens.analysis",
    "trustlens.plots",
    "trustlens.core.render",
    "trustlens.run",
)

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
        sys.executable,
        "-m",
        "trustlens.dashboard",
        "run",
        str(app_dir() / ENTRY),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "false" if open_browser else "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--browser.serverAddress",
        host,
        "--global.developmentMode",
        "false",
    ]


def start(
    path: str | Path | None = None,
    port: int = 8501,
    host: str = "127.0.0.1",
    open_browser: bool = False,
    **popen: Any,
) -> subprocess.Popen:
    """Start the dashboard on `path` (a folder of runs or one run, local or an object-store URL;
    default the shipped sample run) in a background process and return it; `popen` goes to
    subprocess.Popen (e.g. stdout). A missing path is a FileNotFoundError, checked before the port;
    a port in use is an OSError naming a free one.

    Bound to `host` (localhost by default: the dashboard shows model text and has no login).
    """
    if path is None:
        path = default_runs()
        if not path.is_dir():
            raise FileNotFoundError(
                f"the shipped sample run is missing ({path}); pass a RUNS_DIR, or record a run with `trustlens demo`"
            )
    location = runs_location(path)  # checked in the order a user reads them: the path, then the port
    check_port("port", port)
    check_port_free(port, host)
    env = dict(os.environ, **{RUNS_ENV: location})
    return subprocess.Popen(streamlit_command(port, host, open_browser), env=env, **popen)


def _bindable(family: socket.AddressFamily, host: str, port: int) -> bool:
    """Whether a server could listen on (host, port) now (with SO_REUSEADDR, as Streamlit's server
    binds: a port whose last connection is still closing counts as free)."""
    try:
        with socket.create_server((host, port), family=family):
            return True
    except OSError:
        return False


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """OSError naming `port` and a free port (the next one up that is) when something already
    listens on `port` at `host`, or naming `host` when it does not resolve; checked before any
    work, so that nothing is trained or loaded for a server that cannot start."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as err:
        raise OSError(f"--host {host!r} names no address of this machine ({err})") from err
    if _bindable(family, host, port):
        return
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if _bindable(family, host, p)), None)
    instead = f"; pass --port {free}, which is free" if free is not None else "; pass another --port"
    raise OSError(f"port {port} on {host} is already in use{instead}")


def runs_location(path: str | Path) -> str:
    """The runs folder as the app receives it: an absolute local path, or the object-store URL
    (s3://bucket/prefix, gs://..., memory://...) after checking that something is stored there."""
    from trustlens.run.storage import Remote, is_url, local_path

    if is_url(path):
        assert isinstance(path, str)
        if not Remote.of(path).exists():
            raise FileNotFoundError(f"nothing stored at {path!r}: no runs there")
        return path
    local = local_path(path)
    if not local.is_dir():
        what = "is a file, not a folder" if local.exists() else "does not exist"
        raise FileNotFoundError(
            f"runs folder {str(path)!r} {what}: give a folder of recorded runs or one run (e.g. runs/), "
            "or no RUNS_DIR for the shipped sample run"
        )
    return str(local.resolve())


def wait_until_ready(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    """Block until the dashboard at `url` answers its health check; RuntimeError when the process
    exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.read().strip() == b"ok":
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard process exited with status {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard at {url} was not ready after {timeout:.0f} s")
        time.sleep(0.25)


def launch(
    path: str | Path | None = None, port: int = 8501, host: str = "127.0.0.1", open_browser: bool = False
) -> int:
    """Run the dashboard (see `start`) until it is stopped; return its exit code."""
    proc = start(path, port, host, open_browser)
    shown = default_runs() if path is None else path
    print(
        f"trustlens dashboard: serving {shown} at http://{host}:{port} (Ctrl-C stops it)", file=sys.stderr, flush=True
    )
    # `kill` of this process (SIGTERM) stops the server too, instead of orphaning it
    forward = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.terminate()) if forward else None
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0
    finally:
        if forward:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    return launch(args.runs_dir, port=args.port, host=args.host, open_browser=args.open)


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens dashboard`."""
    parser.add_argument(
        "runs_dir",
        nargs="?",
        default=None,
        metavar="RUNS_DIR",
        help="a folder of recorded runs, or one run; a local path or an object-store URL such as "
        "s3://bucket/prefix (default: the shipped sample run)",
    )
    parser.add_argument("--port", type=port_arg, default=8501, help="port to serve on (default 8501)")
    parser.add_argument(
        "--host", type=text_arg, default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--open", action="store_true", help="open a browser tab")
    parser.epilog = (
        "Pages, the address (?run=…&steps=lo-hi), what the numbers mean and the safety measures: "
        "docs/dashboard.md. Requests must name this machine or --host in their Host header."
    )
    parser.set_defaults(func=_run)


def _serve(argv: list[str]) -> int:
    """`python -m trustlens.dashboard run APP [flags]`: preload, then Streamlit's `run`."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from streamlit.web import cli as streamlit_cli

    return streamlit_cli.main(args=argv, prog_name="streamlit", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1:]))
