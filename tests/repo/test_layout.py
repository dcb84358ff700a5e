"""The code's shape (docs/design.md, "The floor plan"): imports run one way between the layers, at module level and
inside functions alike, with no circle at any level; an import inside a function says why in a comment; a few
flat modules; thin CLIs; no module over ~500 lines without its docstring saying why."""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.utils import REPO

PACKAGES = ("seqtrain", "seqtrain_cli")

# The layers, top first: a module may import its own layer's modules or lower ones, never a higher layer's.
LAYERS = (
    (
        "entry points",
        ("seqtrain_cli", "seqtrain"),
    ),  # `seqtrain` itself: the public face (Summarizer, load_model)
    (
        "programs",
        (
            "seqtrain.train",
            "seqtrain.generation",
            "seqtrain.preprocess",
            "seqtrain.evaluation",
            "seqtrain.serve",
        ),
    ),
    ("flags", ("seqtrain.flags",)),
    ("checkpoint, tasks, distributed", ("seqtrain.checkpoint", "seqtrain.tasks", "seqtrain.distributed")),
    (
        "components",
        (
            "seqtrain.data",
            "seqtrain.models",
            "seqtrain.criterions",
            "seqtrain.optim",
            "seqtrain.logging",
            "seqtrain.scoring",
        ),
    ),
    (
        "ground",
        (
            "seqtrain.errors",
            "seqtrain.fileio",
            "seqtrain.registry",
            "seqtrain.config",
            "seqtrain.flag_bounds",
            "seqtrain.cuda",
            "seqtrain.host_cpu",
            "seqtrain.slurm",
            "seqtrain.workers",
        ),
    ),
)
# seqtrain/*.py, __init__ included: "about 10" (ARCHITECTURE.md); host_cpu (the CPU's threads and bf16) joined
# the ground when generation came to choose its threads as training does
MAX_FLAT_MODULES = 11


def _modules() -> dict:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _layer(name: str) -> int:
    """The index in LAYERS of the longest prefix that names `name`'s package (every module must have one)."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found is not None, f"{name} belongs to no layer of tests/repo/test_layout.py's LAYERS"
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module):
    """(node, at module level?) for every import statement, including those in functions and TYPE_CHECKING
    blocks (a type-only import still says one module depends on another)."""
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top.add(id(node))
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            top.update(id(n) for n in node.body + node.orelse if isinstance(n, (ast.Import, ast.ImportFrom)))
        elif isinstance(node, ast.Try):
            top.update(id(n) for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, id(node) in top


def _targets(node, name: str, path: pathlib.Path, known: set) -> set:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    if isinstance(node, ast.Import):
        found.update(alias.name for alias in node.names)
    else:
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:  # `from seqtrain import distributed` names the module, not the package
            found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict:
    """module -> {(imported module, at module level?, line)}: seqtrain's own modules only."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node, top in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, name, path, set(modules)):
                # a package's __init__ importing its own submodules is the package's job, not a dependency
                if not target.startswith(name + ".") or path.name != "__init__.py":
                    edges.add((target, top, node.lineno))
        graph[name] = edges
    return graph


def _cycles(graph: dict) -> list:
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
    return cycles


def test_no_import_cycle_between_modules():
    """Module-level and function-level imports alike: a circle hidden in a function is still a circle."""
    graph = {name: {t for t, _, _ in edges} for name, edges in _graph().items()}
    assert not _cycles(graph), _cycles(graph)


def test_no_import_cycle_between_packages():
    """Folded to packages (seqtrain.train, seqtrain.data, ...; ground modules stand alone), the imports still
    run one way: no package reaches into one that reaches back."""

    def package(name):
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else name

    folded: dict = {}
    for name, edges in _graph().items():
        folded.setdefault(package(name), set()).update(
            package(t) for t, _, _ in edges if package(t) != package(name)
        )
    for name in list(folded):
        for t in folded[name]:
            folded.setdefault(t, set())
    assert not _cycles(folded), _cycles(folded)


def test_imports_never_run_upward():
    bad = []
    for name, edges in _graph().items():
        for target, _, line in sorted(edges):
            if _layer(target) < _layer(name) and not (name == "seqtrain" or target == "seqtrain"):
                bad.append(
                    f"{name}:{line} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
                )
    assert not bad, "\n".join(bad)


def test_imports_inside_functions_say_why():
    """An import inside a function is a choice (a heavy or optional dependency, a plugin, startup time): a
    comment on its line or just above says which. Everything else imports at the top."""
    bare = []
    for path in _modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, top in _import_nodes(ast.parse("\n".join(lines))):
            if top:
                continue
            span = lines[node.lineno - 1 : node.end_lineno]
            i = node.lineno - 2  # a comment above a block of imports covers the block
            while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
                i -= 1
            above = lines[i].strip() if i >= 0 else ""
            if not any("#" in s for s in span) and not above.startswith("#"):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bare, "imports inside functions without a reason:\n" + "\n".join(bare)


def test_generation_imports_no_training_component():
    """Generation decodes; it takes nothing from training's components: its parser leaves the fp16 loss-scaling
    flags out through the flag layer (seqtrain.flags.training.add_loss_scaling_args), not by importing the
    optimizer package, and the static step's aligned vocabulary product comes from seqtrain.cuda, not from a loss
    (issue 51)."""
    bad = [
        f"{name} -> {target} (line {line})"
        for name, edges in _graph().items()
        if name.startswith("seqtrain.generation")
        for target, _, line in edges
        if target.startswith(("seqtrain.optim", "seqtrain.criterions"))
    ]
    assert not bad, "\n".join(bad)


def test_few_flat_modules_and_a_folder_per_program():
    flat = sorted(p.name for p in (REPO / "seqtrain").glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat
    for folder in ("train", "generation", "preprocess", "flags", "checkpoint", "tasks"):
        assert (REPO / "seqtrain" / folder / "__init__.py").is_file(), folder
    # every module has a layer (a new top-level module must be placed in LAYERS on purpose)
    for name in _modules():
        _layer(name)


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


# Entries of extra_state that also name other things, so a use elsewhere is no read of the training state: the
# data position's "epoch" (EpochBatchIterator.state_dict), the CheckpointManager's and the lr scheduler's own
# "best", the train stats' and fairseq optimizer_history's "num_updates", MetersDict's own "meters".
_SHARED_NAMES = {"epoch", "best", "num_updates", "meters"}


def _key_uses(tree: ast.Module, keys: set) -> list:
    """(line, key) for each string in `keys` used as a dict key: x["k"], x.get("k") (pop, setdefault),
    {"k": ...}, "k" in x. (Keyword arguments are the TrainState record's typed fields, not dict keys.)"""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            found.append((node.lineno, node.slice.value))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, k.value) for k in node.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if isinstance(node.ops[0], (ast.In, ast.NotIn)):
                found.append((node.lineno, node.left.value))
    return [(line, k) for line, k in found if isinstance(k, str) and k in keys]


def test_training_state_entries_are_read_and_written_in_one_module():
    """A checkpoint's training state (extra_state's entries) has one owner, seqtrain/checkpoint/train_state.py:
    everything else goes through its TrainState record."""
    from seqtrain.checkpoint.train_state import EXTRA_KEYS, EXTRA_STATE

    owner = REPO / "seqtrain" / "checkpoint" / "train_state.py"
    keys = {EXTRA_STATE, *EXTRA_KEYS} - _SHARED_NAMES
    assert keys >= {"extra_state", "train_iterator", "rng", "ema", "ema_counter", "auto_max_tokens"}
    bad = []
    for path in _modules().values():
        if path == owner:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{path.relative_to(REPO)}:{line}: {key!r}" for line, key in _key_uses(tree, keys)]
    assert not bad, "training state entries used outside seqtrain/checkpoint/train_state.py:\n" + "\n".join(
        bad
    )
    # the check sees what it looks for: the owner itself reads and writes them
    found = {k for _, k in _key_uses(ast.parse(owner.read_text(encoding="utf-8")), keys | {"optimizer"})}
    assert "optimizer" not in found and "val_loss" in found and "train_iterator" in found


def test_functions_stay_readable():
    """ruff's C901 (McCabe complexity): pyproject.toml's threshold, 20, over the package; 15 under seqtrain/train,
    where the training step and resume live."""
    pytest.importorskip("ruff")
    for where, flags in (("seqtrain", []), ("seqtrain/train", ["--config", "lint.mccabe.max-complexity=15"])):
        run = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", *flags, where],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout + run.stderr


# Where the parsed flags (an argparse.Namespace) may be seen (docs/design.md, "Settings"): the flag layer that
# makes them, the one conversion into typed settings, each program's front end that parses and converts once,
# and the one adapter for the `args` record fairseq checkpoints store. Everything else takes its typed config.
NAMESPACE_EDGE = {
    "seqtrain_cli": "the entry points",
    "seqtrain.flags": "the flag layer: parsers, --config files, fairseq's flags",
    "seqtrain.config": "from_args: parsed flags -> a typed config, the one conversion",
    "seqtrain.checkpoint.fairseq": "the one adapter for the args record a fairseq checkpoint stores",
    "seqtrain.checkpoint.files": "unpickling fairseq files allows the Namespace they hold; the record's type",
    "seqtrain.checkpoint.load": "a loaded checkpoint carries its stored args record (read through the adapter)",
    "seqtrain.train.program": "seqtrain-train's front end: the parsed flags into a TrainConfig, once",
    "seqtrain.generation.options": "seqtrain-generate/-interactive/-tune's parsers",
    "seqtrain.generation.generate": "seqtrain-generate's front end",
    "seqtrain.generation.interactive": "seqtrain-interactive's front end",
    "seqtrain.generation.tune": "seqtrain-tune's front end",
    "seqtrain.serve.options": "seqtrain-serve's parser",
    "seqtrain.serve.server": "seqtrain-serve's front end",
    "seqtrain.evaluation.report": "seqtrain-eval's front end",
    "seqtrain.preprocess.databin": "seqtrain-preprocess's front end",
}


def _namespace_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "Namespace":
            found.append((node.lineno, "argparse.Namespace"))
        elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
            found += [
                (node.lineno, "from argparse import Namespace") for a in node.names if a.name == "Namespace"
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "args"
        ):
            found.append((node.lineno, f"{node.func.id}(args, ...)"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            found.append((node.lineno, f"args.{node.attr}"))
    return found


def test_the_namespace_stays_at_the_programs_edge():
    """Below the program front ends, components receive their own typed config, never the parsed flags: no
    argparse.Namespace, no args.x and no getattr(args, ...) outside NAMESPACE_EDGE (issues 36, 51: training's
    edge is the front end that builds its TrainConfig; the loop, the Trainer and the checkpoint policy read typed
    settings only)."""
    bad, seen_edge = [], set()
    for name, path in _modules().items():
        edge = next((p for p in NAMESPACE_EDGE if name == p or name.startswith(p + ".")), None)
        uses = _namespace_uses(ast.parse(path.read_text(encoding="utf-8")))
        if edge:
            seen_edge |= {edge} if uses else set()
            continue
        bad += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in uses]
    assert not bad, "the parsed flags reach below the programs' front ends:\n" + "\n".join(bad)
    # the check sees what it looks for: the front ends and the adapter do hold the Namespace
    assert {"seqtrain.train.program", "seqtrain.checkpoint.fairseq", "seqtrain.config"} <= seen_edge


def test_programs_start_without_what_only_some_runs_use():
    """Every program imports torch, but not FSDP2's DTensor machinery (~1-2 s; only --ddp-backend fully_sharded
    loads it) nor rouge-score's nltk (~0.4 s; loaded when ROUGE is first computed; seqtrain-eval, which always
    scores, excepted): start-up is paid by every command, `--help` included."""
    programs = [
        p.stem for p in (REPO / "seqtrain_cli").glob("*.py") if p.stem not in ("_main", "__init__", "eval")
    ]
    assert {"train", "generate", "preprocess", "interactive"} <= set(programs)
    code = (
        "import importlib, sys\n"
        f"for p in {sorted(programs)!r}: importlib.import_module('seqtrain_cli.' + p)\n"
        "print(sorted(m for m in ('torch.distributed.tensor', 'nltk', 'rouge_score') if m in sys.modules))\n"
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["[]", "True"]


def test_every_component_finds_its_settings_one_way():
    """A component registers its settings class with its name (`REGISTRY.register(name, config=Cls)`, fairseq's
    `register_x(name, dataclass=...)`) and that registry is the one way to it (issue 51): every registered arch,
    task, criterion, optimizer and scheduler has a settings class (a dataclass of flag fields) and its kind a
    common one for --user-dir plugins; no component class carries a `config` attribute and no module keeps a
    side table of configs. (Tokenizers are rebuilt from the spec a data-bin stores: no flags, no settings.)"""
    from dataclasses import fields, is_dataclass

    import seqtrain.criterions  # noqa: F401  (each registers its components on import)
    import seqtrain.models  # noqa: F401
    import seqtrain.optim  # noqa: F401
    import seqtrain.tasks  # noqa: F401
    from seqtrain import registry

    bad = []
    for table in (
        registry.ARCHS,
        registry.TASKS,
        registry.CRITERIONS,
        registry.OPTIMIZERS,
        registry.LR_SCHEDULERS,
    ):
        assert table.common is not None and is_dataclass(table.common), table.kind
        for name in table.names():
            if not table.get(name).__module__.startswith("seqtrain."):
                continue  # a --user-dir plugin another test imported (fairseq-style, it may have none)
            config = table.registered_config(name)
            if config is None or not is_dataclass(config):
                bad.append(f"{table.kind} {name!r}: registered without a settings class")
            elif not any("flag" in f.metadata for f in fields(config)):
                bad.append(f"{table.kind} {name!r}: {config.__name__} declares no flag")
            component = table.get(name)
            if isinstance(component, type) and any("config" in vars(c) for c in component.__mro__):
                bad.append(f"{table.kind} {name!r}: a `config` class attribute beside the registry's")
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.endswith("_CONFIGS"):
                    bad.append(
                        f"{path.relative_to(REPO)}:{node.lineno}: {t.id}, a side table of settings classes"
                    )
    assert not bad, "\n".join(bad)
