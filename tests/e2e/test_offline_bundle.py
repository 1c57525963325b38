"""The offline bundle end to end: written from this machine's set-up, installed into a fresh
prefix as a host without registries would (`scripts/setup.sh --offline`), and used there: pi
and node run from it, and the sandbox Python it built scores a real task's original body 1.0
and its stub below, with the test overlay installed from the bundle's wheels alone. A chunk
whose hash is wrong is refused by name before anything is installed."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rl.chunked import ChunkError, verify_chunks

REPO = Path(__file__).resolve().parents[2]
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the sandbox needs root and bubblewrap (scripts/setup.sh)")


def _clean_env(prefix: Path) -> dict:
    """This machine's registries out of reach of pip (no PIP_* settings), the prefix as the host's homes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(RLVR_HOME=str(prefix / "home"), XDG_CACHE_HOME=str(prefix / "cache"), PYTHONPATH=str(REPO))
    return env


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle")
    subprocess.run([sys.executable, "-m", "scripts.bundle", "write", str(out), "--python", PY, "--preset", "0",
                    "--chunk-mib", "40", "--tasks", "configs/tasks/toolz-mutation.jsonl"], cwd=REPO, check=True)
    return out


@pytest.fixture
def host_prefix():
    """A fresh prefix that sandbox uids can enter (pytest's tmp_path is mode 0700) and that is not
    under /tmp (the sandbox mounts a private /tmp over it)."""
    prefix = Path(tempfile.mkdtemp(prefix="rlvr-offline-host-", dir="/var/tmp"))
    prefix.chmod(0o755)
    yield prefix
    shutil.rmtree(prefix, ignore_errors=True)


def test_a_chunk_with_a_wrong_hash_is_refused_by_name_and_nothing_is_installed(bundle, tmp_path, host_prefix):
    damaged = tmp_path / "damaged"
    shutil.copytree(bundle, damaged)
    chunk = damaged / "bundle.tar.xz.001"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(ChunkError, match="bundle.tar.xz.001"):
        verify_chunks(damaged, "bundle")
    prefix = host_prefix
    r = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(damaged)], cwd=REPO, env=_clean_env(prefix),
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "refused" in r.stderr + r.stdout and "bundle.tar.xz.001" in r.stderr + r.stdout, r.stderr[-2000:]
    assert not (prefix / "home" / "pi").exists() and not (prefix / "home" / "sandbox-venv").exists()


def test_a_bundle_installs_into_a_fresh_prefix_and_its_sandbox_scores_a_real_task(bundle, host_prefix):
    manifest = json.loads((bundle / "bundle.manifest.json").read_text())
    assert manifest["meta"]["machine"] == platform.machine() and manifest["meta"]["python"] == PY
    assert len(manifest["chunks"]) >= 2 and all(c["bytes"] <= 40 << 20 for c in manifest["chunks"])
    prefix = host_prefix
    env = _clean_env(prefix)
    r = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(bundle)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    home = prefix / "home"
    node = home / "bin" / "node"
    version = subprocess.run([str(node), str(home / "pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"),
                              "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.returncode == 0 and (version.stdout + version.stderr).strip() == \
        json.loads((REPO / "scripts/pi/package-lock.json").read_text())[
            "packages"]["node_modules/@mariozechner/pi-coding-agent"]["version"]
    assert (home / "sandbox-venv" / ".setup-done").read_text().strip() == \
        subprocess.run(["sha256sum", str(REPO / "requirements/sandbox.lock")], capture_output=True,
                       text=True).stdout.split()[0]
    # the sandbox Python of the prefix runs a toolz task's tests; its test overlay (pycodestyle) comes
    # from the bundle's wheels: the venv's pip may reach no index
    script = """
from envs.tasks import load_tasks
from tests.fixtures.env import episode, replace_body
[task] = [t for t in load_tasks("configs/tasks/toolz-mutation.jsonl") if t.test_deps][:1]
with episode(task, sandbox_uid_base=64700) as env:
    replace_body(env, task.original_body)
    good = env.reward()
with episode(task, sandbox_uid_base=64700) as env:
    stub = env.reward()
print(good, stub)
print(good.reward, stub.reward)
"""
    scored = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    good, stub = map(float, scored.stdout.split()[-2:])
    assert good == 1.0 and stub < 1.0, scored.stdout
    assert (home / "testdeps").is_dir() and any((home / "testdeps").iterdir())
    again = subprocess.run(["bash", "scripts/setup.sh", "--offline", str(bundle)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already installed" in again.stdout, again.stdout[-2000:]
