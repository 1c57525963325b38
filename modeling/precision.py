"""What the host can compute in: read once by the learner and the SFT trainer."""
from __future__ import annotations


def cpu_has_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 autocast then trains ~5x faster than fp32 on CPU (measured on
    SmolLM2-135M, 2k-token rows, 2 threads: ~6 s vs ~30 s per forward+backward)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
