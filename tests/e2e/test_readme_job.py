"""The README's job-submit block, run as written on a fresh copy of the checkout: the job
must succeed. The block is run in its own network, PID and mount namespaces (root only), so
its fixed ports, its /tmp/ray and its `ray` processes meet nothing else on the machine."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- job-submit:"


def readme_job_block(readme: str) -> str:
    """The ```bash block that follows the job-submit marker comment."""
    after = readme.split(MARKER, 1)
    if len(after) != 2:
        raise AssertionError(f"README.md has no {MARKER!r} comment before its job-submit block")
    match = re.search(r"```bash\n(.*?)```", after[1], re.S)
    assert match, "no ```bash block after the job-submit marker"
    return match.group(1)


def fresh_checkout(dest: Path) -> Path:
    """What a clone of this working tree holds (tracked and unignored files), with `.venv`
    as the set-up command leaves it (here: links into the venv the tests run in)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    venv = dest / ".venv"  # a real folder, so .gitignore keeps it out of the job's upload
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        (venv / entry.name).symlink_to(entry)
    return dest


def test_readme_block_names_the_venv_and_enough_cpus():
    block = readme_job_block((REPO / "README.md").read_text())
    commands = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    programs = [next(w for w in c.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)) for c in commands]
    assert all(p.startswith((".venv/bin/", "$PWD/.venv/bin/")) for p in programs), commands
    assert "--num-cpus=" in block and "configs/length.yaml" in block


@pytest.mark.heavy
def test_readme_job_submit_block_runs_as_written(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to give the block its own network and /tmp/ray")
    block = readme_job_block((REPO / "README.md").read_text())
    clone = fresh_checkout(tmp_path / "agentic-rlvr")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlvr-readme-ray-", dir="/tmp"))  # short: Ray's socket paths
    Path("/tmp/ray").mkdir(exist_ok=True)  # the mount point of the namespace's own /tmp/ray
    status_py = ("from ray.job_submission import JobSubmissionClient as C; "
                 "print('JOBS', [j.status.value for j in C('http://127.0.0.1:8265').list_jobs()])")
    script = "\n".join([
        "set -e", "ip link set lo up", f"mount --bind {ray_tmp} /tmp/ray", f"cd {clone}",
        "set +e", block, "rc=$?", "set -e",
        f".venv/bin/python -c \"{status_py}\"", ".venv/bin/ray stop --force >/dev/null 2>&1 || true", "exit $rc"])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    try:
        res = subprocess.run(["unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc",
                              "bash", "-c", script], env=env, capture_output=True, text=True, timeout=1500)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = res.stdout + res.stderr
    print(out[-6000:])
    assert res.returncode == 0, out[-6000:]
    assert "JOBS ['SUCCEEDED']" in out, out[-6000:]
    metrics = (clone / "runs" / "length" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 6  # configs/length.yaml's trainer.steps
