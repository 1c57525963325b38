"""Start-up check of a node that hosts environment actors: the sandbox runtime, pi (for
the pi scaffold) and the tasks' source trees must be there. A node that lacks one fails its
actor at start, with the node named and the command that sets it up, instead of failing
every episode later."""
from __future__ import annotations

import socket

import ray

from envs.coding_env import pristine_for
from envs.sandbox import SandboxUnavailable, check_host
from envs.tasks import Task
from scaffolds.pi.install import node_path, pi_cli_path

SETUP_COMMAND = "cd <the project checkout> && bash scripts/setup.sh"


class NodeNotReady(RuntimeError):
    """This node cannot host episodes; the message names it and the fix."""


def distinct_sdists(tasks: list[Task]) -> list[Task]:
    """One task per source distribution: enough to check that every tree is there."""
    return list({(t.library, t.version, t.sdist_sha256): t for t in tasks}.values())


def check_env_node(scaffold: str, tasks: list[Task]) -> None:
    """Raise NodeNotReady listing everything this node lacks."""
    problems = []
    try:
        check_host()
    except SandboxUnavailable as e:
        problems.append(str(e))
    if scaffold == "pi":
        if not pi_cli_path().is_file():
            problems.append(f"pi is not installed ({pi_cli_path()} is missing)")
        try:
            node_path()
        except FileNotFoundError as e:
            problems.append(str(e))
    for task in tasks:
        try:
            pristine_for(task)
        except Exception as e:  # collected, then raised together below with the node's name
            problems.append(f"no source tree for {task.library} {task.version} "
                            f"(from {task.sdist_url}): {type(e).__name__}: {e}")
    if problems:
        node = ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostname()
        raise NodeNotReady(f"node {node} cannot host environment actors: " + "; ".join(problems)
                           + f". Set the node up, on it: {SETUP_COMMAND}")
