"""Count a training run's console lines by kind, for captures of the same run side by side.

    python -m bench.console_lines before.txt after.txt [--json docs/results/console/lines.json]

A capture is the run's stdout and stderr together (`make train ARGS=... > x.txt 2>&1`). Kinds:
  error     a line of an ERROR log record or a traceback
  engine    vLLM / Ray / torch output (actor-prefixed lines, log records, warnings)
  progress  the project's own lines: [step ...], [rlvr] ..., progress bars, the final table
  other     anything else (make's echo of the command, set-up lines)
A progress bar redrawn in place (carriage returns) is one line, as a terminal shows it.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|^\s+File \"|Error: |^\s+\^+\s*$")
ENGINE = re.compile(r"^\((\w+) pid=\d+\)|\b(INFO|WARNING|DEBUG)\b \d\d-\d\d|^[IWE]\d{4} |Warning|warn\(|"
                    r"Started a local Ray|ray\.|Loading safetensors|^\[W\d{4}")
PROGRESS = re.compile(r"^\[(step|rlvr)|^step \d+/\d+|\d+/\d+ \[|^-{10,}$|^(run|reward_mean|metrics|plot|trace|"
                      r"checkpoints|actor logs|tensorboard)\s{2,}")


ACTOR = re.compile(r"^\((\w+) pid=\d+\)")


def classify(line: str) -> str:
    line = ANSI.sub("", line)
    from_actor = ACTOR.search(line) is not None
    line = line.split("\r")[-1] or line
    if ERROR.search(line):
        return "error"
    if from_actor:
        return "engine"
    if PROGRESS.search(line):
        return "progress"
    if ENGINE.search(line):
        return "engine"
    return "other"


def count(path: Path) -> dict:
    kinds = {"progress": 0, "engine": 0, "error": 0, "other": 0}
    lines = path.read_bytes().decode(errors="replace").rstrip("\n").split("\n")  # keep \r: it redraws a line
    for line in lines:
        kinds[classify(line)] += 1
    return {"capture": str(path), "lines": len(lines), **kinds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("captures", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="save the table here")
    args = ap.parse_args()
    rows = [count(p) for p in args.captures]
    cols = ("lines", "progress", "engine", "error", "other")
    print(f"{'capture':<48}" + "".join(f"{c:>10}" for c in cols))
    for r in rows:
        print(f"{r['capture'][-48:]:<48}" + "".join(f"{r[c]:>10}" for c in cols))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
