"""A run's durable copy at `trainer.storage`: a local path or a pyarrow.fs URI (s3://,
gs://, hdfs://, file://), as Ray Train's `storage_path`.

The driver writes every record and checkpoint in its run directory first; after each
checkpoint the run directory (records, split, config, checkpoints; not scratch) is copied
to `<storage>/<run name>/`. A driver that starts with an empty run directory (another node,
a fresh container) pulls that copy back and resumes from its last checkpoint.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from orchestrator.checkpoint import SCRATCH


class RunStorage:
    def __init__(self, uri: str, run_dir: Path):
        if "://" not in uri:
            uri = Path(uri).resolve().as_uri()  # a plain path: the local filesystem
        self.fs, root = pafs.FileSystem.from_uri(uri)
        self.run_dir = Path(run_dir)
        self.root = f"{root.rstrip('/')}/{self.run_dir.resolve().name}"
        self.uri = f"{uri.rstrip('/')}/{self.run_dir.resolve().name}"

    def push(self) -> None:
        """Copy the run directory's records and checkpoints to storage (overwriting)."""
        self.fs.create_dir(self.root, recursive=True)
        for entry in sorted(self.run_dir.iterdir()):
            if entry.name in SCRATCH or entry.name.startswith("."):
                continue
            dest = f"{self.root}/{entry.name}"
            if entry.is_dir():
                self.fs.delete_dir_contents(dest, missing_dir_ok=True)
            pafs.copy_files(str(entry.resolve()), dest, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.fs)

    def has_checkpoint(self) -> bool:
        info = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/checkpoints", allow_not_found=True))
        return any(i.base_name.startswith("step_") for i in info)

    def pull(self) -> None:
        """Copy the stored run into the (empty) run directory."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.root, str(self.run_dir.resolve()), source_filesystem=self.fs,
                        destination_filesystem=pafs.LocalFileSystem())
