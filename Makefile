# The two commands a fresh machine needs (README): `make train` and `make test`.
# Both install what is missing first (scripts/setup.sh is idempotent and installs the locks
# in requirements/; `make lock` refreshes them and reruns the suite).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 1
export RAY_AUTH_MODE ?= disabled
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0
export TOKENIZERS_PARALLELISM ?= false
# a crash, also one at interpreter exit, prints every thread's Python stack
export PYTHONFAULTHANDLER ?= 1

.PHONY: setup setup-gpu train test test-heavy test-gpu lock bench

setup:
	bash scripts/setup.sh

setup-gpu:   # the GPU stack (requirements/gpu.lock) instead of the CPU one
	bash scripts/setup.sh --gpu

train: setup
	.venv/bin/rlvr train configs/default.yaml $(ARGS)
	@echo "the same job at the scale that can learn (one GPU, 8 tasks x 8 episodes a step, >= 100 steps):"
	@echo "  its reward curve and held-out verdict: docs/results/pi-1gpu/README.md"

test: setup
	$(PY) -m pytest -m "not heavy" $(ARGS)

test-heavy: setup
	$(PY) -m pytest -m heavy $(ARGS)

test-gpu:    # the tests that need a CUDA GPU (skipped elsewhere)
	$(PY) -m pytest -m gpu $(ARGS)

lock:
	bash scripts/lock.sh
