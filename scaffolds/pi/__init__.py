"""The pi coding agent (the deployment scaffold), one headless episode at a time.

pi exits 0 even when the episode failed, has no turn cap and hangs forever on a stalled
stream, so the outcome is judged from its JSON event stream (the last assistant message's
`stopReason`), a wall clock and a turn cap are enforced here, and on either the whole process
tree is ended. Its `message_update` events repeat the whole partial message each time (quadratic
in length), so stdout is parsed line by line and those lines are never stored.

    install.py  where pi lives, its private config and its command line
    events.py   the event stream parser (counters, not events)
    launch.py   where pi runs (a `Launcher`: `HostLauncher`, a plain process group for
                development, or `SandboxLauncher`, inside the episode's sandbox, reaching the
                policy server through a forwarded unix socket, scaffolds/socket_forward.py),
                and the /proc scan for an episode's leftover processes
    episode.py  `run_pi_episode`, the single entry point for training, evaluation and
                best-of-N (via `run_pi_in_env` / `run_pi_episode_on_actor` where the checkout
                lives on an EnvActor), and `PiScaffold`

The system prompt defaults to the one the native scaffold renders (scaffolds/system_prompt.py),
passed with --system-prompt so a repository's `.pi/SYSTEM.md` cannot replace it.
"""
