#!/bin/bash
# The records of docs/results/gpu-step on one CUDA card, with the GPU stack importable (vLLM 0.26,
# trl 1.16, datasets): `bash bench/gpu_step.sh STAGE [OUT_DIR]`, stages in this order:
#   prep   the random checkpoints: ~3B Qwen2 with the default model's tokenizer (TOKENIZER=folder)
#          in $M3, the Qwen3.5-4B shape in $M4
#   tests  `make test-gpu` (CUDA graphs on, the config's GPU default), its log and records
#   3b     ours vs TRL on the 3B model, alternated (python -m bench.trl_grpo --gpu)
#   4b     ours vs the 4B recipe as it ran before (eager, LoRA adapter sync) on the 4B shape
set -uo pipefail
stage=$1
out=${2:-docs/results/gpu-step}
mkdir -p "$out"
M3=${M3:-/tmp/qwen2-3b}
M4=${M4:-/tmp/qwen35-4b}
export VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
case $stage in
  prep)
    python3 -m bench.trl_grpo --build-qwen2 "$M3" ${TOKENIZER:+--tokenizer "$TOKENIZER"} | tail -1 > "$out/checkpoint_3b.json"
    python3 -m tests.fixtures.qwen35_checkpoint --shape 4b --out "$M4" --device cuda --end-token-p 0.001 | tail -1 \
      > "$out/checkpoint_4b.json" ;;
  tests)
    RLVR_GPU_RESULTS="$out" make test-gpu PY=python3 ARGS="-v -rA --durations=0 -p no:cacheprovider" 2>&1 \
      | tee "$out/test_gpu.log" ;;
  3b)
    python3 -m bench.trl_grpo --gpu --model "$M3" --steps "${STEPS:-6}" --rounds 1 \
      --sides "${SIDES:-ours-gpu,trl-gpu,ours-gpu}" --budget-s "${BUDGET:-400}" --json "$out/trl_grpo_3b.json" 2>&1 \
      | tee "$out/trl_grpo_3b.log" ;;
  4b)
    python3 -m bench.trl_grpo --gpu --model "$M4" --steps "${STEPS:-4}" --rounds 1 \
      --sides "${SIDES:-ours-gpu,ours-gpu-recipe}" --budget-s "${BUDGET:-300}" --json "$out/recipe_4b.json" 2>&1 \
      | tee "$out/recipe_4b.log" ;;
  *) echo "unknown stage $stage (prep, tests, 3b, 4b)"; exit 2 ;;
esac
