"""A library's test dependencies in a read-only overlay of the sandbox Python.

The sandbox Python is locked (requirements/sandbox.lock) and shared by every task, so a
library's own needs (its runtime requirements, and what its tests import, e.g. freezegun) go
into a per-library directory instead: `pip install --target`, root-owned and world-readable,
bound read-only into the sandbox and put on PYTHONPATH after the verifier's plugin. The
overlay never holds a distribution the sandbox lock pins (those stay the locked ones).

Where the requirements come from, in the sdist: PKG-INFO's Requires-Dist (runtime, plus the
`test`/`tests`/`testing` extras, or `dev` when none of those exists), pyproject.toml's
optional dependencies and dependency groups of those names, and requirements files named for
tests. A task records the overlay's exact pins (`Task.test_deps`), and the environment and
the reward rebuild the same overlay from them.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Callable

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envs.sandbox import sandbox_python_dir
from rl import paths

TEST_EXTRAS = ("test", "tests", "testing")
FALLBACK_EXTRAS = ("dev",)
REQUIREMENT_FILES = ("requirements-test.txt", "requirements-tests.txt", "requirements_test.txt",
                     "test-requirements.txt", "test_requirements.txt", "tests/requirements.txt",
                     "requirements/test.txt", "requirements/tests.txt", "requirements/testing.txt")
# development tools that tests do not import: never worth installing into the overlay
NOT_FOR_TESTS = {"tox", "nox", "mypy", "black", "ruff", "flake8", "pylint", "isort", "pre-commit", "twine",
                 "build", "wheel", "codecov", "coveralls", "check-manifest", "bump2version", "pyright",
                 "sphinx", "furo", "mkdocs", "ipython", "ipdb", "pytest-xdist", "pytest-benchmark",
                 "pytest-randomly", "pytest-sugar", "pytest-mypy", "pytest-flake8", "types-setuptools"}
SANDBOX_LOCK = Path(__file__).resolve().parent.parent / "requirements" / "sandbox.lock"


@dataclass(frozen=True)
class Overlay:
    path: Path               # host directory, bound at envs.sandbox.INSIDE_SITE
    pins: tuple[str, ...]    # "name==version" of every distribution in it


def cache_dir() -> Path:
    """Under RLVR_HOME, beside the sandbox Python: sandbox uids cannot enter the user's cache."""
    return paths.rlvr_home() / "testdeps"


def locked_names() -> set[str]:
    """Distributions the sandbox Python pins: the overlay leaves them alone."""
    text = SANDBOX_LOCK.read_text() if SANDBOX_LOCK.is_file() else ""
    return {canonicalize_name(m) for m in re.findall(r"^([A-Za-z0-9][\w.-]*)==", text, re.M)}


def _pins_of_lock() -> list[str]:
    text = SANDBOX_LOCK.read_text() if SANDBOX_LOCK.is_file() else ""
    return re.findall(r"^([A-Za-z0-9][\w.-]*==[^\s\\]+)", text, re.M)


def _usable(req: str, extra: str | None) -> Requirement | None:
    try:
        r = Requirement(req)
    except InvalidRequirement:
        return None
    if r.marker is not None:
        env = dict(default_environment(), extra=extra or "")
        if not r.marker.evaluate(env):
            return None
    return r


def declared(tree: Path) -> tuple[list[str], list[str]]:
    """(requirements, where each group came from) declared by the sdist at `tree`."""
    found: dict[str, list[str]] = {}
    pkg_info = tree / "PKG-INFO"
    own = None
    if pkg_info.is_file():
        meta = Parser().parsestr(pkg_info.read_text(errors="replace"), headersonly=True)
        own = canonicalize_name(meta.get("Name", "")) or None
        extras = set(meta.get_all("Provides-Extra") or [])
        use = [e for e in TEST_EXTRAS if e in extras] or [e for e in FALLBACK_EXTRAS if e in extras]
        for req in meta.get_all("Requires-Dist") or []:
            for extra in [None, *use]:
                r = _usable(req, extra)
                if r is not None:
                    r.marker = None
                    found.setdefault(f"PKG-INFO Requires-Dist{f' [{extra}]' if extra else ''}", []).append(str(r))
                    break
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(errors="replace"))
        except tomllib.TOMLDecodeError:
            data = {}
        project = data.get("project", {})
        own = own or canonicalize_name(project.get("name", "")) or None
        for table, label in ((project.get("optional-dependencies", {}), "optional-dependencies"),
                             (data.get("dependency-groups", {}), "dependency-groups")):
            names = [e for e in TEST_EXTRAS if e in table] or [e for e in FALLBACK_EXTRAS if e in table]
            for name in names:
                reqs = [r for r in table[name] if isinstance(r, str)]
                if reqs:
                    found[f"pyproject.toml {label}.{name}"] = reqs
        if not pkg_info.is_file() and project.get("dependencies"):
            found["pyproject.toml dependencies"] = list(project["dependencies"])
    for rel in REQUIREMENT_FILES:
        f = tree / rel
        if f.is_file():
            reqs = [ln.split("#")[0].strip() for ln in f.read_text(errors="replace").splitlines()]
            found[rel] = [r for r in reqs if r and not r.startswith(("-", "."))]
    skip = locked_names() | {canonicalize_name(n) for n in NOT_FOR_TESTS} | ({own} if own else set())
    reqs: dict[str, str] = {}
    for group in found.values():
        for req in group:
            r = _usable(req, None)
            if r is None or canonicalize_name(r.name) in skip or r.url:
                continue
            r.extras = set()
            reqs.setdefault(canonicalize_name(r.name), str(r))
    return sorted(reqs.values()), sorted(found)


def _pip(args: list[str], log: Callable[[str], None]) -> None:
    py = sandbox_python_dir() / "bin" / "python"
    exe = str(py) if (sandbox_python_dir() / "bin" / "pip").exists() else sys.executable
    cmd = [exe, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input", *args]
    log(f"[testdeps] pip install {' '.join(args[2:])}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"installing test dependencies failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _installed(target: Path) -> list[str]:
    pins = []
    for info in sorted(target.glob("*.dist-info")):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"), headersonly=True)
        pins.append(f"{canonicalize_name(meta['Name'])}=={meta['Version']}")
    return sorted(pins)


def _drop_locked(target: Path) -> None:
    """Remove distributions the sandbox lock pins (pulled in as dependencies), by their RECORD."""
    locked = locked_names()
    for info in list(target.glob("*.dist-info")):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"), headersonly=True)
        if canonicalize_name(meta["Name"]) not in locked:
            continue
        record = info / "RECORD"
        for line in (record.read_text().splitlines() if record.is_file() else []):
            p = target / line.split(",")[0]
            if p.is_file() and target in p.resolve().parents:
                p.unlink()
        shutil.rmtree(info, ignore_errors=True)
    for root, dirs, files in os.walk(target, topdown=False):
        if not dirs and not files and Path(root) != target:
            os.rmdir(root)


def _seal(staging: Path, pins: list[str]) -> Path:
    """Move a finished overlay to its content-addressed place, world-readable, root-owned."""
    for root, dirs, files in os.walk(staging):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    os.chmod(staging, 0o755)
    (staging / ".pins").write_text("\n".join(pins) + "\n")
    dest = cache_dir() / hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]
    if (dest / ".pins").is_file():
        shutil.rmtree(staging)
        return dest
    try:
        staging.rename(dest)
    except OSError:          # another process finished first
        shutil.rmtree(staging)
    return dest


def _staging() -> Path:
    cache_dir().mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir(), 0o755)
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_dir()))


def overlay_for_sdist(tree: Path, extra: tuple[str, ...] | list[str] = (),
                      log: Callable[[str], None] = print) -> Overlay | None:
    """Resolve and install the sdist's declared test dependencies plus `extra`; None if there are none."""
    reqs, sources = declared(tree)
    skip = locked_names()
    reqs += [r for r in extra if canonicalize_name(Requirement(r).name) not in skip]
    if not reqs:
        return None
    log(f"[testdeps] {tree.name}: {', '.join(reqs)} (from {', '.join(sources) or 'the command line'})")
    resolved = cache_dir() / f"resolved-{hashlib.sha256(chr(10).join(sorted(reqs)).encode()).hexdigest()[:16]}"
    if resolved.is_file():   # these requirements were resolved before: reuse that overlay
        pins = resolved.read_text().split()
        found = overlay_for(pins)
        log(f"[testdeps] overlay {found.path.name} (resolved before): {', '.join(pins)}")
        return found
    staging = _staging()
    constraints = staging.parent / f"{staging.name}.constraints"
    try:
        constraints.write_text("\n".join(_pins_of_lock()) + "\n")
        _pip(["--target", str(staging), "-c", str(constraints), *reqs], log)
        _drop_locked(staging)
        pins = _installed(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        constraints.unlink(missing_ok=True)
    path = _seal(staging, pins)
    resolved.write_text("\n".join(pins) + "\n")
    log(f"[testdeps] overlay {path.name}: {', '.join(pins)}")
    return Overlay(path, tuple(pins))


def overlay_for(pins: list[str] | tuple[str, ...]) -> Overlay | None:
    """The overlay with exactly these pins (a task's `test_deps`), installed once and cached."""
    if not pins:
        return None
    pins = sorted(pins)
    dest = cache_dir() / hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]
    if not (dest / ".pins").is_file():
        staging = _staging()
        try:
            _pip(["--target", str(staging), "--no-deps", *pins], lambda _: None)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        dest = _seal(staging, pins)
    return Overlay(dest, tuple(pins))
