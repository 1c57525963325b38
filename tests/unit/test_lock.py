"""The venv the tests run in is exactly the lock (what `make setup` installed), and the lock
tool's messages are clear."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCK_PY = REPO / "scripts" / "lock.py"


def run_lock(*args):
    return subprocess.run([sys.executable, str(LOCK_PY), *args], capture_output=True, text=True)


def test_this_venv_is_exactly_the_cpu_lock():
    if not (Path(sys.prefix) / ".setup-done").exists():
        pytest.skip("not the venv scripts/setup.sh made")
    res = run_lock("check", "--python", sys.executable, str(REPO / "requirements" / "cpu.lock"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "installed exactly as locked" in res.stdout


def test_every_lock_line_is_pinned_with_a_hash():
    for lock in (REPO / "requirements").glob("*.lock"):
        entries = [e for e in lock.read_text().replace("\\\n", " ").splitlines()
                   if e.strip() and not e.startswith("#")]
        assert entries, lock
        for e in entries:
            assert "==" in e and "--hash=sha256:" in e, f"{lock.name}: {e}"


def test_check_names_every_difference(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("pytest==0.0.1 \\\n    --hash=sha256:00\nno-such-dist==1.0 --hash=sha256:00\n")
    res = run_lock("check", "--python", sys.executable, str(lock))
    assert res.returncode == 1
    assert "pytest: locked 0.0.1, installed" in res.stdout
    assert "no-such-dist: locked 1.0, installed (missing)" in res.stdout
    assert "not in the lock" in res.stdout          # everything else this venv has


def test_malformed_lock_line_is_named(tmp_path):
    lock = tmp_path / "bad.lock"
    lock.write_text("# header\npytest>=8\n")
    res = run_lock("check", "--python", sys.executable, str(lock))
    assert res.returncode != 0 and "bad.lock:2" in res.stderr + res.stdout
