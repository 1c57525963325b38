"""Entry points: the `rlvr` command and its subcommands (parse, load the config, call the loop)."""
