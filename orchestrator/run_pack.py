"""A run directory packed for a move between hosts that share no filesystem and carry only
files of bounded size (a batch job on a host without registries whose time limit ends it;
its next job, on a fresh host, continues it).

What travels is what resuming needs and what the run recorded: the config, split and band,
the metrics, trace and plots, the latest complete checkpoint (learner state, RNG), the episodes
of a step that was under way (a resumed step reuses its finished groups) and the index of every
group sampled (the rescue schedule reads it), calibration and
evaluation records, the actors' logs. What does not: older checkpoints, the episodes of steps a
checkpoint already covers (their records are in the trace), and scratch (`SCRATCH`).

    rlvr pack RUN_DIR OUT_DIR [--chunk-mib 15]    # OUT_DIR/run.manifest.json + run.tar.xz.NNN
    rlvr unpack OUT_DIR RUN_DIR                   # verified first; refuses a damaged chunk
"""
from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.checkpoint import SCRATCH, checkpoints_dir, latest_checkpoint
from orchestrator.episode_store import INDEX
from rl.chunked import MIB, extract_chunked, read_manifest, write_chunked

NAME = "run"


def resumable_members(run_dir: Path) -> dict[str, Path]:
    """Member name -> path of everything the pack holds (see the module docstring)."""
    run_dir = Path(run_dir)
    found = latest_checkpoint(run_dir)
    members: dict[str, Path] = {}
    for entry in sorted(run_dir.iterdir()):
        if entry.name in SCRATCH or entry.name.startswith("."):
            continue
        if entry == checkpoints_dir(run_dir):
            if found:
                members[f"checkpoints/{found[1].name}"] = found[1]
        elif entry.name == "episodes" and entry.is_dir():
            covered = found[0] if found else 0
            if (entry / INDEX).is_file():   # every group's summary: what later steps read of earlier ones
                members[f"episodes/{INDEX}"] = entry / INDEX
            for f in sorted(entry.glob("step_*.jsonl")):
                if int(f.stem.split("_")[1]) > covered:
                    members[f"episodes/{f.name}"] = f
        else:
            members[entry.name] = entry
    return members


def pack_run(run_dir: Path, out: Path, chunk_mib: int = 15) -> dict:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    found = latest_checkpoint(run_dir)
    return write_chunked(resumable_members(run_dir), Path(out), NAME, chunk_mib * MIB,
                         meta={"run": run_dir.name, "checkpoint_step": found[0] if found else None},
                         preset=1)   # fp32 optimizer state barely compresses: spend no time trying


def unpack_run(folder: Path, run_dir: Path, force: bool = False) -> dict:
    """Verify every chunk, then unpack into run_dir (which must be empty, unless force: then it
    is replaced). A run directory already at or past the pack's checkpoint is left as it is."""
    run_dir = Path(run_dir)
    manifest = read_manifest(Path(folder), NAME)
    step = manifest["meta"].get("checkpoint_step")
    here = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if here is not None and step is not None and here[0] >= step and not force:
        print(f"[rlvr] {run_dir} is already at step {here[0]} (the pack: {step}); left as it is", flush=True)
        return manifest
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise FileExistsError(f"{run_dir} is not empty: unpack into a new directory, or pass --force to replace it")
        shutil.rmtree(run_dir)
    staging = run_dir.with_name(f".{run_dir.name}.unpacking")
    shutil.rmtree(staging, ignore_errors=True)
    extract_chunked(Path(folder), NAME, staging)
    staging.rename(run_dir)
    return manifest
