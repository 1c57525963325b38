"""Fetch a library's sdist tarball from PyPI (no build: building runs the package's code)
and keep an extracted, byte-compiled pristine tree of it in a cache."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import sandbox_python_dir
from rl import paths

PYPI_JSON = os.environ.get("RLVR_PYPI_JSON", "https://pypi.org/pypi")


def cache_dir() -> Path:
    return paths.cache_dir() / "sdists"


@dataclass
class SdistInfo:
    library: str
    version: str
    filename: str
    sha256: str
    url: str


def lookup(library: str, version: str | None = None) -> SdistInfo:
    """The sdist's file name, URL and digest from PyPI's JSON API."""
    api = f"{PYPI_JSON}/{library}/json"   # per-version JSON is missing on some mirrors: use releases
    with urllib.request.urlopen(api, timeout=60) as resp:
        data = json.load(resp)
    version = version or data["info"]["version"]
    files = data.get("releases", {}).get(version) or (data["urls"] if version == data["info"]["version"] else [])
    sdists = [u for u in files if u["packagetype"] == "sdist"]
    if not sdists:
        raise ValueError(f"{library} {version} publishes no sdist on PyPI")
    u = sdists[0]
    return SdistInfo(library, version, u["filename"], u["digests"]["sha256"],
                     urllib.parse.urljoin(api, u["url"]))


def download(info: SdistInfo) -> Path:
    """The tarball in the cache, downloaded once and checked against its sha256."""
    target = cache_dir() / info.filename
    if target.exists() and _sha256(target) == info.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(info.url, timeout=120) as resp:
        data = resp.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise ValueError(f"{info.filename}: sha256 {digest} != expected {info.sha256}")
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def pristine_tree(info: SdistInfo) -> Path:
    """Extracted sdist top directory (read-only to everyone but root), with .pyc compiled.

    Extraction uses tarfile's 'data' filter (no absolute paths, no links out, no devices);
    byte-compiling parses the code without running it. The .pyc halve pytest start-up.
    """
    dest = cache_dir() / "trees" / f"{info.filename}-{info.sha256[:12]}"
    if (dest / ".complete").exists():
        return _top(dest)
    tarball = download(info)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    with tarfile.open(tarball) as tf:
        tf.extractall(staging, filter="data")
    top = _top(staging)
    # byte-compiled by the Python the tests run with (its version names the .pyc it reads)
    sandbox_py = sandbox_python_dir() / "bin" / "python"
    subprocess.run([str(sandbox_py) if sandbox_py.exists() else sys.executable, "-m", "compileall", "-q", "-j", "1",
                    str(top)], check=False, capture_output=True)  # files that do not compile simply get no .pyc
    for root, dirs, files in os.walk(staging):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    (staging / ".complete").write_text(info.sha256)
    try:
        staging.rename(dest)
    except OSError:          # another process finished first
        shutil.rmtree(staging)
    return _top(dest)


def tree_for(library: str, version: str, filename: str, sha256: str, url: str) -> Path:
    return pristine_tree(SdistInfo(library, version, filename, sha256, url))


def _top(root: Path) -> Path:
    dirs = [p for p in root.iterdir() if p.is_dir()]
    if len(dirs) != 1:
        raise ValueError(f"{root}: expected one top-level directory in the sdist, found {len(dirs)}")
    return dirs[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
