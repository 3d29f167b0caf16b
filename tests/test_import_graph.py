"""The module import graph of hkt_nb has no circle, and the training core (`hkt_nb.train`) imports no benchmark
module (`hkt_nb.lra`). Every import counts, also one inside a function (a lazy import is still a dependency).

Run as a script (`python tests/test_import_graph.py`) it prints the circles it finds and each module's imports."""

import ast
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "hkt_nb"


def module_names(root: Path = LIBRARY) -> dict[str, Path]:
    "Dotted name -> file of every module of the package at `root` (a package's own name for its __init__.py)."
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    "The absolute name of `from <level dots><target> import ...` written in `module`."
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(root: Path = LIBRARY) -> dict[str, set[str]]:
    "Module -> the modules of the package it imports (at module level or inside a function)."
    names = module_names(root)
    package = root.name
    graph = {name: set() for name in names}
    for name, path in names.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            found = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                # `from package import module` imports the module; `from module import name` the module
                found = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names]
            for target in found:
                while target and target not in names:  # `import a.b.c` of a name inside a module: its module
                    target = target.rpartition(".")[0]
                if target and target.split(".")[0] == package and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    "The strongly connected components of more than one module (Tarjan), each sorted: every circle of imports."
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v); on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop(); on_stack.discard(w); component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(1000, 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_cycles_finds_a_known_circle():
    "The detector itself: a -> b -> c -> a is one circle, d -> a none."
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_resolve_relative_imports():
    assert _resolve("hkt_nb.lra.loop", False, 2, "model") == "hkt_nb.model"
    assert _resolve("hkt_nb.lra.loop", False, 1, None) == "hkt_nb.lra"
    assert _resolve("hkt_nb.lra", True, 1, "tasks") == "hkt_nb.lra.tasks"


def test_the_graph_sees_lazy_imports():
    "An import inside a function is an edge: `hkt_nb.lra.runs` imports `hkt_nb.lra.loop` only inside `main`."
    graph = import_graph()
    assert "hkt_nb.model" in graph["hkt_nb.lra.loop"]
    assert "hkt_nb.lra.loop" in graph["hkt_nb.lra.runs"]


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_training_core_imports_no_benchmark_module():
    graph = import_graph()
    core = [name for name in graph if name == "hkt_nb.train" or name.startswith("hkt_nb.train.")]
    assert core, "no hkt_nb.train package"
    offending = {name: sorted(t for t in graph[name] if t == "hkt_nb.lra" or t.startswith("hkt_nb.lra."))
                 for name in core}
    assert {name: found for name, found in offending.items() if found} == {}


if __name__ == "__main__":
    graph = import_graph()
    found = cycles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports; {len(found)} circle(s)")
    for component in found:
        print("circle:", " <-> ".join(component))
        for name in component:
            print(f"  {name} imports {sorted(t for t in graph[name] if t in component)}")
