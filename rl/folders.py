"""A folder as a value: {relative path: bytes}, so files can travel between nodes through
Ray's object store instead of a shared filesystem (adapters, learner state); and a model
folder's weights as one {name: tensor} dict."""
from __future__ import annotations

import os
from pathlib import Path


def read_folder(root: str | Path) -> dict[str, bytes]:
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_folder(files: dict[str, bytes], root: str | Path) -> Path:
    """Write files under root (created); refuses paths that would leave it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = (root / rel).resolve()
        if os.path.isabs(rel) or root.resolve() not in path.parents:
            raise ValueError(f"write_folder: {rel!r} is not a path inside {root}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def read_safetensors(root: str | Path) -> dict:
    """Every tensor of a model folder's *.safetensors files, under the checkpoint's own names."""
    from safetensors.torch import load_file

    files = sorted(Path(root).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root} holds no *.safetensors file")
    return {k: v for f in files for k, v in load_file(str(f)).items()}
