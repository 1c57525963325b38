"""The differential gate: the candidate against the original, outside the process under test.

Why: the tests run the agent's code in the process that reports their outcome, so a body can
always try to make its own tests pass (a value whose comparison lies, rewritten verifier state)
or fit exactly what they check (a lookup table of the tests' inputs, a body right only for small
inputs). For a mined task the original implementation is known: the gate calls the candidate
and the original on the same plain-data arguments, each in a fresh sandboxed process of its own
(another uid, nothing shared with the test run), and compares what they return as canonical
text (envs/gate_sandbox/rlvr_gate.py), never with `==` on the candidate's objects.

Its inputs, recorded when a task is mined (`annotate`, a task's `gate` field):
  * "calls": the arguments the tests pass to the target (`record`: the suite runs once with the
    recording plugin envs/gate_sandbox/rlvr_record.py), where they are plain data, at most
    MAX_RECORDED of them spread over the tests that made them;
  * "perturbed": arguments derived from those (`perturb`: the same types, other values, and
    containers and strings grown past the sizes the tests use), at most MAX_PERTURBED, kept
    only where the original returns plain data, the same under two hash seeds, in time;
  * "note": why there are none or few (a method's `self`, a callable argument, a result that is
    a library object, a test that runs the function in a subprocess).
The reward (envs/reward.py) is min(the tests' fraction, the fraction of gate inputs on which the
candidate's results are the original's): 1.0 needs both.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from envs.sandbox import Limits, Sandbox
from envs.tasks import Task

GATE_DIR = Path(__file__).resolve().parent / "gate_sandbox"   # the real folder: the sandbox binds it
INSIDE_GATE = "/rlvr/gate"
UID_SHIFT = 100_000       # the two gate sandboxes of uid u run as u + UID_SHIFT and u + 2 * UID_SHIFT
MAX_RECORDED = 12
MAX_PERTURBED = 12
VARIANTS = 4              # perturbed candidates derived from each recorded call
SLOW_MS = 250.0           # an input the original needs longer than this for is not kept
MAX_CALL_BYTES = 16_384   # an encoded input larger than this is not kept
GROW = (60, 120)          # grown containers and strings get this many items (the tests' are smaller)
_MAX_CHANNEL = 32 << 20


def _load_codec():
    spec = importlib.util.spec_from_file_location("rlvr_gate", GATE_DIR / "rlvr_gate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


codec = _load_codec()   # encode/decode/canon: the same code the sandbox runs


def import_root(tree: Path, module_path: str) -> tuple[str, str]:
    """(the folder the module imports from, relative to the tree; its dotted name): the parent of
    the outermost package holding it (`src/cachetools/__init__.py` -> ("src", "cachetools"))."""
    parts = Path(module_path).with_suffix("").parts
    i = len(parts) - 1
    while i > 0 and (tree.joinpath(*parts[:i]) / "__init__.py").is_file():
        i -= 1
    return "/".join(parts[:i]), ".".join(parts[i:]).removesuffix(".__init__")


def gate_calls(task: Task) -> list:
    """The calls the gate makes: the recorded ones, then the perturbed ones."""
    return list(task.gate.get("calls", [])) + list(task.gate.get("perturbed", []))


# --- running one side ------------------------------------------------------------------------
@dataclass
class GateRun:
    records: dict[int, str] = field(default_factory=dict)   # input -> its canonical record (text)
    ms: dict[int, float] = field(default_factory=dict)
    finished: bool = False      # the process wrote a line for every input and exited 0
    error: str | None = None
    seconds: float = 0.0


def run_gate(sandbox: Sandbox, tree: Path, module_path: str, qualname: str, calls: list, timeout_s: float,
             hash_seed: int = 0) -> GateRun:
    """One fresh sandboxed process calls the function of `tree` on every call; its records."""
    root, module = import_root(tree, module_path)
    request = json.dumps({"root": f"/repo/{root}".rstrip("/"), "module": module, "qualname": qualname,
                          "calls": calls}).encode()
    req_fd = os.memfd_create("rlvr-gate-request", 0)
    os.write(req_fd, request)
    os.lseek(req_fd, 0, os.SEEK_SET)
    read_fd, write_fd = os.pipe()
    chunks: list[bytes] = []

    def drain() -> None:   # to EOF, a bounded amount kept (the candidate's side is untrusted)
        size = 0
        while True:
            data = os.read(read_fd, 1 << 16)
            if not data:
                return
            size += len(data)
            if size <= _MAX_CHANNEL:
                chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    start = time.monotonic()
    env = {"PYTHONHASHSEED": str(hash_seed), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": INSIDE_GATE,
           "RLVR_GATE_IN": str(req_fd), "RLVR_GATE_OUT": str(write_fd)}
    try:
        res = sandbox.run_argv(["python", "-B", "-S", f"{INSIDE_GATE}/rlvr_gate.py"], timeout_s, env=env,
                               pass_fds=(req_fd, write_fd), extra_ro_binds=[(str(GATE_DIR), INSIDE_GATE)])
    finally:
        os.close(write_fd)
        os.close(req_fd)
    reader.join(timeout=10)
    os.close(read_fd)
    run = GateRun(seconds=time.monotonic() - start)
    seen: dict[int, int] = {}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
            i = int(rec.pop("i"))
            ms = float(rec.pop("ms"))
        except (ValueError, KeyError, TypeError, AttributeError):
            run.error = run.error or f"a line that is not the runner's: {line[:120]!r}"
            continue
        seen[i] = seen.get(i, 0) + 1
        run.records[i] = json.dumps(rec, sort_keys=True)
        run.ms[i] = ms
    for i, n in seen.items():
        if n > 1:   # an input answered twice is answered by no one
            run.records.pop(i, None)
    run.finished = res.exit_code == 0 and len(run.records) == len(calls)
    if not run.finished and run.error is None:
        run.error = ("timed out" if res.timed_out else f"exit {res.exit_code}") + f": {res.output[-600:]}"
    return run


def link_tree(src: Path, dest: Path) -> None:
    """A copy of a pristine tree for the original's side, hard-linked where the file system allows
    (the files are root's and read-only to the sandbox either way), its bytecode kept (the
    original's own: no sandbox of the candidate ever sees this tree). A file to change in it
    is replaced (unlinked first), never written through."""
    def link(s, d):
        try:
            os.link(s, d)
        except OSError:   # another file system: a copy is the same tree
            shutil.copy2(s, d)
    shutil.copytree(src, dest, symlinks=True, copy_function=link)


def replace_module(tree: Path, module_path: str, text: str) -> None:
    """Put `text` in a linked tree's module: a new file (the pristine one untouched), its bytecode gone."""
    module = tree / module_path
    module.unlink()
    module.write_text(text)
    for pyc in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
        pyc.unlink()


# --- comparing the two sides -------------------------------------------------------------
@dataclass
class Verdict:
    inputs: int
    recorded: int
    matched: int = 0
    mismatches: list[dict] = field(default_factory=list)   # the first few: input, kind, both records
    error: str | None = None     # the original's side failed: nothing matched (fail closed)
    seconds: float = 0.0         # the longer side's process (the candidate's when the original's was reused)
    original_reused: bool = False

    @property
    def fraction(self) -> float:
        return self.matched / self.inputs if self.inputs else 1.0

    def summary(self) -> dict:
        shown = [{k: v[:300] if isinstance(v, str) else v for k, v in m.items()} for m in self.mismatches[:3]]
        return {"inputs": self.inputs, "recorded": self.recorded, "matched": self.matched,
                "fraction": round(self.fraction, 4), "mismatches": shown, "error": self.error,
                "seconds": round(self.seconds, 3), "original_reused": self.original_reused}

    def why(self) -> str:
        if self.error:
            return f"the differential gate could not run the original: {self.error[:200]}"
        m = self.mismatches[0] if self.mismatches else {}
        return (f"the differential gate: {self.inputs - self.matched} of {self.inputs} inputs give another result "
                f"than the original's (e.g. {m.get('kind')} input {m.get('input')}: original "
                f"{m.get('original', '')[:80]}, candidate {str(m.get('candidate'))[:80]})")


def compare(original: GateRun, candidate: GateRun, inputs: int, recorded: int) -> Verdict:
    """Input by input, the candidate's record is the original's or it is not (a missing one is not)."""
    v = Verdict(inputs, recorded, seconds=max(original.seconds, candidate.seconds))
    if not original.finished:
        v.error = original.error
        return v
    for i in range(inputs):
        if candidate.records.get(i) == original.records[i]:
            v.matched += 1
        elif len(v.mismatches) < 5:
            v.mismatches.append({"input": i, "kind": "recorded" if i < recorded else "perturbed",
                                 "original": original.records[i], "candidate": candidate.records.get(i)})
    return v


class _Original:
    """One original's run on one task's inputs, shared by every reward that needs it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.run: GateRun | None = None


_ORIGINALS: dict[tuple[str, str, str], _Original] = {}   # (sdist, function, inputs digest) -> its run
_ORIGINALS_LOCK = threading.Lock()
MAX_MEMO = 1024


def original_run(task: Task, pristine: Path, scratch: Path, uid: int, limits: Limits, timeout_s: float,
                 site_overlay: Path | None = None) -> tuple[GateRun, bool]:
    """(the original's run on the task's gate inputs, whether it was there already). It runs once
    per host process and inputs, in a sandbox of uid + UID_SHIFT on a linked copy of the
    pristine tree: its results are the same for every episode of the task (the miner kept only
    inputs it answers the same way twice), so a finished run is kept; a caller that finds it
    running waits for it; a failed one is run again by the next caller."""
    calls = gate_calls(task)
    key = (task.sdist_sha256, task.function_key, hashlib.sha256(json.dumps(calls, sort_keys=True).encode()).hexdigest())
    while True:
        with _ORIGINALS_LOCK:
            entry = _ORIGINALS.get(key)
            mine = entry is None
            if mine:
                if len(_ORIGINALS) >= MAX_MEMO:
                    _ORIGINALS.pop(next(iter(_ORIGINALS)))
                entry = _ORIGINALS[key] = _Original()
        if mine:
            break
        entry.done.wait()
        if entry.run is not None and entry.run.finished:
            return entry.run, True
    tree = scratch / f"gate-original-{uuid.uuid4().hex[:8]}"
    run = GateRun(error="the original's side did not run")
    try:
        link_tree(pristine, tree)
        sb = Sandbox(tree, uid=uid + UID_SHIFT, limits=limits, workdir_readonly=True, site_overlay=site_overlay,
                     max_output_chars=4000)
        run = run_gate(sb, tree, task.module_path, task.qualname, calls, timeout_s)
    except Exception as e:   # the run's failure is its record: the verdict fails closed on it
        run = GateRun(error=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        entry.run = run
        if not run.finished:
            with _ORIGINALS_LOCK:
                _ORIGINALS.pop(key, None)
        entry.done.set()
    return run, False


def prefetch_original(task: Task, pristine: Path, scratch: Path, uid: int, limits: Limits, timeout_s: float,
                      site_overlay: Path | None = None) -> None:
    """Start the original's run now (an episode's environment is built long before its reward: the
    original does not depend on what the agent writes)."""
    if gate_calls(task):
        threading.Thread(target=original_run, args=(task, pristine, scratch, uid, limits, timeout_s, site_overlay),
                         daemon=True).start()


class GateJob:
    """Both sides of one task's gate in threads, started next to the test run, each in a sandbox
    of its own uid (no process of the test run can reach them): the original's run
    (`original_run`, once per host process and inputs) and the candidate's, on the verify tree.
    `wait()` gives the verdict."""

    def __init__(self, task: Task, candidate_tree: Path, pristine: Path, scratch: Path, uid: int, limits: Limits,
                 timeout_s: float, site_overlay: Path | None = None) -> None:
        self.calls = gate_calls(task)
        self.recorded = len(task.gate.get("calls", []))
        self.runs: dict[str, GateRun] = {}
        self.reused = False

        def original() -> None:
            self.runs["original"], self.reused = original_run(task, pristine, scratch, uid, limits, timeout_s,
                                                              site_overlay)

        def candidate() -> None:
            try:
                sb = Sandbox(candidate_tree, uid=uid + 2 * UID_SHIFT, limits=limits, workdir_readonly=True,
                             site_overlay=site_overlay, max_output_chars=4000)
                self.runs["candidate"] = run_gate(sb, candidate_tree, task.module_path, task.qualname, self.calls,
                                                  timeout_s)
            except Exception as e:   # the side's failure is its record: the verdict fails closed on it
                self.runs["candidate"] = GateRun(error=f"{type(e).__name__}: {e}")

        self.threads = [threading.Thread(target=original, daemon=True), threading.Thread(target=candidate, daemon=True)]
        for t in self.threads:
            t.start()

    def wait(self) -> Verdict:
        for t in self.threads:
            t.join()
        missing = GateRun(error="the gate's process did not run")
        candidate = self.runs.get("candidate", missing)
        v = compare(self.runs.get("original", missing), candidate, len(self.calls), self.recorded)
        if self.reused:
            v.seconds, v.original_reused = candidate.seconds, True
        return v


# --- recording the tests' arguments (mining) -------------------------------------------------
def record_command(test_command: list[str]) -> list[str]:
    """The task's test command with the recording plugin instead of the verifier's."""
    return ["rlvr_record" if a == "rlvr_verify" else a for a in test_command]


def record(sandbox: Sandbox, test_command: list[str], targets: dict[str, tuple[str, str]], timeout_s: float,
           per_test_timeout_s: float) -> dict[str, dict]:
    """Run the suite once on the sandbox's tree (the original code) with every target instrumented;
    per target key: {"calls": [[call, test], ...], "seen", "unplain", "instrumented"}."""
    read_fd, write_fd = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 1 << 16), b"")),
                              daemon=True)
    reader.start()
    spec = {"fd": write_fd, "targets": [{"key": k, "path": f"/repo/{m}", "qualname": q}
                                        for k, (m, q) in targets.items()]}
    env = {"PYTHONPATH": INSIDE_GATE, "RLVR_RECORD": json.dumps(spec), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [*record_command(test_command), f"--timeout={per_test_timeout_s:g}", "-p", "no:randomly"]
    try:
        res = sandbox.run_argv(argv, timeout_s, env=env, pass_fds=(write_fd,),
                               extra_ro_binds=[(str(GATE_DIR), INSIDE_GATE)])
    finally:
        os.close(write_fd)
    reader.join(timeout=30)
    os.close(read_fd)
    data = b"".join(chunks)
    if not data:
        raise RuntimeError(f"the recording run wrote no record (exit {res.exit_code}):\n{res.output[-3000:]}")
    return json.loads(data)


# --- perturbed inputs ------------------------------------------------------------------------
def _vary_str(s: str, rng: random.Random) -> str:
    """The same shape of text: digits stay digits, letters letters of the same case."""
    out = []
    for c in s:
        if rng.random() < 0.5:
            if c.isdigit():
                c = rng.choice("0123456789")
            elif c.isalpha() and c.isascii():
                c = rng.choice("abcdefghijklmnopqrstuvwxyz")
                c = c.upper() if s and c.isupper() else c
        out.append(c)
    return "".join(out)


def _distinct(items: list) -> bool:
    try:
        return len(set(items)) == len(items)
    except TypeError:   # unhashable items
        return False


def _ordered_as(new: list, old: list) -> list:
    """Sorted (or reversed) items stay so."""
    try:
        if len(old) > 1 and old == sorted(old):
            return sorted(new)
        if len(old) > 1 and old == sorted(old, reverse=True):
            return sorted(new, reverse=True)
    except TypeError:   # items that do not compare
        pass
    return new


def _another(items: list, rng: random.Random, n: int, depth: int):
    """One more item like `items`' own: an int from a range n wide around theirs (the sign kept),
    else one of them, varied or not."""
    if all(type(x) is int for x in items):
        lo, hi = min(items), max(items)
        return rng.randint(lo - n if lo < 0 else 0, hi + n)
    x = rng.choice(items)
    x = vary(x, rng, False, depth + 1) if rng.random() < 0.6 else x
    if type(x) is str and all(type(y) is str for y in items) and rng.random() < 0.4:
        x += vary(rng.choice(items), rng, False, depth + 1)   # longer words: more distinct ones
    return x


def _grown(items: list, rng: random.Random, depth: int, distinct: bool) -> list:
    """GROW items drawn like `items`' own (distinct when theirs are)."""
    n = rng.randint(*GROW)
    new: list = []
    seen: set = set()
    for _ in range(20 * n):
        if len(new) >= n:
            break
        x = _another(items, rng, n, depth)
        if distinct:
            try:
                if x in seen:
                    continue
                seen.add(x)
            except TypeError:   # a varied item that is not hashable: not one of a set's
                continue
        new.append(x)
    return new


def vary(value, rng: random.Random, grow: bool = False, depth: int = 0):
    """Another value of the same type: other contents, and with `grow` a container or string
    of GROW items (drawn like the value's own, sorted or distinct where those are)."""
    t = type(value)
    if value is None or t is bool or depth > 8:
        return value
    if t is codec.Items:   # a recorded iterator: other items
        return codec.Items(vary(list(value), rng, grow, depth))
    if t is int:
        if grow:
            return value
        new = abs(value) + rng.choice([-1, 1]) * rng.randint(1, max(2, abs(value) // 2))
        return abs(new) if value >= 0 else -abs(new)   # the sign kept (sizes and indices stay >= 0)
    if t is float:
        return round(value * rng.uniform(0.5, 1.5), 4) if value else rng.choice([0.5, 1.5])
    if t is str:
        if grow and value:
            n = rng.randint(*GROW)
            text = "".join(_vary_str(value, rng) for _ in range(n // len(value) + 1))
            return text[:max(n, len(value))]
        return _vary_str(value, rng)
    if t is bytes:
        return vary(value.decode("latin-1"), rng, grow, depth).encode("latin-1")
    if t in (list, tuple, set, frozenset):
        items = list(value)
        distinct = t in (set, frozenset) or (len(items) > 1 and _distinct(items))
        if grow and items:
            new = _grown(items, rng, depth, distinct)
        else:
            new = [vary(x, rng, False, depth + 1) if rng.random() < 0.6 else x for x in items]
            if items and rng.random() < 0.3:
                new.append(_another(items, rng, 2 * len(items), depth))
            if distinct:
                new = list(dict.fromkeys(new)) if _distinct(new) or t in (set, frozenset) else items
        if t in (set, frozenset):
            return t(new)
        return t(_ordered_as(new, items))
    if t is dict:
        keys, vals = list(value), list(value.values())
        new = {k: (vary(v, rng, False, depth + 1) if rng.random() < 0.6 else v) for k, v in value.items()}
        if grow and keys:
            for k in _grown(keys, rng, depth, True):
                new.setdefault(k, _another(vals, rng, len(vals), depth))
        return new
    if t is range:
        stop = value.start + rng.randint(*GROW) * value.step if grow else vary(value.stop, rng)
        return range(value.start, stop, value.step)
    return value


def perturb(call: list, rng: random.Random, n: int = VARIANTS) -> list[list]:
    """`n` calls of the same types as `call` ([args, kwargs], encoded): grown ones and varied ones
    alternately. Some will be invalid for the function; the original's run sorts them out."""
    args, kwargs = codec.decode(call[0], iterators=False), codec.decode(call[1], iterators=False)
    out = []
    for k in range(n):
        grow = k % 2 == 0
        new_args = [vary(a, rng, grow) if grow or rng.random() < 0.7 else a for a in args]
        new_kwargs = {key: vary(v, rng, grow) if grow or rng.random() < 0.7 else v for key, v in kwargs.items()}
        try:
            out.append([codec.encode(new_args), codec.encode(new_kwargs)])
        except codec.NotPlain:   # grown past the size plain data may have
            continue
    return out


# --- annotating tasks --------------------------------------------------------------------------
def _spread_by_test(calls: list[list], n: int) -> list[list]:
    """At most n calls, taken round-robin over the tests that made them (first calls first)."""
    by_test: dict[str, list] = {}
    for call, test in calls:
        by_test.setdefault(test, []).append(call)
    out: list = []
    lanes = list(by_test.values())
    while len(out) < n and any(lanes):
        for lane in lanes:
            if lane and len(out) < n:
                out.append(lane.pop(0))
    return out


def _plain_result(rec: str) -> bool:
    """A record the gate can compare: a result or an exception, plain data all through."""
    def plain(x) -> bool:
        if isinstance(x, list):
            return all(map(plain, x))
        if isinstance(x, dict):
            return "obj" not in x and "big" not in x and all(map(plain, x.values()))
        return True
    data = json.loads(rec)
    return "timeout" not in data and plain(data)


def choose(recorded: dict, key: str, original_runs: Callable[[list], tuple[GateRun, GateRun]]) -> dict:
    """One function's gate inputs from what the recording saw: the recorded calls the original
    answers the same way twice with plain data in time, and perturbed ones that it also returns
    normally on. original_runs(calls) runs the original twice (two hash seeds)."""
    rec = recorded.get(key) or {}
    if not rec.get("instrumented"):
        return {"calls": [], "perturbed": [], "seen": 0,
                "note": "not recorded: the function's module was not imported through the recorder"}
    seen, unplain = rec["seen"], rec["unplain"]
    why_unplain = ", ".join(f"{k} x{v}" for k, v in sorted(unplain.items(), key=lambda kv: -kv[1])[:3])
    calls = [c for c in _spread_by_test(rec["calls"], MAX_RECORDED)
             if len(json.dumps(c)) <= MAX_CALL_BYTES]
    if not calls:
        note = ("the tests never call it in their own process" if not seen else
                f"no call's arguments are plain data ({why_unplain})")
        return {"calls": [], "perturbed": [], "seen": seen, "note": note}
    rng = random.Random(key)
    known = {json.dumps(c, sort_keys=True) for c in calls}
    uniq, origin = [], []   # the perturbed candidates, and the recorded call each came from
    for n, call in enumerate(calls):
        for p in perturb(call, rng):
            text = json.dumps(p, sort_keys=True)
            if text not in known and len(text) <= MAX_CALL_BYTES:
                known.add(text)
                uniq.append(p)
                origin.append(n)
    first, second = original_runs(calls + uniq)
    if not first.finished or not second.finished:
        return {"calls": [], "perturbed": [], "seen": seen,
                "note": f"the original's run failed: {(first.error or second.error or '')[:300]}"}

    def steady(i: int) -> bool:
        r = first.records.get(i)
        return (r is not None and r == second.records.get(i) and _plain_result(r)
                and max(first.ms.get(i, 0), second.ms.get(i, 0)) <= SLOW_MS)

    kept = [c for i, c in enumerate(calls) if steady(i)]
    # round-robin over the calls they came from, grown ones first (perturb alternates them)
    lanes: dict[int, list] = {}
    for j, p in enumerate(uniq):
        if steady(len(calls) + j) and "r" in json.loads(first.records[len(calls) + j]):
            lanes.setdefault(origin[j], []).append(p)
    perturbed: list = []
    while len(perturbed) < MAX_PERTURBED and any(lanes.values()):
        for lane in lanes.values():
            if lane and len(perturbed) < MAX_PERTURBED:
                perturbed.append(lane.pop(0))
    notes = []
    if len(kept) < len(calls):
        notes.append(f"{len(calls) - len(kept)} recorded call(s) dropped (a result that is no plain data, "
                     "differs between runs or is slow)")
    if unplain:
        notes.append(f"{sum(unplain.values())} call(s) not plain data ({why_unplain})")
    if not kept:
        return {"calls": [], "perturbed": [], "seen": seen,
                "note": "no recorded call gives a plain-data result the same way twice; " + "; ".join(notes)}
    return {"calls": kept, "perturbed": perturbed, "seen": seen, "note": "; ".join(notes)}


def annotate(tasks: list[Task], tree: Path, sandbox: Sandbox, timeout_s: float = 600.0,
             per_test_timeout_s: float = 10.0, log: Callable[[str], None] = print) -> dict[str, dict]:
    """Set every task's `gate` (tasks of one library version, `tree` its original code, readable
    by `sandbox`): one recording run of the suite for all their functions, then per function the
    inputs `choose` keeps. Returns function key -> gate."""
    if {(t.library, t.version) for t in tasks} and len({(t.library, t.version) for t in tasks}) != 1:
        raise ValueError("annotate: the tasks must be of one library version")
    functions = {t.function_key: (t.module_path, t.qualname) for t in tasks}
    if not functions:
        return {}
    t0 = time.monotonic()
    recorded = record(sandbox, list(tasks[0].test_command), functions, timeout_s, per_test_timeout_s)
    log(f"[gate] recorded calls of {len(functions)} functions in {time.monotonic() - t0:.0f}s")
    gates = {}
    for key, (module_path, qualname) in functions.items():
        def original_runs(calls, module_path=module_path, qualname=qualname):
            return tuple(run_gate(sandbox, tree, module_path, qualname, calls, 120.0, hash_seed=s) for s in (0, 1))
        gates[key] = choose(recorded, key, original_runs)
    for t in tasks:
        t.gate = gates[t.function_key]
    with_inputs = sum(bool(g["calls"]) for g in gates.values())
    log(f"[gate] {with_inputs} of {len(gates)} functions have gate inputs "
        f"({sum(len(g['perturbed']) for g in gates.values())} perturbed) in {time.monotonic() - t0:.0f}s")
    return gates


def annotate_files(paths: list[Path], work_root: Path, uid: int, timeout_s: float = 900.0,
                   per_test_timeout_s: float = 10.0, log: Callable[[str], None] = print) -> dict:
    """Record the gate inputs of every task of the task files, in place (each library version's
    suite runs once, so a function's inputs are the same in every file that holds it); the
    rest of each record is kept as it was. Returns per file: tasks, with inputs, perturbed."""
    from envs.sdist import tree_for
    from envs.tasks import load_tasks, save_tasks
    from envs.testdeps import overlay_for
    files = {Path(p): load_tasks(p) for p in paths}
    groups: dict[tuple[str, str], list[Task]] = {}
    for tasks in files.values():
        for t in tasks:
            groups.setdefault((t.library, t.version), []).append(t)
    work_root.mkdir(parents=True, exist_ok=True)
    os.chmod(work_root, 0o755)
    for (library, version), tasks in sorted(groups.items()):
        by_key: dict[str, Task] = {}
        for t in tasks:
            by_key.setdefault(t.function_key, t)
        tree = work_root / f"gate-record-{library}-{version}-{os.getpid()}"
        t0 = tasks[0]
        link_tree(tree_for(library, version, t0.sdist_filename, t0.sdist_sha256, t0.sdist_url), tree)
        overlay = overlay_for(t0.test_deps)
        try:
            sb = Sandbox(tree, uid=uid, limits=Limits(cpu_s=int(timeout_s), memory_mib=4096, max_processes=256,
                                                      max_file_mib=256),
                         workdir_readonly=True, max_output_chars=50_000, site_overlay=overlay.path if overlay else None)
            log(f"[gate] {library} {version}: {len(by_key)} functions of {len(tasks)} tasks")
            gates = annotate(list(by_key.values()), tree, sb, timeout_s, per_test_timeout_s, log)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        for t in tasks:
            t.gate = gates[t.function_key]
    summary = {}
    for path, tasks in files.items():
        save_tasks(tasks, path)
        summary[str(path)] = coverage(tasks)
    return summary


def coverage(tasks: list[Task]) -> dict:
    """How much of a task list the gate covers: tasks with inputs, and inputs per task."""
    covered = [t for t in tasks if t.gate.get("calls")]
    rec = sorted(len(t.gate["calls"]) for t in covered)
    per = sorted(len(t.gate.get("perturbed", [])) for t in covered)
    return {"tasks": len(tasks), "with_inputs": len(covered), "annotated": sum(bool(t.gate) for t in tasks),
            "recorded_median": rec[len(rec) // 2] if rec else 0, "perturbed_median": per[len(per) // 2] if per else 0,
            "perturbed_total": sum(per), "with_perturbed": sum(p > 0 for p in per),
            "by_level": {lv: [sum(1 for t in covered if t.level == lv), sum(1 for t in tasks if t.level == lv)]
                         for lv in dict.fromkeys(t.level for t in tasks)}}
