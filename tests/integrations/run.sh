#!/usr/bin/env bash
# The slow integration tests, each trainer in its own venv made from the project's files:
#   verl 0.9.1 (pip install -e ".[verl]"), verl 0.7.1 (requirements-verl07.txt) and
#   OpenRLHF 0.11.2 (requirements-openrlhf.txt, then openrlhf itself with --no-deps).
# Usage: bash tests/integrations/run.sh [VENVS_DIR]
# VENVS_DIR defaults to ~/.cache/trustlens/venvs; a venv is kept while what it was made from (the
# build system, the dependencies and the extras the venvs install, verl and torch, that
# pyproject.toml declares; these requirement files; this script) is unchanged, and made anew
# otherwise: a change to pyproject's tool settings or to another extra ([dev]) keeps them.
# The three venvs are made at the same time (pip mostly waits on downloads), each logging to
# VENVS_DIR/NAME.log, which is printed if it fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
venvs="${1:-$HOME/.cache/trustlens/venvs}"
here=tests/integrations
export OMP_NUM_THREADS=1
declared=$(python3 -c 'import json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
extras = p["project"].get("optional-dependencies", {})
print(json.dumps([p["build-system"], {k: p["project"].get(k) for k in ("requires-python", "dependencies")},
                  {k: extras.get(k) for k in ("verl", "torch")}], sort_keys=True))')
stamp=$( (echo "$declared"; cat "$here"/requirements-*.txt "$0") | sha256sum | cut -c1-16)

lock="$venvs/.checkout.lock"
make_venv() {  # NAME EXTRA NO_DEPS_PACKAGE PIP_ARGS...: torch==2.13.0 (the CPU build) first, then
  # PIP_ARGS, then this checkout with [EXTRA] resolved together with PIP_ARGS, one venv at a time
  # (setuptools writes trustlens.egg-info into the checkout)
  local name=$1 extra=$2 nodeps=$3 dir="$venvs/$1"; shift 3
  if [ "$(cat "$dir/.trustlens-stamp" 2>/dev/null)" = "$stamp" ]; then
    flock "$lock" "$dir/bin/pip" install -q --no-deps -e .  # this checkout's trustlens
    return
  fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q torch==2.13.0
  "$dir/bin/pip" install -q "$@" pytest pytest-timeout
  flock "$lock" "$dir/bin/pip" install -q -e ".[$extra]" "$@"
  if [ -n "$nodeps" ]; then "$dir/bin/pip" install -q --no-deps "$nodeps"; fi
  echo "$stamp" > "$dir/.trustlens-stamp"
}

start=$SECONDS
mkdir -p "$venvs"
make_venv verl09 verl "" "verl==0.9.1" >"$venvs/verl09.log" 2>&1 &
verl09=$!
make_venv verl07 torch "" -r "$here/requirements-verl07.txt" >"$venvs/verl07.log" 2>&1 &
verl07=$!
make_venv openrlhf torch "openrlhf==0.11.2" -r "$here/requirements-openrlhf.txt" >"$venvs/openrlhf.log" 2>&1 &
openrlhf=$!
failed=0
for name in verl09 verl07 openrlhf; do
  if ! wait "${!name}"; then
    echo "making the $name venv failed:" >&2
    cat "$venvs/$name.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "integration venvs ready in $((SECONDS - start)) s" >&2

# pytest in these venvs without pyproject's addopts (its worker processes: pytest-xdist is [dev]'s)
run_pytest() {  # VENV FILES...
  local venv=$1; shift
  "$venvs/$venv/bin/python" -m pytest -q -o addopts="-p no:cacheprovider" -m slow "$@"
}
status=0
for venv in verl09 verl07; do
  run_pytest "$venv" "$here/test_verl.py" "$here/test_verl_corrections.py" || status=1
done
run_pytest openrlhf "$here/test_openrlhf.py" || status=1
echo "integration tests done in $((SECONDS - start)) s" >&2
exit $status
