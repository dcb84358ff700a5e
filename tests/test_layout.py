"""The code's shape: no import cycle between seqtrain's modules (module-level imports), thin CLIs, and no
module over ~500 lines without its docstring saying why."""

import ast
import pathlib

from tests.utils import REPO

PACKAGES = ("seqtrain", "seqtrain_cli")


def _modules() -> dict:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(name: str, path: pathlib.Path, known: set) -> set:
    """Modules of ours that `name` imports at module level (imports inside functions run later and cannot make
    an import cycle at import time; `if TYPE_CHECKING:` blocks never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is the package's job, not a cycle between peers
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, cycles


def test_clis_are_thin():
    """Each seqtrain_cli module parses and calls one library function: a few dozen lines, no loops of its own."""
    for path in sorted((REPO / "seqtrain_cli").glob("*.py")):
        if path.name.startswith("_"):
            continue  # _main.py: the one wrapper every entry point shares (error lines, exit codes)
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 60, path.name
        tree = ast.parse(text)
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))], path.name


def test_long_modules_say_why():
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 520:
            doc = ast.get_docstring(ast.parse(text)) or ""
            assert "Why one module" in doc, (
                f"{name} has {len(text.splitlines())} lines and no 'Why one module' note"
            )
