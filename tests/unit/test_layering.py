"""The house is one-way: every project import, at module level or inside a function, points
to the same package or a lower layer, and no module imports itself back through others.

    cli, bench  ->  orchestrator  ->  actors | scaffolds  ->  envs | modeling  ->  rl

actors and scaffolds are one layer but do not import each other (an actor is a process, a
scaffold drives one episode; the orchestrator wires them together). envs (sandboxes, tasks,
the reward) and modeling (torch: kernels, layouts, SFT) are one layer and do not either."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYER = {"cli": 5, "bench": 5, "orchestrator": 4, "actors": 3, "scaffolds": 3, "envs": 2, "modeling": 2, "rl": 1}
SIDEWAYS_OK: set[tuple[str, str]] = set()  # same-layer pairs allowed to import each other: none


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def project_graph() -> dict[str, list[tuple[str, int]]]:
    """module -> project modules it imports (an imported name that is a module counts as one)."""
    files = {module_name(p): p for pkg in LAYER for p in (REPO / pkg).rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        found = imports_of(path.read_text(), mod, path.name == "__init__.py")
        graph[mod] = sorted({(m, line) for m, line in found if m in files and m != mod})
    return graph


def upward_edges(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        src = mod.split(".")[0]
        for target, line in targets:
            dst = target.split(".")[0]
            if src == dst or (src, dst) in SIDEWAYS_OK:
                continue
            if LAYER[dst] >= LAYER[src]:
                bad.append(f"{mod}:{line} imports {target} ({src} may only import lower layers)")
    return bad


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_imports_only_go_down():
    graph = project_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk found the project
    assert upward_edges(graph) == []


def test_no_import_circles():
    assert cycles(project_graph()) == []


def test_the_walk_sees_imports_inside_functions_and_circles():
    src = "def f():\n    from orchestrator.loop import Trainer\n"
    graph = {"rl.x": [(m, line) for m, line in imports_of(src, "rl.x", False) if m == "orchestrator.loop"]}
    assert upward_edges(graph) == ["rl.x:2 imports orchestrator.loop (rl may only import lower layers)"]
    assert cycles({"a": [("b", 1)], "b": [("a", 1)]}) == [["a", "b"]]
    with pytest.raises(AssertionError):
        assert upward_edges({"actors.x": [("scaffolds.y", 3)]}) == []


def test_the_driver_does_not_import_the_engine():
    """`rlvr train`'s own process places actors; vLLM loads in the rollout actor. Importing vLLM's
    request model in the driver cost ~7 s of start-up before any actor started."""
    import subprocess
    import sys
    code = ("import sys, cli.main, cli.train, orchestrator.loop, orchestrator.calibrate; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:300]
