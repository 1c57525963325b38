"""The records of docs/results/gpu-step on one CUDA card, by stage, each bounded in time, into one
summary JSON per call (bench/gpu_step.sh sets the environment and keeps the call's one log).

    bash bench/gpu_step.sh STAGE [OUT_DIR]      # -> OUT_DIR/STAGE.json, OUT_DIR/STAGE.log

Stages:
  prep        the random checkpoints, each skipped where it is already complete: ~3B Qwen2 with the
              default model's tokenizer (TOKENIZER=folder) in $M3, the Qwen3.5-4B shape in $M4;
              and the GPU stack's versions
  3b          ours vs TRL at equal work on the 3B model: 8 x exactly 512 tokens a step, sides
              ours-gpu,trl-gpu,trl-gpu-graphs,ours-gpu (the second ours: a start that reads the
              compile cache the first one wrote)
  4b-agentic  the 4B recipe at an agent's context shape: 2 prompts x 4 episodes, each a 2560-token
              prompt + exactly 1536 generated tokens (4k contexts), CUDA graphs, 24 GiB cap
  tests       `make test-gpu`, every test bounded (RLVR_GPU_TEST_BUDGET_S; it fails naming its phase)
  4b          ours vs the 4B recipe as it ran before (eager, LoRA adapter sync) on the 4B shape
  part1       prep, 3b          (one device call of at most CALL_S seconds, ~9 min)
  part2       prep, tests       (the next call on the same warm machine: part1's checkpoints and
                                 compile caches are still there; prep then only reads them)
  part3       prep, 4b-agentic  (the call after that)
  all         prep, 3b, tests, 4b-agentic in one go (no call limit)
Within a call each stage gets min(its cap, what the call has left less the floors of the stages
after it); the JSON is rewritten after every stage, so a stage that fails or runs out of time
leaves the ones before it (and its own partial records) in place.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu_grpo import ROOT, run_bounded, stop_children_on_term

M3 = os.environ.get("M3", "/tmp/qwen2-3b")
M4 = os.environ.get("M4", "/tmp/qwen35-4b")
SCRATCH = Path(os.environ.get("GPU_STEP_SCRATCH", "/tmp/gpu-step-scratch"))
# (cap, floor) seconds: a stage never gets more than its cap, and the stages before it leave it its floor
LIMITS = {"prep": (180, 20), "3b": (420, 240), "tests": (480, 150), "4b-agentic": (480, 200), "4b": (480, 200)}
PARTS = {"part1": ["prep", "3b"], "part2": ["prep", "tests"], "part3": ["prep", "4b-agentic"],
         "all": ["prep", "3b", "tests", "4b-agentic"]}
GRACE_S = 40  # a bench stage's own deadline sits this far inside its limit: its last side's stop and summary


def _env_num(key: str, default: float) -> float:
    return float(os.environ.get(key, default))


def _last_json_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def stage_prep(limit: float) -> dict:
    out: dict = {"checkpoints": {}}
    t_end = time.monotonic() + limit
    tok = ["--tokenizer", os.environ["TOKENIZER"]] if os.environ.get("TOKENIZER") else []
    builds = {M3: [sys.executable, "-m", "bench.trl_grpo", "--build-qwen2", M3, *tok],
              M4: [sys.executable, "-m", "tests.fixtures.qwen35_checkpoint", "--shape", "4b", "--out", M4, "--device",
                   "cuda", "--end-token-p", "0.001"]}
    for path, cmd in builds.items():
        marker = Path(path, "random_checkpoint.json")
        if marker.is_file():
            out["checkpoints"][path] = {"built": "before", **json.loads(marker.read_text())}
            continue
        t0 = time.monotonic()
        text, rc, timed_out = run_bounded(cmd, _env(), t_end - time.monotonic(), f"prep {Path(path).name}")
        out["checkpoints"][path] = {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1),
                                    **(_last_json_line(text) or {})}
    probe = ("import json, torch, vllm, transformers, peft; v = {m.__name__: m.__version__ for m in "
             "(torch, vllm, transformers, peft)}\n"
             "for name in ('trl', 'datasets', 'fla', 'pytest', 'pytest_timeout'):\n"
             "    try:\n        v[name] = getattr(__import__(name), '__version__', 'present')\n"
             "    except ImportError as e:\n        v[name] = f'missing ({e})'\n"
             "v['gpu'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None\nprint(json.dumps(v))")
    text, rc, _ = run_bounded([sys.executable, "-c", probe], _env(), 60, "prep versions")
    out["versions"] = _last_json_line(text) if rc == 0 else {"rc": rc, "tail": text[-1500:]}
    out["ok"] = all(Path(p, "random_checkpoint.json").is_file() for p in builds)
    return out


def _bench(name: str, limit: float, args: list[str]) -> dict:
    path = SCRATCH / f"{name}.json"
    path.unlink(missing_ok=True)
    deadline = max(60.0, limit - GRACE_S)
    text, rc, timed_out = run_bounded([sys.executable, "-m", "bench.trl_grpo", "--gpu", *args, "--deadline-s",
                                       str(int(deadline)), "--json", str(path)], _env(), limit, name)
    record = json.loads(path.read_text()) if path.is_file() else None
    return {"rc": rc, "timed_out": timed_out, "deadline_s": deadline, "bench": record,
            **({} if record else {"tail": text[-3000:]})}


def stage_3b(limit: float) -> dict:
    sides = os.environ.get("SIDES", "ours-gpu,trl-gpu,trl-gpu-graphs,ours-gpu")
    return _bench("3b", limit, ["--model", M3, "--steps", os.environ.get("STEPS", "4"), "--sides", sides,
                                "--gen-tokens", os.environ.get("GEN_TOKENS", "512")])


def stage_4b_agentic(limit: float) -> dict:
    return _bench("4b-agentic", limit, ["--model", M4, "--steps", os.environ.get("AGENTIC_STEPS", "3"),
                                        "--sides", os.environ.get("AGENTIC_SIDES", "ours-gpu-long"),
                                        "--prompts", "2", "--group", "4", "--prompt-tokens", "2560",
                                        "--gen-tokens", "1536", "--kv-gib", os.environ.get("AGENTIC_KV_GIB", "2.5")])


def stage_4b(limit: float) -> dict:
    return _bench("4b", limit, ["--model", M4, "--steps", os.environ.get("STEPS", "4"),
                                "--sides", os.environ.get("SIDES_4B", "ours-gpu,ours-gpu-recipe")])


def stage_tests(limit: float) -> dict:
    results = SCRATCH / "tests"
    results.mkdir(parents=True, exist_ok=True)
    (results / "gpu_tests.jsonl").unlink(missing_ok=True)
    budget = min(_env_num("RLVR_GPU_TEST_BUDGET_S", 180), limit)
    t0 = time.monotonic()
    text, rc, timed_out = run_bounded(
        ["make", "test-gpu", f"PY={sys.executable}", "ARGS=-v -rA --durations=0 -p no:cacheprovider"],
        _env(RLVR_GPU_RESULTS=str(results), RLVR_GPU_TEST_BUDGET_S=str(int(budget))), limit, "tests")
    summary = re.findall(r"=+ (.*(?:passed|failed|error).*) in ([0-9.]+)s", text)
    records = [json.loads(line) for line in (results / "gpu_tests.jsonl").read_text().splitlines()] \
        if (results / "gpu_tests.jsonl").is_file() else []
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(time.monotonic() - t0, 1), "test_budget_s": budget,
            "pytest_summary": summary[-1][0] if summary else None,
            "pytest_wall_s": float(summary[-1][1]) if summary else None,
            "outcomes": re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M),
            "records": records}


STAGES = {"prep": stage_prep, "3b": stage_3b, "4b-agentic": stage_4b_agentic, "tests": stage_tests, "4b": stage_4b}


def _env(**extra: str) -> dict:
    from bench.gpu_grpo import child_env
    return child_env(**extra)


def stage_limit(names: list[str], i: int, call_s: float, elapsed: float) -> float:
    """Stage i's seconds: its cap, or less where the call (call_s, 0: no limit) must still leave
    the stages after it their floors."""
    cap = LIMITS[names[i]][0]
    if not call_s:
        return cap
    return min(cap, call_s - elapsed - sum(LIMITS[n][1] for n in names[i + 1:]))


def _ok(name: str, rec: dict) -> bool:
    if name == "prep":
        return rec.get("ok", False)
    return rec.get("rc") == 0


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in {**STAGES, **PARTS}:
        raise SystemExit(f"usage: python -m bench.gpu_step STAGE OUT_DIR; STAGE of {', '.join([*STAGES, *PARTS])}")
    stop_children_on_term()
    stage, out_dir = sys.argv[1], Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    names = PARTS.get(stage, [stage])
    call_s = _env_num("CALL_S", 530 if stage.startswith("part") else 0)
    started = time.monotonic()
    doc: dict = {"stage": stage, "call_s": call_s, "host": platform.node(), "started": time.strftime("%FT%T%z"),
                 "commit": os.environ.get("GIT_COMMIT") or _commit(), "m3": M3, "m4": M4, "rlvr_home": os.environ.get("RLVR_HOME"), "stages": {}}
    for i, name in enumerate(names):
        limit = stage_limit(names, i, call_s, time.monotonic() - started)
        if limit < LIMITS[name][1] / 2:
            doc["stages"][name] = {"rc": None, "skipped": f"{limit:.0f} s left of the call's {call_s:.0f}"}
            print(f"== {name}: skipped ({limit:.0f} s left)", flush=True)
            _write(out_dir, stage, doc)
            continue
        print(f"== {name}: up to {limit:.0f} s", flush=True)
        t0 = time.monotonic()
        try:
            rec = STAGES[name](limit)
        except Exception as e:  # a stage that cannot even start still leaves the others' records
            rec = {"rc": None, "error": f"{type(e).__name__}: {e}"}
        rec["stage_wall_s"] = round(time.monotonic() - t0, 1)
        rec["limit_s"] = round(limit, 1)
        doc["stages"][name] = rec
        print(f"== {name}: {'ok' if _ok(name, rec) else 'NOT ok'} in {rec['stage_wall_s']} s", flush=True)
        _write(out_dir, stage, doc)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    _write(out_dir, stage, doc)
    failed = [n for n, r in doc["stages"].items() if not _ok(n, r)]
    print(f"== {stage}: {doc['wall_s']} s; {'every stage ok' if not failed else 'not ok: ' + ', '.join(failed)}")
    sys.exit(1 if failed else 0)


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    return done.stdout.strip() or None


def _write(out_dir: Path, stage: str, doc: dict) -> None:
    tmp = out_dir / f".{stage}.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out_dir / f"{stage}.json")


if __name__ == "__main__":
    main()
