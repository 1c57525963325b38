"""The run config a subcommand was given: the one place its positionals become a RunConfig."""
from __future__ import annotations

from pathlib import Path

from rl.config import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def config_from_args(args):
    """The run config of a subcommand's `config` and `overrides` positionals; the config may
    be left out (`rlvr train a.b=1`), and then the default config takes the overrides."""
    config, overrides = args.config, list(args.overrides)
    if config and "=" in config and not Path(config).exists():  # only overrides were given
        config, overrides = None, [config, *overrides]
    return load_config(config or DEFAULT_CONFIG, overrides)
