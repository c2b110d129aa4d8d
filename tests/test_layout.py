"""The code's layout: no source file grows past what one person reads in a sitting, and no two
files import each other, directly or around a circle. A circle makes the import order decide
which names exist yet, and it means neither file can be read, tested or moved without the
other.

Every import counts: the ones inside functions and under TYPE_CHECKING too, since they still
tie the two files together (a type-checker and a reader follow them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("raft", "storage", "recovery", "sparkio", "bench")
MAX_LINES = 600


def source_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """Every non-test .py file under the packages."""
    files = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            if "__pycache__" in rel.parts or "tests" in rel.parts or path.name.startswith("test_"):
                continue
            files.append(path)
    return files


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = ROOT,
                 packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """File -> the files it imports (paths relative to root, '/'-separated). Imports of anything
    outside the packages are left out."""
    files = source_files(root, packages)
    by_module = {module_name(f, root): f.relative_to(root).as_posix() for f in files}

    def resolve(name: str) -> str | None:
        """The file of module `name`, or of its nearest enclosing module (`import a.b.c` where
        only a.b is ours cannot happen for modules, but `a.b.SomeName` can)."""
        while name:
            if name in by_module:
                return by_module[name]
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {}
    for path in files:
        rel = path.relative_to(root).as_posix()
        here = module_name(path, root)
        # The package a relative import starts from: a package's __init__ is in the package.
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import module` imports the module's file; `from module import name`
                # (or *) the module's.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in by_module else base
                         for alias in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target is not None and target != rel:
                    targets.add(target)
        graph[rel] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that ends where it starts) for each group of files that import each
    other (each strongly connected component of more than one file; Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        # Iterative, so a deep import chain cannot hit the recursion limit.
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(component, graph) for component in components]


def _cycle_in(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first file back to itself (breadth-first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in {sorted(component)}")  # Tarjan said there is one


def test_no_source_file_is_too_long() -> None:
    too_long = {}
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            too_long[rel] = lines
    assert not too_long, (f"over {MAX_LINES} lines (split them by concern): "
                          + ", ".join(f"{p} ({n})" for p, n in sorted(too_long.items())))


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the import graph looks empty: did the package layout move?"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between files:\n" + "\n".join(
        "  " + " -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_sees_cycles(tmp_path: Path) -> None:
    """The checker itself: a circle through a relative import, a `from pkg import module` and
    an import inside a function under TYPE_CHECKING is found; the same files without it are
    not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.c import C\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg.sub.c import C\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nclass C: ...\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg/a.py"] == {"pkg/sub/b.py"}
    assert graph["pkg/sub/__init__.py"] == {"pkg/sub/c.py"}
    assert find_cycles(graph) == [["pkg/a.py", "pkg/sub/b.py", "pkg/sub/c.py", "pkg/a.py"]]

    (pkg / "sub" / "c.py").write_text("class C: ...\n")
    assert find_cycles(import_graph(tmp_path, ("pkg",))) == []


PATH_REF = re.compile(r"(?<![\w./-])((?:raft|storage|recovery|sparkio|bench|tests|docs)/[\w./-]*\w)")


def dead_path_references(root: Path = ROOT) -> dict[str, list[str]]:
    """Repository paths named in code, comments and docs that do not exist (a file moved and
    its mentions did not follow): path -> where it is named."""
    texts = [p for p in root.rglob("*") if p.suffix in (".py", ".md", ".toml")
             and not ({".venv", ".git", "__pycache__", "node_modules"} & set(p.parts))
             and "bench-results" not in p.parts]
    dead: dict[str, list[str]] = {}
    for path in texts:
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in PATH_REF.finditer(line):
                ref = m.group(1).rstrip(".")
                if not (root / ref).exists() and not (root / ref).with_suffix(".py").exists():
                    dead.setdefault(ref, []).append(f"{rel}:{n}")
    return dead


def test_every_path_named_in_code_and_docs_exists() -> None:
    dead = dead_path_references()
    assert not dead, "paths named but missing (moved? update the mention):\n" + "\n".join(
        f"  {ref}  (named in {', '.join(where[:3])})" for ref, where in sorted(dead.items()))


def test_the_path_check_sees_a_dead_reference(tmp_path: Path) -> None:
    (tmp_path / "raft").mkdir()
    here, gone = "/".join(("raft", "a.py")), "/".join(("raft", "gone.py"))  # not named here
    (tmp_path / "raft" / "a.py").write_text(f'"""See {here} and {gone}."""\n')
    assert dead_path_references(tmp_path) == {gone: [here + ":1"]}
