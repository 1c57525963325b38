"""Native scaffold: a Python agent loop that presents exactly pi's tools, schemas and system
prompt to the policy server, runs the tool calls in the episode's sandbox (on an EnvActor),
and enforces the turn, token and wall-clock limits pi itself lacks."""
from __future__ import annotations

import time

import openai
import ray

from envs.tools import PI_TOOLS
from rl.config import ScaffoldConfig
from scaffolds.base import EpisodeOutcome, ScaffoldInputs
from scaffolds.system_prompt import render_system_prompt


def run_native_episode(episode_url: str, model_id: str, env_actor, env_episode: str, task_prompt: str,
                       cwd: str, cfg: ScaffoldConfig) -> EpisodeOutcome:
    """Drive one episode; the policy server records every call under `episode_url`."""
    start = time.monotonic()
    deadline = start + cfg.wall_clock_s
    client = openai.OpenAI(base_url=episode_url, api_key="local", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": render_system_prompt(cwd)},
                            {"role": "user", "content": task_prompt}]
    tools = [dict(t) for t in PI_TOOLS]  # pi's default tools (read, bash, edit, write), its schemas
    out = EpisodeOutcome(stop_reason="max_turns")
    tokens_used = 0
    while out.turns < cfg.max_turns:
        left = deadline - time.monotonic()
        if left <= 0:
            out.stop_reason = "wall_clock"
            break
        try:
            resp = client.chat.completions.create(model=model_id, messages=messages, tools=tools, timeout=left)
        except openai.APITimeoutError:  # the request ran into the episode's wall clock
            out.stop_reason = "wall_clock"
            break
        except openai.APIError as e:  # the episode ends as a recorded failure, the run goes on
            out.stop_reason, out.error = "error", f"{type(e).__name__}: {e}"
            break
        out.turns += 1
        choice = resp.choices[0]
        tokens_used = resp.usage.total_tokens if resp.usage else tokens_used
        calls = choice.message.tool_calls or []
        messages.append({"role": "assistant", "content": choice.message.content or "",
                         **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
        if choice.finish_reason == "length":
            out.stop_reason = "length"
            break
        if not calls:
            out.stop_reason = "stop"
            break
        for call in calls:
            result = ray.get(env_actor.call_tool.remote(env_episode, call.function.name, call.function.arguments))
            out.tool_calls += 1
            out.tool_failures += int(result.is_error)
            if call.function.name == "edit":
                out.edits += 1
                out.edit_failures += int(result.is_error)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
        if tokens_used >= cfg.max_episode_tokens:
            out.stop_reason = "token_budget"
            break
    out.seconds = time.monotonic() - start
    return out


class NativeScaffold:
    """The Python agent loop above, as a `Scaffold`."""
    name = "native"

    def run(self, inputs: ScaffoldInputs) -> EpisodeOutcome:
        cwd = ray.get(inputs.env_actor.sandbox_cwd.remote(inputs.env_episode))
        return run_native_episode(inputs.episode_url, inputs.model_id, inputs.env_actor, inputs.env_episode,
                                  inputs.task_prompt, cwd, inputs.cfg)
