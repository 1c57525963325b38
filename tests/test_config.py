from pathlib import Path

import pytest

from rl.config import ConfigError, load_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.trainer.steps >= 1


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
    (["learner.lora_target_modules=[q_proj, lm_head]"], "lm_head"),
    (["ray.expandable_segments=true"], "expandable_segments"),
    (["rollout.max_tokens=4096", "rollout.max_model_len=2048"], "max_tokens"),
    (["scaffold.max_episode_tokens=9000", "rollout.max_model_len=2048"], "max_episode_tokens"),
    (["rollout.num_gpus=0.5", "rollout.sleep_level=2", "sync.strategy=lora"], "sync.strategy=merged"),
    (["sync.strategy=lora", "rollout.guided_logprobs=rescore"], "guided_logprobs=learner"),
    (["trainer.rollout_ahead=true", "rollout.num_gpus=0.5"], "sleep_level=0"),
])
def test_known_bad_combinations_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_known_bad_combinations_have_escape_hatches():
    load_config(None, ["learner.lora_target_modules=[q_proj, lm_head]", "learner.loss_impl=naive"])
    load_config(None, ["ray.expandable_segments=true", "rollout.sleep_level=0"])
    load_config(None, ["rollout.num_gpus=0.5", "rollout.sleep_level=2", "sync.strategy=merged"])
    load_config(None, ["sync.strategy=lora", "rollout.guided_logprobs=learner"])
    load_config(None, ["sync.strategy=merged", "rollout.guided_logprobs=rescore"])
    load_config(None, ["rollout.num_gpus=1", "sync.strategy=lora", "rollout.guided_logprobs=rescore"])
    load_config(None, ["trainer.rollout_ahead=true", "rollout.num_gpus=0.5", "rollout.sleep_level=0"])
    load_config(None, ["trainer.rollout_ahead=true"])  # on CPU the engine never sleeps


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
