"""The offline bundle: everything `scripts/setup.sh` fetches for the coding environment, in
one folder of hash-listed chunks, for a host without registries (an air-gapped cluster node,
a GPU host with no network).

    python -m scripts.bundle write DIR [--python 3.12] [--chunk-mib 60]   # on a set-up machine with registries
    python3 -m scripts.bundle install DIR [--python /usr/bin/python3.12]  # on the host (scripts/setup.sh --offline DIR)

What it holds: bubblewrap and node (this machine's binaries: both hosts must be x86-64 Linux
with the same C library generation), pi's locked node_modules tree (as `npm ci` installed it
from scripts/pi/package-lock.json), wheels of the sandbox lock and of every task file's test
dependencies for the target Python, pip itself, the task files' sdists (each checked against
the digest its task records), the default model's GGUF, and the project's own pure-Python
needs that a GPU image lacks (gguf). `--model NAME` (opt-in, repeatable) adds a pinned coder
model's joined GGUF (modeling/pinned_models.py; 1.1 GB for qwen2.5-coder-1.5b): the host
converts it on first use, after checking it against its pin again. Not the Python stack of the project (vLLM, torch): a GPU
host brings its own.

`install` verifies every chunk's sha256 before it unpacks anything (a damaged chunk is named
and nothing changes), then places each part where setup.sh would, and stamps the sandbox
Python and pi as setup.sh does, so a later `scripts/setup.sh` finds them done. The sandbox
venv's own pip is pointed at the bundled wheels (its site pip.conf), so the per-library test
overlays (envs/testdeps.py) install offline too. Standard library only: it runs before any venv.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rl import paths
from rl.chunked import MIB, ChunkError, extract_chunked, read_manifest, write_chunked

NAME = "bundle"
STAMP = ".bundle-done"   # under RLVR_HOME: the sha256 of the installed bundle's manifest
ROOT = Path(__file__).resolve().parent.parent
SANDBOX_LOCK = ROOT / "requirements" / "sandbox.lock"
PI_LOCK = ROOT / "scripts" / "pi" / "package-lock.json"
PROJECT_WHEELS = ("gguf",)   # the project's pure-Python needs a GPU image lacks (the default model's conversion)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def log(msg: str) -> None:
    print(f"[bundle] {msg}", flush=True)


def lock_pins(lock: Path) -> list[str]:
    return re.findall(r"^([A-Za-z0-9][\w.-]*==[^\s\\]+)", lock.read_text(), re.M)


def task_files(patterns: list[str]) -> list[Path]:
    found = sorted({Path(p) for pat in patterns for p in glob.glob(str(ROOT / pat) if not Path(pat).is_absolute()
                                                                   else pat)})
    if not found:
        raise SystemExit(f"no task files match {patterns}")
    return found


def tasks_needs(files: list[Path]) -> tuple[dict[str, dict], list[str]]:
    """The sdists (by file name: url, sha256) and the test-dependency pins of every task."""
    sdists: dict[str, dict] = {}
    pins: set[str] = set()
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            t = json.loads(line)
            sdists.setdefault(t["sdist_filename"], {"url": t["sdist_url"], "sha256": t["sdist_sha256"]})
            pins.update(t.get("test_deps") or [])
    return sdists, sorted(pins)


def download_wheels(pins: list[str], dest: Path, python: str) -> None:
    """Binary wheels of exactly these pins for the target Python (no resolution: pins are complete)."""
    if not pins:
        return
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--abi", f"cp{python.replace('.', '')}", "--abi", "abi3", "--abi", "none", *plat, "-d", str(dest), *pins]
    subprocess.run(cmd, check=True)


def fetch_sdist(filename: str, url: str, sha256: str, dest: Path) -> Path:
    """The task's sdist from the local cache (envs/sdist.py's) or its URL, checked against its digest."""
    import urllib.request

    from envs.sdist import cache_dir

    target = dest / filename
    cached = cache_dir() / filename
    if cached.is_file() and _sha256(cached) == sha256:
        shutil.copyfile(cached, target)
    else:
        with urllib.request.urlopen(url, timeout=120) as resp:
            target.write_bytes(resp.read())
    digest = _sha256(target)
    if digest != sha256:
        raise SystemExit(f"{filename}: sha256 {digest}, the task files say {sha256}")
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _installed_version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


def cmd_write(args) -> None:
    """Gather the parts into a staging folder, then archive it as chunks in DIR."""
    from modeling.default_model import gguf_path  # the model's GGUF, as the set-up fetched it
    from modeling.pinned_models import PINNED, PinError, fetch_gguf

    t0 = time.time()
    out = Path(args.dir).resolve()
    rlvr_home = paths.rlvr_home()
    pi_dir = rlvr_home / "pi"
    problems = []
    bwrap, node = shutil.which("bwrap"), shutil.which("node")
    if not bwrap or not node:
        problems.append("bwrap and node must be on PATH")
    if not (pi_dir / "node_modules" / ".bin" / "pi").exists() or \
            not (pi_dir / "package-lock.json").is_file() or (pi_dir / "package-lock.json").read_bytes() != PI_LOCK.read_bytes():
        problems.append(f"pi at {pi_dir} is missing or not installed from {PI_LOCK}")
    gguf = gguf_path()
    if not gguf.is_file():
        problems.append(f"the default model's GGUF {gguf} is missing")
    unknown = [m for m in args.model if m not in PINNED]
    if unknown:
        problems.append(f"--model {', '.join(unknown)}: not a pinned model (one of {', '.join(PINNED)})")
    if problems:
        raise SystemExit("cannot write the bundle: " + "; ".join(problems) + " (run scripts/setup.sh first)")
    try:
        models = {m: fetch_gguf(PINNED[m]) for m in args.model}   # checked against its pin; fetched if missing
    except PinError as e:
        raise SystemExit(f"cannot write the bundle: {e}") from None
    files = task_files(args.tasks)
    sdists, test_pins = tasks_needs(files)
    with tempfile.TemporaryDirectory(prefix="rlvr-bundle-") as tmp:
        stage = Path(tmp)
        log(f"wheels for Python {args.python}: the sandbox lock, {len(test_pins)} test pin(s), pip, "
            f"{', '.join(PROJECT_WHEELS)}")
        download_wheels(lock_pins(SANDBOX_LOCK) + test_pins + [f"pip=={_installed_version('pip')}"],
                        stage / "wheels", args.python)
        download_wheels([f"{d}=={_installed_version(d)}" for d in PROJECT_WHEELS], stage / "project-wheels",
                        args.python)
        (stage / "sdists").mkdir()
        for name, s in sorted(sdists.items()):
            fetch_sdist(name, s["url"], s["sha256"], stage / "sdists")
        log(f"{len(sdists)} sdist(s) from {len(files)} task file(s)")
        (stage / "locks").mkdir()
        shutil.copyfile(SANDBOX_LOCK, stage / "locks" / "sandbox.lock")
        members = {"bin/bwrap": Path(bwrap), "bin/node": Path(os.path.realpath(node)), "pi": pi_dir,
                   "wheels": stage / "wheels", "project-wheels": stage / "project-wheels",
                   "sdists": stage / "sdists", f"gguf/{gguf.name}": gguf, "locks": stage / "locks",
                   **{f"gguf/{path.name}": path for path in models.values()}}
        meta = {"python": args.python, "machine": platform.machine(), "pi_lock_sha256": _sha256(PI_LOCK),
                "sandbox_lock_sha256": _sha256(SANDBOX_LOCK), "task_files": [str(f.relative_to(ROOT)) for f in files],
                "test_pins": test_pins, "sdists": sorted(sdists), "models": sorted(models)}
        log(f"archiving into {out} (chunks of at most {args.chunk_mib} MiB)")
        manifest = write_chunked(members, out, NAME, args.chunk_mib * MIB, meta, preset=args.preset)
    total = sum(c["bytes"] for c in manifest["chunks"])
    log(f"wrote {len(manifest['chunks'])} chunk(s), {total / MIB:.1f} MiB, in {time.time() - t0:.0f} s: "
        f"{out}/{NAME}.manifest.json")


def _python_for(version: str, given: str | None) -> str:
    """The interpreter the sandbox venv is made from: given, else python{version} on the PATH or in /usr/bin;
    its version must be the bundle's (its wheels are built for it)."""
    candidates = [given] if given else [f"/usr/bin/python{version}", shutil.which(f"python{version}") or ""]
    for c in candidates:
        if c and Path(c).exists():
            got = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            if got != version:
                raise SystemExit(f"{c} is Python {got}; this bundle's wheels are for Python {version} "
                                 f"(write one with --python {got})")
            return c
    raise SystemExit(f"no python{version} found for the sandbox venv; pass --python PATH")


def _replace(src: Path, dest: Path) -> None:
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))


def _on_path(binary: str, source: Path) -> None:
    """node and bwrap are found by PATH, and node also runs inside the sandbox, which binds /usr but
    not RLVR_HOME: where none is on the PATH yet, the binary is copied (not linked) into /usr/local/bin."""
    if shutil.which(binary):
        return
    dest = Path("/usr/local/bin") / binary
    if os.access(dest.parent, os.W_OK):
        shutil.copy2(source, dest)
        os.chmod(dest, 0o755)
    else:
        log(f"{binary} is not on PATH: copy {source} into a folder under /usr that is on PATH")


def install_sandbox_python(home: Path, python: str, lock: Path) -> Path:
    """A world-readable venv from `python` with exactly the lock's pins, from the bundled wheels."""
    sbx, wheels = home / "sandbox-venv", home / "wheels"
    subprocess.run([python, "-m", "venv", "--clear", "--without-pip", str(sbx)], check=True)
    pip_wheel = sorted(wheels.glob("pip-*.whl"))[-1]
    base = [str(sbx / "bin" / "python"), f"{pip_wheel}/pip", "install", "-q", "--disable-pip-version-check",
            "--no-index", "--find-links", str(wheels), "--no-deps", "--isolated"]
    subprocess.run([*base, str(pip_wheel), *lock_pins(lock)], check=True)
    # the venv's own pip (envs/testdeps.py's overlays) installs from the bundle, never an index
    (sbx / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {wheels}\n"
                                  f"disable-pip-version-check = true\n")
    (sbx / ".setup-done").write_text(_sha256(lock) + "\n")   # setup.sh's stamp: the lock this venv holds
    return sbx


def install_project_wheels(wheels: Path, site: str | None) -> None:
    """gguf and the like into this interpreter's environment (or `site`, pip --target), unless importable."""
    missing = [w for w in sorted(wheels.glob("*.whl"))
               if site or subprocess.run([sys.executable, "-c", f"import {w.name.split('-')[0]}"],
                                         capture_output=True).returncode != 0]
    if not missing:
        return
    target = ["--target", site] if site else []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--isolated", *target, *map(str, missing)], check=True)
    log(f"project wheels into {site or sys.prefix}: {', '.join(w.name for w in missing)}")


def cmd_install(args) -> None:
    t0 = time.time()
    src = Path(args.dir).resolve()
    home = paths.rlvr_home().resolve()
    if home == Path("/tmp") or Path("/tmp") in home.parents:
        raise SystemExit(f"RLVR_HOME={home} is under /tmp, which the sandbox replaces with a private /tmp of its own: "
                         f"its Python would not be there; choose another RLVR_HOME")
    try:
        manifest = read_manifest(src, NAME)
        meta = manifest["meta"]
        if meta.get("machine") != platform.machine():
            raise SystemExit(f"the bundle is for {meta.get('machine')}, this host is {platform.machine()}")
        python = _python_for(meta["python"], args.python)
        stage = home / ".bundle-staging"
        shutil.rmtree(stage, ignore_errors=True)
        log(f"verifying {len(manifest['chunks'])} chunk(s) and unpacking into {stage}")
        extract_chunked(src, NAME, stage)
    except ChunkError as e:
        raise SystemExit(f"[bundle] refused: {e}") from None
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for binary in ("bwrap", "node"):
        _replace(stage / "bin" / binary, home / "bin" / binary)
        os.chmod(home / "bin" / binary, 0o755)
        _on_path(binary, home / "bin" / binary)
    _replace(stage / "pi", home / "pi")
    _replace(stage / "wheels", home / "wheels")
    _replace(stage / "project-wheels", home / "wheels" / "project")
    for part, dest in (("sdists", paths.cache_dir() / "sdists"), ("gguf", paths.cache_dir() / "gguf")):
        dest.mkdir(parents=True, exist_ok=True)
        for f in (stage / part).iterdir():
            _replace(f, dest / f.name)
    log(f"sandbox Python from {python}")
    install_sandbox_python(home, python, stage / "locks" / "sandbox.lock")
    install_project_wheels(home / "wheels" / "project", args.site)
    shutil.rmtree(stage)
    subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)
    (home / STAMP).write_text(_sha256(src / f"{NAME}.manifest.json") + "\n")   # setup.sh --offline: done
    log(f"installed into {home} and {paths.cache_dir()} in {time.time() - t0:.0f} s "
        f"(pi, node, bwrap, sandbox Python {meta['python']}, {len(meta['sdists'])} sdists, the default model's GGUF"
        + "".join(f", {m}'s GGUF" for m in meta.get("models", [])) + ")")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.bundle", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the bundle folder (a set-up machine with registries)")
    w.add_argument("dir")
    w.add_argument("--python", default="3.12", help="the host's Python version the wheels are for (default 3.12)")
    w.add_argument("--chunk-mib", type=int, default=60, help="largest chunk, MiB (default 60)")
    w.add_argument("--preset", type=int, default=6, choices=range(10), metavar="0-9",
                   help="xz preset (default 6; 0 writes ~5x faster, ~15%% larger)")
    w.add_argument("--tasks", nargs="+", default=["configs/tasks/*.jsonl"], help="task files whose sdists to carry")
    w.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="also carry this pinned model's joined GGUF (e.g. qwen2.5-coder-1.5b, 1.1 GB; repeatable)")
    i = sub.add_parser("install", help="install a bundle folder (the host without registries)")
    i.add_argument("dir")
    i.add_argument("--python", help="interpreter for the sandbox venv (default: python<bundle version>)")
    i.add_argument("--site", help="install the project's own wheels (gguf) into this folder (pip --target) "
                                  "instead of this interpreter's environment")
    args = p.parse_args()
    {"write": cmd_write, "install": cmd_install}[args.cmd](args)


if __name__ == "__main__":
    main()
