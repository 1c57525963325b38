#!/usr/bin/env bash
# One slice of a long run on a host whose batch jobs have a time limit and share no filesystem
# with the next job (an air-gapped queue, a lent machine): set the host up from the offline
# bundle (once: the stamp), continue the run from the pack the previous slice wrote, train
# until the limit, and pack the run for the next slice. Nothing is lost or done twice: a step
# starts only if it can end before the limit, and a slice killed mid-step leaves that step's
# finished groups in the pack for the next slice to reuse.
#
#   scripts/job_slice.sh --limit SECONDS --out PACK_DIR [--bundle DIR] [--in PACK_DIR] \
#       CONFIG RUN_DIR [key=value ...]
#
# A new run starts from CONFIG (its calibration, then GRPO); an existing one (RUN_DIR/config.yaml,
# unpacked or left by a slice on the same host) resumes with the overrides given. The Python
# stack (torch, vLLM, Ray) must be importable by $PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="" OUT="" BUNDLE="" IN=""
while [ $# -gt 0 ]; do
  case $1 in
    --limit) LIMIT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bundle) BUNDLE=$2; shift 2 ;;
    --in) IN=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -n "$LIMIT" ] && [ -n "$OUT" ] && [ $# -ge 2 ] || {
  echo "usage: scripts/job_slice.sh --limit SECONDS --out PACK_DIR [--bundle DIR] [--in PACK_DIR] CONFIG RUN_DIR [key=value ...]" >&2
  exit 2; }
CONFIG=$1 RUN=$2; shift 2
PY=${PYTHON:-python3}
log() { printf '[slice] %s\n' "$*"; }
t0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }

if [ -n "$BUNDLE" ]; then
  PYTHON=$PY bash scripts/setup.sh --offline "$BUNDLE" || { log "set-up from $BUNDLE failed"; exit 1; }
fi
if [ -n "$IN" ] && [ -f "$IN/run.manifest.json" ]; then
  "$PY" -m cli.main unpack "$IN" "$RUN" || exit 1
fi
if [ -f "$RUN/config.yaml" ]; then
  args=(train --resume "$RUN" "$@")
else
  args=(train "$CONFIG" "trainer.run_dir=$RUN" "$@")
fi
# the soft limit leaves the pack its time; the hard one (SIGINT: Ray shuts its actors down) ends
# a calibration or a step that outlives it
PACK_S=60
soft=$(( $(left) - PACK_S ))
log "rlvr ${args[*]} (time limit ${soft} s)"
timeout -s INT -k 30 "$soft" "$PY" -m cli.main "${args[@]}" --time-limit "$(( soft - 15 ))"
rc=$?
[ $rc = 124 ] && log "the time limit ended the run mid-stage; its finished work is kept"
"$PY" -m cli.main pack "$RUN" "$OUT" || exit 1
log "slice done in $(( $(date +%s) - t0 )) s (rlvr exit $rc)"
[ $rc = 124 ] && exit 0
exit $rc
