"""Data-parallel learner group: step time, tokens/s, scaling efficiency and replica agreement.

Runs the same batch through one Learner actor and through a group of N (one per GPU on a
GPU host, gloo on CPU), then reports throughput and the max |difference| between replicas'
LoRA weights (must be 0) and between the group and the single learner.

  CPU / gloo (small model):  python -m bench.learner_dp --num-learners 2 --seq-len 256 --samples 4
  2 GPUs / NCCL:             python -m bench.learner_dp --num-learners 2 --num-gpus 1 \
                                 --model PATH_OR_default --seq-len 4096 --samples 8 --json bench/results/dp.json
  one learner per node:      python -m bench.learner_dp --address auto --one-per-node ...
                             (a STRICT_SPREAD placement group: the all-reduce crosses nodes)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path


def make_batch(n: int, length: int, vocab: int, seed: int):
    from rl.types import TrainSample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = length // 8
        ids = [rng.randrange(vocab) for _ in range(length)]
        out.append(TrainSample(ids, [0] * prompt + [1] * (length - prompt),
                               [0.0] * prompt + [-rng.uniform(4, 10) for _ in range(length - prompt)],
                               advantage=1.0 if i % 2 == 0 else -1.0, group_id=str(i // 2)))
    return out


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def timed_steps(train, batches) -> tuple[list[dict], float]:
    metrics, start = [], time.perf_counter()
    for b in batches:
        metrics.append(train(b))
    return metrics, time.perf_counter() - start


def spread_group(cfg, path: str, args):
    """A LearnerGroup whose ranks sit on distinct nodes; (group, [node address of each rank])."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from actors.learner_group import LearnerGroup

    n = args.num_learners
    shape = {"CPU": args.num_cpus, **({"GPU": args.num_gpus} if args.num_gpus else {})}
    pg = placement_group([shape] * n, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=300)
    options = [{"num_cpus": args.num_cpus, "num_gpus": args.num_gpus,
                "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(args.threads)}},
                "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)}
               for r in range(n)]
    address = {x["NodeID"]: x["NodeManagerAddress"] for x in ray.nodes()}
    node_ids = placement_group_table(pg)["bundles_to_node_id"]
    return LearnerGroup(cfg, path, options), [address[node_ids[r]] for r in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--num-learners", type=int, default=2)
    ap.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per learner (1 on a multi-GPU host)")
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per learner")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per learner")
    ap.add_argument("--samples", type=int, default=4, help="sequences per step (split across learners)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2, help="timed steps (after one warm-up step)")
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--address", default=None, help="join this Ray cluster (auto under `ray job submit`)")
    ap.add_argument("--one-per-node", action="store_true", help="place the group's learners on distinct nodes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ray

    from actors.learner import Learner
    from modeling.default_model import resolve_model_path
    from orchestrator.cluster import spawn_learners
    from rl.config import RunConfig

    path = resolve_model_path(args.model)
    vocab = json.loads(Path(path, "config.json").read_text())["vocab_size"]

    def cfg(n: int) -> RunConfig:
        return RunConfig.model_validate({"learner": {
            "num_learners": n, "num_gpus": args.num_gpus, "num_cpus": args.num_cpus,
            "torch_threads": args.threads, "micro_batch_tokens": max(args.seq_len, 4096)},
            "lora": {"target_modules": args.lora_targets.split(",")}})

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = {"OMP_NUM_THREADS": str(args.threads), "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"],
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    if args.address:
        ray.init(address=args.address, runtime_env={"env_vars": env})
    else:
        ray.init(include_dashboard=False, configure_logging=False, runtime_env={"env_vars": env})
    batches = [make_batch(args.samples, args.seq_len, vocab, seed) for seed in range(args.steps + 1)]
    tokens_per_step = sum(sum(s.loss_mask) for s in batches[0])

    single_cfg = cfg(1)
    single = ray.remote(Learner).options(num_cpus=args.num_cpus, num_gpus=args.num_gpus).remote(
        path, single_cfg.learner, single_cfg.model, single_cfg.trainer.seed, lora=single_cfg.lora)
    ray.get(single.train_step.remote(batches[0]))
    m1, t1 = timed_steps(lambda b: ray.get(single.train_step.remote(b)), batches[1:])
    single_state = ray.get(single.lora_state.remote())
    ray.kill(single)

    nodes = None
    if args.one_per_node:
        group, nodes = spread_group(cfg(args.num_learners), path, args)
    else:
        group = spawn_learners(cfg(args.num_learners), path, threads=args.threads)
    group.train_step(batches[0])
    mn, tn = timed_steps(group.train_step, batches[1:])
    states = ray.get(group.replica_refs("lora_state"))
    group.shutdown()

    step1, stepn = t1 / args.steps, tn / args.steps
    result = {
        "num_learners": args.num_learners, "seq_len": args.seq_len, "samples_per_step": args.samples,
        "trained_tokens_per_step": tokens_per_step, "device": "cuda" if args.num_gpus > 0 else "cpu",
        "single_step_s": step1, "group_step_s": stepn,
        "single_tokens_per_s": tokens_per_step / step1, "group_tokens_per_s": tokens_per_step / stepn,
        "scaling_efficiency": step1 / (stepn * args.num_learners),
        "replica_max_abs_diff": max(max_diff(states[0], s) for s in states[1:]),
        "group_vs_single_max_abs_diff": max_diff(states[0], single_state),
        "loss_single": [m["loss"] for m in m1], "loss_group": [m["loss"] for m in mn],
        "learner_nodes": nodes,
    }
    width = max(len(k) for k in result)
    for k, v in result.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
