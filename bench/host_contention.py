"""Is the engine starved by the host's CPUs? Each sequence's decode rate for pi-shaped requests
(a long shared prefix, a short answer, many at once) through the policy server, with the host
quiet, with N CPU-bound processes beside it (as an agentic step's tool calls and test runs
are), and with those processes at a lower priority (nice). The sides alternate within every
round, so the machine's own background load hits each alike.

Why: on the GPU host the main job's calibration decoded ~22 tokens/s a sequence with CUDA
graphs on (docs/results/pi-1gpu/h100-calibration), about what eager decode gave, while 64
sandboxed episodes shared the host's cores with the engine. If the quiet side is much faster,
the step's decode time is the host's CPUs, not the card.

    python -m bench.host_contention [--config configs/pi_1gpu.yaml] [--concurrency 40]
        [--prefix-tokens 2000] [--max-tokens 64] [--burn 16] [--nice 10] [--rounds 3]
        [--json docs/results/.../host_contention.json]

Every request generates exactly --max-tokens tokens (ignore_eos), so the sides do equal work.
`--engine-core own_process` runs vLLM's engine core in a process of its own instead of beside the
policy server's threads (one GIL): run it once each way to see which of the two holds decode back.
The engine serves the default model with the config's rollout section (graphs, KV cache size,
batch limits).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

PARAGRAPH = ("You are a coding agent working in a Python repository. Read files with the read tool, "
             "run commands with bash, and change code with edit or write. Keep changes minimal, run "
             "the tests before you finish, and explain what you changed in one sentence. ")


def _burn(nice: int) -> None:
    if nice:
        os.nice(nice)
    x = 0
    while True:   # pure CPU, like a test run or a compiler: no sleeps
        x = (x * 1103515245 + 12345) % 2**31


def conversations(tokenizer, n: int, prefix_tokens: int) -> list[list[dict]]:
    """n chats sharing one system prompt of about prefix_tokens tokens (pi's is ~2.5k with its
    tools), each with its own task line."""
    system = PARAGRAPH
    while len(tokenizer.encode(system)) < prefix_tokens:
        system += PARAGRAPH
    return [[{"role": "system", "content": system},
             {"role": "user", "content": f"Task {i}: the function `f{i}` in module m{i % 7}.py raises "
                                         "NotImplementedError; restore it so that the tests pass."}]
            for i in range(n)]


def one_side(worker, client, base: str, convs, max_tokens: int, tag: str, burn: int, nice: int) -> dict:
    ctx = mp.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(nice,), daemon=True) for _ in range(burn)]
    for p in burners:
        p.start()
    try:
        time.sleep(1.0 if burn else 0.0)   # let the load take the cores before the requests arrive
        t0 = time.perf_counter()
        client.send((base, convs, max_tokens, tag))
        client.recv()
        wall = time.perf_counter() - t0
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.join()
    calls = [c for i in range(len(convs)) for c in worker.take_episode_calls(f"bench-{tag}-{i}")]
    tokens = sum(len(c.completion_token_ids) for c in calls)
    decode = sum(c.decode_s for c in calls)
    return {"tokens": tokens, "wall_s": wall, "decode_s": decode, "prefill_s": sum(c.prefill_s for c in calls),
            "queue_s": sum(c.queue_s for c in calls), "server_s": sum(c.seconds for c in calls),
            "calls": len(calls), "load_per_core": load}


def summarize(runs: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in runs)
    calls = sum(r["calls"] for r in runs)
    return {"tokens": tokens, "calls": calls,
            "seq_decode_tok_s": tokens / max(sum(r["decode_s"] for r in runs), 1e-9),
            "wall_tok_s": tokens / max(sum(r["wall_s"] for r in runs), 1e-9),
            "mean_call_s": sum(r["server_s"] for r in runs) / max(calls, 1),
            "mean_prefill_s": sum(r["prefill_s"] for r in runs) / max(calls, 1),
            "load_per_core": sum(r["load_per_core"] for r in runs) / len(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/pi_1gpu.yaml", help="its rollout section sizes the engine")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, default=40, help="requests in flight at once")
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--burn", type=int, default=os.cpu_count() or 1, help="CPU-bound processes beside the engine")
    ap.add_argument("--nice", type=int, default=10, help="their niceness on the third side (0: no third side)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine-core", choices=["in_process", "own_process"], default=None,
                    help="rollout.engine_core for this run (default: the config's): run once each to compare")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.enforce_eager=true")
    args = ap.parse_args()

    from actors.rollout_worker import RolloutWorker
    from bench.rollout import _client_process  # the requests come from another process, as pi's do
    from modeling.default_model import resolve_model_path
    from rl.config import load_config

    cfg = load_config(args.config, [*args.overrides, *([f"rollout.engine_core={args.engine_core}"]
                                                        if args.engine_core else [])])
    from actors.engine import engine_env_vars
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = engine_env_vars(cfg.rollout, 1)["VLLM_ENABLE_V1_MULTIPROCESSING"]
    t0 = time.perf_counter()
    worker = RolloutWorker(resolve_model_path(args.model), cfg.rollout, cfg.model, enable_lora=False)
    base = worker.start_server()
    startup = time.perf_counter() - t0
    convs = conversations(worker.tokenizer, args.concurrency, args.prefix_tokens)
    ctx = mp.get_context("spawn")
    client, child_end = ctx.Pipe()
    proc = ctx.Process(target=_client_process, args=(child_end,), daemon=True)
    proc.start()
    one_side(worker, client, base, convs[:2], 8, "warm", 0, 0)   # warm-up: the shared prefix is cached from here

    sides = {"quiet": (0, 0), f"burn {args.burn}": (args.burn, 0)}
    if args.nice:
        sides[f"burn {args.burn} nice {args.nice}"] = (args.burn, args.nice)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            burn, nice = sides[name]
            runs[name].append(one_side(worker, client, base, convs, args.max_tokens, f"{r}-{len(runs[name])}-{burn}-{nice}",
                                       burn, nice))
            print(f"[bench] round {r + 1}/{args.rounds} {name}: {summarize(runs[name][-1:])['seq_decode_tok_s']:.1f} "
                  "tok/s a sequence", flush=True)
    client.send(None)
    proc.join(timeout=30)
    worker.shutdown()

    rows = {name: summarize(rs) for name, rs in runs.items()}
    quiet = rows["quiet"]["seq_decode_tok_s"]
    print(f"{args.concurrency} requests at once, {args.prefix_tokens}-token shared prefix, {args.max_tokens} tokens "
          f"each, {args.rounds} rounds, engine core {cfg.rollout.engine_core}; engine start {startup:.1f} s "
          f"({platform.node()}, {os.cpu_count()} cpus)")
    print(f"{'side':>22} | {'tok/s a seq':>11} | {'x quiet':>7} | {'wall tok/s':>10} | {'call s':>6} | "
          f"{'prefill s':>9} | {'load/core':>9}")
    print("-" * 92)
    for name, row in rows.items():
        print(f"{name:>22} | {row['seq_decode_tok_s']:>11.1f} | {row['seq_decode_tok_s'] / quiet:>7.2f} | "
              f"{row['wall_tok_s']:>10.0f} | {row['mean_call_s']:>6.2f} | {row['mean_prefill_s']:>9.3f} | "
              f"{row['load_per_core']:>9.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "engine_core": cfg.rollout.engine_core,
                                               "startup_s": startup, "host": platform.node(),
                                               "cpus": os.cpu_count(), "rows": rows, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
