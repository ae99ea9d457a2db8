"""`python -m trustlens.integrations.openrlhf ARGS`: OpenRLHF's `train_ppo_ray` with the hook.
It starts Ray with `setup` as every Ray process's `worker_process_setup_hook` (and TRUSTLENS_DIR,
made absolute unless a URL, in their environment), then runs `openrlhf.cli.train_ppo_ray`."""

from __future__ import annotations

import os
import re
import runpy
import sys

from trustlens.integrations._ray_hooks import ENV_DIR, run_dir_from_env
from trustlens.integrations.openrlhf.patch import setup


def _is_url(path: str) -> bool:
    """Whether `path` is a URL ("scheme://…", such as s3://bucket/run) rather than a local path."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def main(argv: list[str] | None = None) -> None:
    """`python -m trustlens.integrations.openrlhf ARGS`: OpenRLHF's train_ppo_ray with the hook."""
    run_dir = run_dir_from_env()
    if run_dir is None:
        raise SystemExit(f"set {ENV_DIR} to the run directory to record into")
    import ray

    env = {ENV_DIR: run_dir if _is_url(run_dir) else os.path.abspath(run_dir)}
    os.environ[ENV_DIR] = env[ENV_DIR]
    ray.init(runtime_env={"worker_process_setup_hook": "trustlens.integrations.openrlhf.setup", "env_vars": env})
    setup()
    sys.argv = ["train_ppo_ray", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")


__all__ = ["main"]
