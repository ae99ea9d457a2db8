#!/usr/bin/env bash
# The slow integration tests, each trainer in its own venv made from the project's files:
#   verl 0.9.1 (pip install -e ".[verl]"), verl 0.7.1 (requirements-verl07.txt) and
#   OpenRLHF 0.11.2 (requirements-openrlhf.txt, then openrlhf itself with --no-deps).
# Usage: bash tests/integrations/run.sh [VENVS_DIR]
# VENVS_DIR defaults to ~/.cache/trustlens/venvs; a venv is kept while what it was made from (the
# dependencies pyproject.toml declares, these requirement files and this script) is unchanged, and
# made anew otherwise: a change to pyproject's tool settings (pytest, ruff, mypy) keeps them.
set -euo pipefail
cd "$(dirname "$0")/../.."
venvs="${1:-$HOME/.cache/trustlens/venvs}"
here=tests/integrations
export OMP_NUM_THREADS=1
declared=$(python3 -c 'import json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
print(json.dumps([p["build-system"], {k: p["project"].get(k) for k in ("requires-python", "dependencies", "optional-dependencies")}], sort_keys=True))')
stamp=$( (echo "$declared"; cat "$here"/requirements-*.txt "$0") | sha256sum | cut -c1-16)

make_venv() {  # NAME NO_DEPS_PACKAGE PIP_ARGS...: torch==2.13.0 (the CPU build) first, always
  local name=$1 nodeps=$2 dir="$venvs/$1"; shift 2
  if [ "$(cat "$dir/.trustlens-stamp" 2>/dev/null)" = "$stamp" ]; then
    "$dir/bin/pip" install -q --no-deps -e .  # this checkout's trustlens
    return
  fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q torch==2.13.0
  "$dir/bin/pip" install -q "$@"
  if [ -n "$nodeps" ]; then "$dir/bin/pip" install -q --no-deps "$nodeps"; fi
  echo "$stamp" > "$dir/.trustlens-stamp"
}

start=$SECONDS
make_venv verl09 "" -e ".[verl]" "verl==0.9.1" pytest pytest-timeout
make_venv verl07 "" -e ".[torch]" -r "$here/requirements-verl07.txt" pytest pytest-timeout
make_venv openrlhf "openrlhf==0.11.2" -e ".[torch]" -r "$here/requirements-openrlhf.txt" pytest pytest-timeout
echo "integration venvs ready in $((SECONDS - start)) s" >&2

status=0
for venv in verl09 verl07; do
  "$venvs/$venv/bin/python" -m pytest -q -m slow "$here/test_verl.py" "$here/test_verl_corrections.py" || status=1
done
"$venvs/openrlhf/bin/python" -m pytest -q -m slow "$here/test_openrlhf.py" || status=1
echo "integration tests done in $((SECONDS - start)) s" >&2
exit $status
