"""Generation tokens/s through the policy server vs straight into the engine: the server's overhead.

Same prompts, same engine, one run. "engine" submits the rendered prompt ids to the
worker's engine loop (what `RolloutWorker.generate` does); "server" sends the same chats as
streaming OpenAI requests to `/episodes/<id>/v1` from a separate client process (as pi is)
and counts the recorded tokens. Every request generates exactly --max-tokens tokens (ignore_eos), so both
sides do identical work. Ratio = server tok/s / engine tok/s (target >= 0.9).

    python -m bench.rollout [--prompts 8] [--max-tokens 64] [--concurrency 1,8] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

QUESTIONS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "How do I read a file line by line in Python?",
    "What does the `yield` keyword do?",
    "Give me a shell command that counts lines in all .py files.",
    "Why might a unit test be flaky?",
    "Summarize the difference between a list and a tuple.",
    "Write a regex that matches an email address.",
]


def chats(k: int) -> list[list[dict]]:
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" (#{i})"}] for i in range(k)]


def engine_batch(worker, prompt_ids: list[list[int]], max_tokens: int) -> int:
    from actors.engine import collect_completion
    params = worker.policy.sampling_params(max_tokens, ignore_eos=True)
    streams = [worker.policy.submit(p, params)[1] for p in prompt_ids]
    return sum(len(collect_completion(p, s).token_ids) for p, s in zip(prompt_ids, streams))


async def _client_requests(base: str, convs: list[list[dict]], max_tokens: int, tag: str) -> None:
    from openai import AsyncOpenAI

    async def one(i: int, messages: list[dict]) -> None:
        client = AsyncOpenAI(base_url=f"{base}/episodes/bench-{tag}-{i}/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for _ in stream:
            pass
        await client.close()

    await asyncio.gather(*(one(i, m) for i, m in enumerate(convs)))


def _client_process(conn) -> None:
    """Separate client process: runs one batch of streaming requests per message."""
    while (job := conn.recv()) is not None:
        asyncio.run(_client_requests(*job))
        conn.send("done")


def server_batch(client, worker, base: str, convs: list[list[dict]], max_tokens: int, tag: str) -> int:
    client.send((base, convs, max_tokens, tag))
    client.recv()
    return sum(len(r.completion_token_ids) for i in range(len(convs))
               for r in worker.take_episode_calls(f"bench-{tag}-{i}"))


def timed(fn) -> tuple[int, float]:
    t0 = time.perf_counter()
    tokens = fn()
    return tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8", help="comma list: requests in flight at once")
    ap.add_argument("--rounds", type=int, default=2, help="alternating engine/server rounds per setting")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    from actors.rollout_worker import RolloutWorker
    from modeling.default_model import resolve_model_path
    from rl.config import ModelConfig, RolloutConfig

    cfg = RolloutConfig(max_model_len=1024, max_tokens=args.max_tokens, max_num_seqs=max(16, args.prompts))
    t0 = time.perf_counter()
    worker = RolloutWorker(resolve_model_path(args.model), cfg, ModelConfig(), enable_lora=False)
    base = worker.start_server()
    startup = time.perf_counter() - t0
    convs = chats(args.prompts)
    prompt_ids = [worker._server.prepare({"model": "m", "messages": m})[1] for m in convs]
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    client, child_end = ctx.Pipe()
    proc = ctx.Process(target=_client_process, args=(child_end,), daemon=True)
    proc.start()
    engine_batch(worker, prompt_ids[:1], 8)  # warm-up both paths
    server_batch(client, worker, base, convs[:1], 8, "warm")

    rows = []
    for conc in [int(c) for c in args.concurrency.split(",")]:
        groups = [list(range(i, min(i + conc, args.prompts))) for i in range(0, args.prompts, conc)]
        totals = {"engine": [0, 0.0], "server": [0, 0.0]}
        for r in range(args.rounds):  # alternate so background load hits both sides alike
            for g in groups:
                tok, sec = timed(lambda: engine_batch(worker, [prompt_ids[i] for i in g], args.max_tokens))
                totals["engine"][0] += tok
                totals["engine"][1] += sec
                tok, sec = timed(lambda: server_batch(
                    client, worker, base, [convs[i] for i in g], args.max_tokens, f"{conc}-{r}"))
                totals["server"][0] += tok
                totals["server"][1] += sec
        e_tps = totals["engine"][0] / totals["engine"][1]
        s_tps = totals["server"][0] / totals["server"][1]
        rows.append({"concurrency": conc, "engine_tokens": totals["engine"][0], "engine_tok_s": e_tps,
                     "server_tokens": totals["server"][0], "server_tok_s": s_tps, "ratio": s_tps / e_tps})
    client.send(None)
    proc.join(timeout=30)
    worker.shutdown()

    print(f"model={args.model} prompts={args.prompts} max_tokens={args.max_tokens} rounds={args.rounds} "
          f"startup={startup:.1f}s  ({platform.node()}, {os.cpu_count()} cpus, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})")
    print(f"{'concurrency':>11} | {'engine tok/s':>12} | {'server tok/s':>12} | {'ratio':>6}")
    print("-" * 51)
    for row in rows:
        print(f"{row['concurrency']:>11} | {row['engine_tok_s']:>12.1f} | {row['server_tok_s']:>12.1f} | {row['ratio']:>6.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "startup_s": startup, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
