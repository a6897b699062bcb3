"""The package's shape: one import name in the wheel, no import cycles, imports along the flow
(docs/architecture.md, "What each room may import")."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# repository folder -> installed package (pyproject.toml's package-dir)
FOLDERS = {"tfpipe": "tfpipe", "pipeline": "tfpipe.pipeline", "train": "tfpipe.train",
           "export": "tfpipe.export", "serve": "tfpipe.serve", "loadtest": "tfpipe.loadtest",
           "skew": "tfpipe.skew", "tune": "tfpipe.tune", "rollout": "tfpipe.rollout", "predict": "tfpipe.predict",
           "examples": "tfpipe.examples"}
# modules that import nothing of tfpipe, which every room may import (docs/architecture.md)
LEAVES = ("tfpipe", "tfpipe.files", "tfpipe.stage", "tfpipe.machine", "tfpipe.children", "tfpipe.versions",
          "tfpipe.prediction_logs")
STAGES = ("pipeline", "train", "export", "serve", "loadtest", "skew", "tune", "rollout", "predict")
DRIVERS = ("tfpipe.cli", "tfpipe.run", "tfpipe.console", "tfpipe.show", "tfpipe.report", "tfpipe.config", "tfpipe.errors",
           "tfpipe.manifest", "tfpipe.steps")


def modules() -> dict[str, str]:
    """Installed module name -> source file, for every module of the package."""
    found = {}
    for folder, package in FOLDERS.items():
        for sub, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(sub, d, "__init__.py")))
            rel = os.path.relpath(sub, os.path.join(ROOT, folder))
            pkg = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for name in sorted(files):
                if name.endswith(".py"):
                    stem = name[:-3]
                    found[pkg if stem == "__init__" else f"{pkg}.{stem}"] = os.path.join(sub, name)
    return found


def imports_of(path: str, module: str) -> set[str]:
    """Every tfpipe module `path` imports, at any depth of the code (in functions, under
    TYPE_CHECKING): a lazy import is still a dependency."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    known = modules()
    return {name for name in found if name in known and name != module}


def graph() -> dict[str, set[str]]:
    return {m: imports_of(p, m) for m, p in modules().items()}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else module


# the server's layers, outermost first: a layer imports those below it, never one above
SERVE_LAYERS = ("tfpipe.serve.transports", "tfpipe.serve.codecs", "tfpipe.serve.core")


def serve_layer(module: str) -> int | None:
    return next((i for i, layer in enumerate(SERVE_LAYERS) if module.startswith(layer + ".")), None)


def allowed(importer: str, imported: str) -> bool:
    """docs/architecture.md's rules for one import edge."""
    src, dst = room(importer), room(imported)
    outer, inner = serve_layer(importer), serve_layer(imported)
    if outer is not None and inner is not None and inner < outer:  # the server's layers: never back
        return False
    if imported in LEAVES or src == dst:  # leaves every room may use; its own
        return True
    if src in STAGES and imported in DRIVERS:
        return False  # no stage imports the CLI or the orchestrator
    if src in ("skew", "rollout"):
        return True  # the last stages read the others' outputs with their own readers, load tests and charts
    if src == "tune":
        return dst in ("serve", "loadtest")  # it starts servers and load-tests them
    if src == "predict":  # the data stage's readers and engines, the server's servable, training's parsing
        return dst in ("pipeline", "serve", "train")
    if src in ("pipeline", "serve", "loadtest"):
        return dst not in STAGES
    if src in ("train", "export"):
        if dst == "pipeline":  # the schema, and the date rules the model parses a date feature by
            return imported in ("tfpipe.pipeline.schema", "tfpipe.pipeline.dates")
        if dst == "train":
            return src == "export"
        return dst not in STAGES
    return True  # the CLI, the orchestrator and the report drive every stage


@pytest.mark.parametrize("importer,imported,ok", [
    ("tfpipe.pipeline.job", "tfpipe.pipeline.schema", True),
    ("tfpipe.pipeline.job", "tfpipe.train.data", False),
    ("tfpipe.train.data", "tfpipe.pipeline.schema", True),
    ("tfpipe.train.job", "tfpipe.pipeline.job", False),
    ("tfpipe.export.job", "tfpipe.train.data", True),
    ("tfpipe.train.job", "tfpipe.export.job", False),
    ("tfpipe.serve.server", "tfpipe", True),
    ("tfpipe.pipeline.job", "tfpipe.files", True),
    ("tfpipe.pipeline.job", "tfpipe.errors", False),
    ("tfpipe.serve.server", "tfpipe.pipeline.schema", False),
    ("tfpipe.loadtest.job", "tfpipe.serve.tfserving.configs", False),
    ("tfpipe.serve.core.manager", "tfpipe.run", False),
    ("tfpipe.serve.transports.grpc_api", "tfpipe.serve.codecs.tensor_proto", True),
    ("tfpipe.serve.codecs.tensor_proto", "tfpipe.serve.core.servable", True),
    ("tfpipe.serve.core.servable", "tfpipe.serve.codecs.tensor_proto", False),
    ("tfpipe.serve.core.inference", "tfpipe.serve.transports.rest_api", False),
    ("tfpipe.serve.codecs.rest_json", "tfpipe.serve.transports.rest_api", False),
    ("tfpipe.serve.server", "tfpipe.serve.codecs.warmup", True),
    ("tfpipe.run", "tfpipe.serve.server", True),
    ("tfpipe.skew.job", "tfpipe.pipeline.stats", True),
    ("tfpipe.skew.job", "tfpipe.run", False),
    ("tfpipe.serve.server", "tfpipe.skew.job", False),
    ("tfpipe.tune.job", "tfpipe.loadtest.job", True),
    ("tfpipe.predict.job", "tfpipe.pipeline.readers", True),
    ("tfpipe.predict.model", "tfpipe.serve.core.servable", True),
    ("tfpipe.predict.job", "tfpipe.export.job", False),
    ("tfpipe.serve.server", "tfpipe.predict.model", False),
    ("tfpipe.tune.job", "tfpipe.serve.tfserving.configs", True),
    ("tfpipe.tune.job", "tfpipe.train.data", False),
    ("tfpipe.serve.server", "tfpipe.tune.search", False),
    ("tfpipe.export.job", "tfpipe.versions", True),
    ("tfpipe.serve.tfserving.configs", "tfpipe.versions", True),
    ("tfpipe.export.job", "tfpipe.rollout.job", False),
    ("tfpipe.rollout.job", "tfpipe.loadtest.job", True),
])
def test_the_rules_themselves(importer, imported, ok):
    assert allowed(importer, imported) is ok


def test_imports_follow_the_flow():
    wrong = sorted(f"{a} imports {b}" for a, targets in graph().items() for b in targets if not allowed(a, b))
    assert not wrong, "imports against docs/architecture.md's rules:\n" + "\n".join(wrong)


def find_cycles(edges: dict[str, set[str]]) -> list[str]:
    """One line per back edge of a depth-first walk: every cycle shows up in at least one."""
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join((path + [node])[(path + [node]).index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return cycles


@pytest.mark.parametrize("edges,expected", [
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, ["a -> b -> a"]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a -> b -> c -> a"]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),  # a diamond is not a cycle
    ({"a": {"a"}}, ["a -> a"]),
])
def test_the_cycle_finder_itself(edges, expected):
    assert find_cycles(edges) == expected


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_wheel_installs_one_import_name(tmp_path):
    """Built as pip builds it for an install (from a copy of the sources, so that no build/
    is left in the repository): its only top-level name is tfpipe, every module of the
    repository's package folders is inside it, and so is the demo config."""
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *FOLDERS):
        copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy
        copy(os.path.join(ROOT, name), src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                       if copy is shutil.copytree else {}))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = [p for p in os.listdir(tmp_path / "dist") if p.endswith(".whl")]
    names = zipfile.ZipFile(tmp_path / "dist" / wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"tfpipe"}, top
    packaged = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py")}
    assert packaged == set(modules()), set(modules()) ^ packaged
    # the demo config `tfpipe run` falls back on, and no data: the taxi sample stays in the repository
    assert "tfpipe/examples/penguins.toml" in names
    assert not [n for n in names if n.endswith(".csv")]


MAX_FUNCTION_LINES = 80


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function in `source` longer than `limit` lines, from its `def` line
    to its last line (a nested function counts within its parent, and on its own)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def _function(name: str, body_lines: int, indent: str = "") -> str:
    return f"{indent}def {name}():\n" + "".join(f"{indent}    x = {i}\n" for i in range(body_lines))


@pytest.mark.parametrize("source, want", [
    (_function("f", 79), []),  # 80 lines with its def: the limit itself
    (_function("f", 80), [("f", 81)]),
    ("class C:\n" + _function("m", 85, "    "), [("m", 86)]),  # methods count
    ("async " + _function("a", 90), [("a", 91)]),
    (_function("outer", 2) + "    " + _function("inner", 81).replace("\n", "\n    ").rstrip() + "\n",
     [("outer", 85), ("inner", 82)]),
])
def test_long_functions_are_found(source, want):
    assert long_functions(source) == want


def test_no_product_function_is_longer_than_80_lines():
    """docs/architecture.md: a function longer than this is split where its data flows."""
    found = [f"{os.path.relpath(path, ROOT)}: {name} ({n} lines)" for module, path in modules().items()
             for name, n in long_functions(open(path).read())]
    assert not found, "functions over 80 lines:\n" + "\n".join(found)


def _fresh(source: str, cached: str) -> bool:
    """Whether `cached` exists and was written after `source` last changed."""
    return os.path.exists(cached) and os.path.getmtime(cached) >= os.path.getmtime(source)


def test_every_module_was_compiled_before_the_tests_ran():
    """conftest.py writes the bytecode of the project's modules in the process that starts the
    workers, so that the interpreters the suite starts do not each compile tfpipe again, even
    where PYTHONDONTWRITEBYTECODE is set."""
    import importlib.util

    stale = [path for path in modules().values() if not _fresh(path, importlib.util.cache_from_source(path))]
    assert not stale, stale


def test_every_test_module_was_rewritten_before_the_tests_ran():
    """conftest.py writes pytest's assertion-rewritten bytecode of the test modules as well (by
    pytest's own functions, which are not its public API): this fails when a pytest release
    renames them, and the workers have gone back to rewriting every module themselves."""
    from _pytest.assertion.rewrite import PYC_TAIL

    from conftest import rewritten_test_modules

    stale = [p.name for p in rewritten_test_modules()
             if not _fresh(str(p), str(p.parent / "__pycache__" / (p.name[:-3] + PYC_TAIL)))]
    assert not stale, stale
