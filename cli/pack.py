"""`rlvr pack` / `rlvr unpack`: a run directory (or an evaluation folder) as hash-listed chunks
of bounded size, to continue it on another host (orchestrator/run_pack.py says what travels)."""
from __future__ import annotations

from pathlib import Path

from rl.chunked import MIB, ChunkError


def _pack(args) -> int:
    from orchestrator.run_pack import pack_run

    manifest = pack_run(Path(args.run_dir), Path(args.out), args.chunk_mib)
    total = sum(c["bytes"] for c in manifest["chunks"])
    step = manifest["meta"]["checkpoint_step"]
    print(f"[rlvr] packed {args.run_dir} ({'checkpoint step ' + str(step) if step else 'no checkpoint'}) into "
          f"{len(manifest['chunks'])} chunk(s), {total / MIB:.1f} MiB: {args.out}")
    return 0


def _unpack(args) -> int:
    from orchestrator.run_pack import unpack_run

    try:
        manifest = unpack_run(Path(args.pack), Path(args.run_dir), force=args.force)
    except (ChunkError, FileExistsError) as e:
        raise SystemExit(f"rlvr unpack: {e}") from None
    print(f"[rlvr] {args.run_dir} holds the pack of {manifest['meta']['run']} "
          f"(checkpoint step {manifest['meta']['checkpoint_step']})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("pack", help="pack a run directory's records and last checkpoint into chunks (another host "
                                    "continues it with `rlvr unpack` and `rlvr train --resume`)")
    p.add_argument("run_dir")
    p.add_argument("out", help="folder for run.manifest.json and the run.tar.xz.NNN chunks")
    p.add_argument("--chunk-mib", type=int, default=15, help="largest chunk, MiB (default 15)")
    p.set_defaults(func=_pack)
    u = sub.add_parser("unpack", help="unpack `rlvr pack` chunks into a run directory (every chunk verified first)")
    u.add_argument("pack", help="the folder `rlvr pack` wrote")
    u.add_argument("run_dir")
    u.add_argument("--force", action="store_true", help="replace a non-empty run directory")
    u.set_defaults(func=_unpack)
