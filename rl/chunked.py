"""A folder tree as one xz tar stream cut into chunks of at most N bytes, with a manifest of
hashes: what crosses a link that carries only files of bounded size (an offline bundle for a
host without registries, a run directory moved between hosts).

    manifest = write_chunked({"pi": Path(...), "bin/node": Path(...)}, out_dir, "bundle", 60 * MIB)
    verify_chunks(out_dir, "bundle")       # ChunkError names the first missing or damaged chunk
    extract_chunked(out_dir, "bundle", dest)

Every chunk is hashed before anything is unpacked, so a damaged copy changes nothing on the
host. Standard library only: the installer runs on a bare host before any venv exists.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

MIB = 1 << 20
FORMAT = "agentic-rlvr-chunked/1"


class ChunkError(RuntimeError):
    """A chunk is missing, of the wrong size, or its sha256 is not the manifest's."""


def manifest_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.manifest.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _ChunkWriter(io.RawIOBase):
    """A write-only stream that cuts what it is given into files of at most max_bytes."""

    def __init__(self, folder: Path, name: str, max_bytes: int):
        self.folder, self.name, self.max_bytes = Path(folder), name, max_bytes
        self.chunks: list[dict] = []
        self._file = None
        self._hash = None
        self._size = 0

    def writable(self) -> bool:
        return True

    def _open_next(self) -> None:
        self._close_current()
        path = self.folder / f"{self.name}.tar.xz.{len(self.chunks):03d}"
        self._file, self._hash, self._size = open(path, "wb"), hashlib.sha256(), 0
        self.chunks.append({"file": path.name})

    def _close_current(self) -> None:
        if self._file is not None:
            self._file.close()
            self.chunks[-1].update(sha256=self._hash.hexdigest(), bytes=self._size)
            self._file = None

    def write(self, data) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._size >= self.max_bytes:
                self._open_next()
            n = min(len(view), self.max_bytes - self._size)
            self._file.write(view[:n])
            self._hash.update(view[:n])
            self._size += n
            view = view[n:]
        return len(data)

    def close(self) -> None:
        self._close_current()
        super().close()


def write_chunked(members: dict[str, Path], folder: Path, name: str, max_bytes: int,
                  meta: dict | None = None, preset: int = 6) -> dict:
    """Archive each source path under its member name (files or folders, links kept as links)
    into `<folder>/<name>.tar.xz.NNN` chunks of at most max_bytes, then write the manifest
    (chunk hashes and sizes, each member's file count and bytes, meta). Old chunks of that
    name are removed first, so the folder holds exactly one bundle of it."""
    import lzma

    if max_bytes < MIB:
        raise ValueError(f"chunk size {max_bytes} bytes: use at least 1 MiB")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{name}.tar.xz.*"):
        old.unlink()
    writer = _ChunkWriter(folder, name, max_bytes)
    listed: dict[str, dict] = {}
    with lzma.LZMAFile(writer, "w", preset=preset) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for member, src in members.items():
            src = Path(src)
            if not src.exists():
                raise FileNotFoundError(f"{name}: {member} comes from {src}, which does not exist")
            files = [src] if not src.is_dir() else [src, *sorted(src.rglob("*"))]
            for f in files:
                tar.add(f, arcname=str(Path(member) / f.relative_to(src)) if f != src else member, recursive=False)
            sizes = [f.lstat().st_size for f in files if f.is_file() and not f.is_symlink()]
            listed[member] = {"files": len(sizes), "bytes": sum(sizes)}
    writer.close()
    manifest = {"format": FORMAT, "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "max_chunk_bytes": max_bytes, "chunks": writer.chunks, "members": listed, "meta": meta or {}}
    tmp = manifest_path(folder, name).with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, manifest_path(folder, name))
    return manifest


def read_manifest(folder: Path, name: str) -> dict:
    path = manifest_path(folder, name)
    if not path.is_file():
        raise ChunkError(f"{path} is missing: not a {name} folder written by write_chunked")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ChunkError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def verify_chunks(folder: Path, name: str) -> dict:
    """Every chunk present, of its size and hash; returns the manifest. Raises ChunkError
    naming the first chunk that is not."""
    folder = Path(folder)
    manifest = read_manifest(folder, name)
    for chunk in manifest["chunks"]:
        path = folder / chunk["file"]
        if not path.is_file():
            raise ChunkError(f"chunk {chunk['file']} is missing from {folder} "
                             f"({len(manifest['chunks'])} chunks in the manifest)")
        size = path.stat().st_size
        if size != chunk["bytes"]:
            raise ChunkError(f"chunk {chunk['file']} has {size} bytes, the manifest says {chunk['bytes']}: "
                             f"a partial copy; copy it again")
        digest = sha256_file(path)
        if digest != chunk["sha256"]:
            raise ChunkError(f"chunk {chunk['file']} has sha256 {digest}, the manifest says {chunk['sha256']}: "
                             f"a damaged copy; copy it again (nothing was installed)")
    return manifest


class _ChunkReader(io.RawIOBase):
    def __init__(self, paths: list[Path]):
        self._paths = list(paths)
        self._file = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None


def extract_chunked(folder: Path, name: str, dest: Path) -> dict:
    """Verify every chunk, then unpack the stream into dest (tarfile's 'data' filter: no
    absolute paths, no links out of dest, no devices). Returns the manifest."""
    import lzma

    folder, dest = Path(folder), Path(dest)
    manifest = verify_chunks(folder, name)
    dest.mkdir(parents=True, exist_ok=True)
    reader = io.BufferedReader(_ChunkReader([folder / c["file"] for c in manifest["chunks"]]), 1 << 20)
    with lzma.LZMAFile(reader) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    return manifest
