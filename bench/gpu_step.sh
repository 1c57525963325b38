#!/bin/bash
# The records of docs/results/gpu-step on one CUDA card, with the GPU stack importable (vLLM 0.26,
# trl 1.16, datasets, pytest): `bash bench/gpu_step.sh STAGE [OUT_DIR]` writes OUT_DIR/STAGE.json (every
# stage's exit status, wall time and records, rewritten after each stage) and OUT_DIR/STAGE.log.
# Stages (bench/gpu_step.py says what each runs and how long it may take):
#   prep, 3b, tests, 4b-agentic, 4b    one stage
#   part1 (prep, 3b), part2 (prep, tests), part3 (prep, 4b-agentic)
#                                      one device call each (<= CALL_S=530 s), on the same warm machine
#   all                                every stage but 4b, one after the other (no call limit)
# Environment: M3, M4 (checkpoint folders, default /tmp/qwen2-3b, /tmp/qwen35-4b), TOKENIZER (prep),
# RLVR_HOME (default /tmp/rlvr-home: vLLM's compile cache for our engines), SIDES, STEPS, GEN_TOKENS (3b),
# AGENTIC_STEPS, AGENTIC_KV_GIB (4b-agentic), RLVR_GPU_TEST_BUDGET_S (tests), CALL_S, GIT_COMMIT.
set -uo pipefail
stage=${1:?usage: bash bench/gpu_step.sh STAGE [OUT_DIR]}
out=${2:-docs/results/gpu-step}
mkdir -p "$out"
export VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export RLVR_HOME=${RLVR_HOME:-/tmp/rlvr-home}
mkdir -p "$RLVR_HOME"
python3 -m bench.gpu_step "$stage" "$out" 2>&1 | tee "$out/$stage.log"
