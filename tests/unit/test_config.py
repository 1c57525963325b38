import json
from pathlib import Path

import pytest
import yaml

from rl.config import RENAMED, RENAMED_VALUES, ConfigError, RunConfig, load_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of a raw config mapping."""
    out = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out += _leaves(v, f"{key}.") if isinstance(v, dict) and v else [(key, v)]
    return out


def _at(data: dict, dotted: str) -> object:
    for part in dotted.split("."):
        data = data[part]
    return data


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.trainer.steps >= 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_key_of_a_shipped_config_loads(path):
    """Each key a shipped config sets reaches the loaded config with the value it was given."""
    raw = yaml.safe_load(path.read_text())
    loaded = load_config(path).model_dump(mode="json")
    leaves = _leaves(raw)
    assert leaves
    for key, value in leaves:
        got = _at(loaded, key)
        assert got == value or (isinstance(value, bool) and got == {True: "on", False: "off"}[value]), (key, value, got)


def _old_key_override(old: str) -> str:
    """An override that sets the old key: true for a boolean that became a choice, else the new key's default."""
    new = RENAMED[old]
    if "=" in new:
        return f"{old}=true"
    return f"{old}={json.dumps(_at(RunConfig().model_dump(mode='json'), new))}"


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_renamed_keys_are_refused_naming_the_new_key(old):
    with pytest.raises(ConfigError) as err:
        load_config(None, [_old_key_override(old)])
    msg = str(err.value)
    assert old in msg and RENAMED[old] in msg and "renamed" in msg and "config.yaml" in msg, msg


def test_renamed_keys_are_listed_together_also_in_a_saved_config(tmp_path):
    """A run's config.yaml saved before the change (what --resume loads) names each old key it holds."""
    p = tmp_path / "config.yaml"
    p.write_text("learner:\n  pack_samples: false\n  share_prefix: true\n  lora_rank: 8\n"
                 "trainer:\n  dynamic_sampling:\n    enabled: true\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert "learner.share_prefix=true is now learner.layout=shared_prefix" in msg
    assert "learner.pack_samples=false was renamed: use learner.layout" in msg
    assert "learner.lora_rank was renamed: use lora.rank" in msg
    assert "trainer.dynamic_sampling was renamed: use trainer.sampling.dynamic" in msg
    assert str(p) in msg and "edit its config.yaml" in msg


@pytest.mark.parametrize("old, value", sorted(RENAMED_VALUES))
def test_the_sync_keys_that_became_one_choice_are_refused_naming_it(old, value):
    """sync.merge_on and sync.transport=cuda_ipc are choices of sync.strategy now; a config that
    still sets them (with the strategy they needed) is refused with the choice to use."""
    with pytest.raises(ConfigError) as err:
        load_config(None, ["sync.strategy=merged", f"{old}={value}"])
    assert f"{old}={value} is now {RENAMED_VALUES[(old, value)]}" in str(err.value), str(err.value)


@pytest.mark.parametrize("strategy", ["lora", "merged", "merged_on_engine"])
def test_each_sync_strategy_loads_and_shared_dir_only_where_it_means_something(strategy):
    assert load_config(None, [f"sync.strategy={strategy}"]).sync.strategy == strategy
    if strategy == "merged_on_engine":
        with pytest.raises(ConfigError, match=r"sync\.transport=shared_dir applies to sync\.strategy lora or merged"):
            load_config(None, [f"sync.strategy={strategy}", "sync.transport=shared_dir"])
    else:
        assert load_config(None, [f"sync.strategy={strategy}", "sync.transport=shared_dir"]).sync.transport == "shared_dir"


@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prefix"])
def test_layout_values_load(layout):
    assert load_config(None, [f"learner.layout={layout}"]).learner.layout == layout
    with pytest.raises(ConfigError, match=r"learner\.layout"):
        load_config(None, ["learner.layout=both"])


def test_one_lora_section_and_the_sampling_section():
    cfg = load_config(None, ["lora.rank=8", "lora.alpha=16", "lora.dropout=0.1",
                             "trainer.sampling.mask_episodes=[truncated]", "trainer.sampling.dynamic.enabled=true"])
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout) == (8, 16, 0.1)
    assert cfg.trainer.sampling.mask_episodes == ["truncated"] and cfg.trainer.sampling.dynamic.enabled


def test_unknown_key_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match=r"trainer\.stepz: unknown key"):
        load_config(p)


def test_bad_value_names_key_and_value(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  temperature: hot\n")
    with pytest.raises(ConfigError, match=r"rollout\.temperature.*'hot'"):
        load_config(p)


def test_malformed_yaml_and_non_mapping(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_dotted_overrides_are_typed():
    cfg = load_config(None, ["trainer.steps=20", "rollout.temperature=0.5", "sync.strategy=merged"])
    assert cfg.trainer.steps == 20 and cfg.rollout.temperature == 0.5 and cfg.sync.strategy == "merged"
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["trainer.steps"])
    with pytest.raises(ConfigError, match=r"sync\.strategy"):
        load_config(None, ["sync.strategy=telepathy"])


def test_on_off_choices_survive_yaml_booleans():
    """YAML 1.1 reads a bare on/off as a boolean; the three-way kernel switch still means what was typed."""
    assert load_config(None, ["learner.fast_kernels=off"]).learner.fast_kernels == "off"
    assert load_config(None, ["learner.fast_kernels=on"]).learner.fast_kernels == "on"
    with pytest.raises(ConfigError, match=r"learner\.fast_kernels"):
        load_config(None, ["learner.fast_kernels=3"])


@pytest.mark.parametrize("overrides, message", [
    (["lora.target_modules=[q_proj, lm_head]"], r"lora\.target_modules contains 'lm_head'"),
    (["ray.expandable_segments=true"], "expandable_segments"),
    (["rollout.max_tokens=4096", "rollout.max_model_len=2048"], "max_tokens"),
    (["scaffold.max_episode_tokens=9000", "rollout.max_model_len=2048"], "max_episode_tokens"),
    (["rollout.num_gpus=0.5", "rollout.sleep_level=2", "sync.strategy=lora"], "sync.strategy=merged"),
    (["sync.strategy=lora", "rollout.guided_logprobs=rescore"], "guided_logprobs=learner"),
    (["trainer.rollout_ahead=true", "rollout.num_gpus=0.5"], "sleep_level=0"),
    (["rollout.ignore_eos=true"], r"rollout\.ignore_eos=true applies to the length task"),
    (["task.length_prompt_tokens=100"], r"task\.length_prompt_tokens applies to the length task"),
    (["task.kind=length", "task.length_prompt_tokens=4000", "rollout.max_tokens=256"], "do not fit"),
])
def test_known_bad_combinations_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_known_bad_combinations_have_escape_hatches():
    load_config(None, ["lora.target_modules=[q_proj, lm_head]", "learner.loss_impl=naive"])
    load_config(None, ["ray.expandable_segments=true", "rollout.sleep_level=0"])
    load_config(None, ["rollout.num_gpus=0.5", "rollout.sleep_level=2", "sync.strategy=merged"])
    load_config(None, ["sync.strategy=lora", "rollout.guided_logprobs=learner"])
    load_config(None, ["sync.strategy=merged", "rollout.guided_logprobs=rescore"])
    load_config(None, ["rollout.num_gpus=1", "sync.strategy=lora", "rollout.guided_logprobs=rescore"])
    load_config(None, ["trainer.rollout_ahead=true", "rollout.num_gpus=0.5", "rollout.sleep_level=0"])
    load_config(None, ["trainer.rollout_ahead=true"])  # on CPU the engine never sleeps
    load_config(None, ["task.kind=length", "rollout.ignore_eos=true", "task.length_prompt_tokens=3840",
                       "rollout.max_tokens=256"])


@pytest.mark.parametrize("argv", [["train", "trainer.stepz=3"], ["eval", "trainer.stepz=3"],
                                  ["calibrate", "trainer.stepz=3"],
                                  ["best-of-n", "--repo", ".", "--task", "t", "--test-cmd", "true", "trainer.stepz=3"]])
def test_every_subcommand_reports_a_config_error_cleanly(argv, capsys):
    from cli.main import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"rlvr {argv[0]}: invalid config" in err and "trainer.stepz: unknown key" in err
    assert "Traceback" not in err


def test_overrides_may_follow_options(capsys):
    """`rlvr warm-start cfg --run-dir x key=value` reaches the config (argparse alone rejected it)."""
    from cli.main import main
    assert main(["warm-start", "configs/default.yaml", "--run-dir", "runs/none", "trainer.stepz=3"]) == 2
    assert "trainer.stepz: unknown key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["warm-start", "configs/default.yaml", "--no-such-flag"])


def test_resume_keeps_its_overrides(tmp_path):
    """`rlvr train --resume RUN key=value`: the first override lands in the `config` positional."""
    import argparse

    from cli.train import register, run_config
    from rl.config import dump_config
    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config(None, [f"trainer.run_dir={run}"]), run / "config.yaml")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "--resume", str(run), "learner.gradient_checkpointing=false",
                              "trainer.steps=3"])
    cfg, run_dir = run_config(args)
    assert run_dir == run and cfg.learner.gradient_checkpointing is False and cfg.trainer.steps == 3
    with pytest.raises(SystemExit, match="uses the run's own config.yaml"):
        run_config(parser.parse_args(["train", "--resume", str(run), "configs/default.yaml"]))


@pytest.mark.parametrize("argv,module,attr,again", [
    (["calibrate"], "cli.calibrate", "main", "the same command"),
    (["train"], "cli.train", "train", "rlvr train --resume RUN_DIR"),
])
def test_an_interrupt_ends_with_one_line_saying_what_is_kept(argv, module, attr, again, monkeypatch, capsys):
    """A batch job's time limit arrives as SIGINT: one line, exit 130, no traceback."""
    import importlib

    from cli.main import main

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(importlib.import_module(module), attr, interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and again in err and "Traceback" not in err


def test_the_engine_core_runs_where_the_config_says_in_every_actor():
    """rollout.engine_core reaches vLLM in the rollout actor's environment (an in-process core
    shares the policy server's GIL; its own process does not)."""
    from actors.engine import engine_env_vars
    from orchestrator.cluster import actor_env

    for where, flag in (("in_process", "0"), ("own_process", "1")):
        cfg = load_config("configs/pi_1gpu.yaml", [f"rollout.engine_core={where}"])
        assert engine_env_vars(cfg.rollout, 1)["VLLM_ENABLE_V1_MULTIPROCESSING"] == flag
        assert actor_env(cfg, 2)["env_vars"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == flag
    assert load_config("configs/default.yaml").rollout.engine_core == "in_process"
