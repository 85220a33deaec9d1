"""The package's shape, checked from its source with `ast` (nothing is imported):

* only rocm_dspark/cli imports click (the library is usable without the CLI);
* no module imports a module of a higher layer (below), and nothing imports the CLI;
* no import cycles, counting imports inside functions too;
* docs/layout.md's table names every folder, and every path it names exists;
* the package root holds only the foundations; the templates are package data of rocm_dspark.launch, and
  the one symlink left is rocm_dspark/recipes (docs/layout.md says why).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rocm_dspark"

# Lower layers never import higher ones. A package's layer is its band [n, n+1); a module listed on its own
# gets an order inside its package's band (it may not leave the band: that is how upward arrows hid before).
PACKAGE_LAYERS = {
    "rocm_dspark": 0,                                                   # foundations (the root modules)
    "rocm_dspark.images": 1, "rocm_dspark.runtime": 1, "rocm_dspark.attention": 1,
    "rocm_dspark.recipe": 2,                                            # data in, plan out
    "rocm_dspark.planner": 3, "rocm_dspark.launch": 3,                  # plan in: prices, files
    "rocm_dspark.vllm_plugin": 4,
    "rocm_dspark.probe": 5,                                             # the gate
    "rocm_dspark.usecase": 6,                                           # options -> selection -> plan -> verdict
    "rocm_dspark.validate": 7, "rocm_dspark.service": 7,              # the service `up` leaves: state, stop, readiness
    "rocm_dspark.up": 8,
    "rocm_dspark.cli": 9, "rocm_dspark.__main__": 9,
}
MODULE_ORDER = {
    "rocm_dspark.recipe.plan": 2.0, "rocm_dspark.recipe.capture": 2.0, "rocm_dspark.recipe.vllm_args": 2.0,
    "rocm_dspark.recipe.vllm_env": 2.0, "rocm_dspark.recipe.secret_env": 2.0, "rocm_dspark.recipe.k_schedule": 2.0,
    "rocm_dspark.recipe.catalog": 2.1, "rocm_dspark.recipe.strategies": 2.1, "rocm_dspark.recipe.memory": 2.1,
    "rocm_dspark.recipe.resolve": 2.2, "rocm_dspark.recipe.selection": 2.3, "rocm_dspark.recipe.cluster": 2.3,
    "rocm_dspark.recipe.plan_apply": 2.3,
    "rocm_dspark.launch.quoting": 3.0, "rocm_dspark.launch.launch_facts": 3.0,
}
LAYERS = {**PACKAGE_LAYERS, **MODULE_ORDER}
LAYER_NAMES = ["foundations", "images, runtime, kernels", "recipe", "planner, launch", "plugin", "probe", "use case",
               "validate, service", "up", "CLI"]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = modules()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _module_name(path: Path) -> str:
    if not path.is_relative_to(ROOT):  # a file the checker's own test writes
        return "rocm_dspark.recipe." + path.stem
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """Each file parsed once per session: the checks below walk the same trees."""
    return ast.parse(path.read_text(), str(path))


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file: top-level and inside functions, relative ones
    resolved, and importlib.import_module("literal")."""
    found = []
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
    return found


@functools.lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        targets = {_owner(mod) for mod, _ in imports(path) if mod.split(".")[0] == "rocm_dspark"}
        edges[name] = targets - {None, name}
    return edges


def layer(name: str) -> float:
    if name in MODULE_ORDER:
        return MODULE_ORDER[name]
    pkg = _package(name)
    assert pkg in PACKAGE_LAYERS, f"{name} has no layer: add its package to PACKAGE_LAYERS in tests/test_layout.py"
    return PACKAGE_LAYERS[pkg]


def _package(name: str) -> str:
    """The subsystem package of a module: rocm_dspark.<pkg>, or rocm_dspark for the root modules."""
    parts = name.split(".")
    if len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "rocm_dspark.__main__" if name == "rocm_dspark.__main__" else "rocm_dspark"


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for name, targets in edges.items():
        for target in targets:
            if layer(target) > layer(name):
                a, b = int(layer(name)), int(layer(target))
                out.append(f"{name} ({LAYER_NAMES[a]}) imports {target} ({LAYER_NAMES[b]})")
    return sorted(out)


def test_only_the_cli_imports_click():
    users = sorted(f"{name}:{line}" for name, path in MODULES.items() for mod, line in imports(path)
                   if mod.split(".")[0] == "click" and not (name == "rocm_dspark.cli" or name.startswith("rocm_dspark.cli.")))
    assert users == [], "click outside rocm_dspark/cli: " + ", ".join(users)


def test_no_module_imports_upward():
    assert upward_imports(graph()) == [], "\n".join(upward_imports(graph()))


def test_every_module_order_stays_inside_its_package_band():
    # A module may be ordered inside its package, never lifted out of it (images.pull once sat at up's layer).
    for name, value in MODULE_ORDER.items():
        band = PACKAGE_LAYERS[_package(name)]
        assert band <= value < band + 1, f"{name}: {value} is outside {_package(name)}'s band [{band}, {band + 1})"
    assert set(PACKAGE_LAYERS) >= {_package(m) for m in MODULES}, "a package has no layer in PACKAGE_LAYERS"


def test_the_checker_sees_an_upward_import(tmp_path):
    # The test above must be able to fail: the CLI sits above everything, and a function-level, relative or
    # import_module() import counts as much as a top-level one.
    assert layer("rocm_dspark.cli.recipe") > layer("rocm_dspark.validate.runner") > layer("rocm_dspark.recipe.catalog")
    assert "rocm_dspark.recipe.catalog" in graph()["rocm_dspark.recipe.resolve"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from rocm_dspark.probe import gate\n"
                   "def g():\n    import importlib\n    importlib.import_module('rocm_dspark.up.steps')\n")
    found = {m for m, _ in imports(src)}
    assert {"rocm_dspark.probe.gate", "rocm_dspark.up.steps"} <= found
    edges = {"rocm_dspark.recipe.selection": {"rocm_dspark.probe.gate"}}
    assert upward_imports(edges) == ["rocm_dspark.recipe.selection (recipe) imports rocm_dspark.probe.gate (probe)"]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the checker works
    assert cycles(graph()) == []


LAYOUT = ROOT / "docs" / "layout.md"


def _layout_table() -> str:
    return LAYOUT.read_text()


def test_readme_layout_names_every_folder_and_only_real_paths():
    table = _layout_table()
    tops = "|".join(re.escape(p.name) for p in ROOT.iterdir() if p.is_dir())
    linked = {(LAYOUT.parent / p).resolve() for p in re.findall(r"\]\(([^)#]+)\)", table)}
    named = linked | {ROOT / p for p in re.findall(rf"`((?:{tops})/[\w./-]*)`", table)}
    missing = sorted(str(p) for p in named if not p.exists())
    assert missing == [], f"docs/layout.md names paths that do not exist: {missing}"
    folders = [p.relative_to(ROOT).as_posix() + "/" for p in PACKAGE.iterdir()
               if p.is_dir() and (p / "__init__.py").exists()]
    folders += [p.name + "/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                and p.name not in ("tests", "rocm_dspark") and not p.name.endswith(".egg-info")]
    unnamed = sorted(f for f in folders if f"`{f}`" not in table and f"(../{f})" not in table)
    assert unnamed == [], f"folders docs/layout.md does not name: {unnamed}"


ROOT_MODULES = {"__init__", "__main__", "errors", "atomic", "inputs", "statedir", "textwidth"}  # what every subsystem imports


def test_the_package_root_holds_only_the_foundations():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ROOT_MODULES)
    assert loose == [], (f"modules at the package root that belong to a subsystem: {loose}; move them into "
                         "recipe/, launch/, runtime/ or the subsystem that uses them")
    assert {p.stem for p in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_templates_are_package_data_and_the_only_symlink_is_recipes():
    links = sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*") if p.is_symlink())
    assert links == ["rocm_dspark/recipes"] and (PACKAGE / "recipes").resolve() == ROOT / "recipes"
    templates = PACKAGE / "launch" / "templates"
    assert {"launcher.sh.tmpl", "service.tmpl", "env.tmpl"} <= {p.name for p in templates.iterdir()}
    assert not (ROOT / "launch").exists()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"rocm_dspark.launch" = ["templates/*"]' in pyproject
    assert 'LAUNCH_DIR = Path(__file__).resolve().parent / "templates"' in (PACKAGE / "launch" / "launchers.py").read_text()



def private_imports() -> list[str]:
    """`from rocm_dspark.x import _name` in another module: a shared name should be public (or moved)."""
    out = []
    for name, path in MODULES.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rocm_dspark") and node.level == 0:
                out += [f"{name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(out)


def test_no_private_name_crosses_a_package():
    # Inside one package a private helper may be shared (attention/_triton); across packages it is an API.
    crossing = [line for line in private_imports()
                if _package(line.split(":")[0]) != _package(line.split(" imports ")[1].rpartition(".")[0])]
    assert crossing == [], "\n".join(crossing)
    # The names the design review found shared (issue 31), inside their packages too: public now.
    named = ("_load_yaml", "_nonneg_lstsq", "_check_keys", "_from_outcome", "_hf_cache")
    assert [line for line in private_imports() if line.endswith(named)] == []


_ISSUE_REF = re.compile(r"\bissues? #?\d+", re.IGNORECASE)  # this project's tracker (vllm#58151 is a source)
_MACHINE_PATH = re.compile(r"(?<![\w.~])(/work/|/home/|/root/)")  # a path of one machine, not of the repository


def _comments_and_docstrings(path: Path):
    import io
    import tokenize

    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(parsed(path)):  # the tree the import checks parsed
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_comments_describe_and_name_only_repository_paths():
    """Product comments and docstrings say what and why: no pointer to this project's issue tracker (an
    upstream reference such as vllm#58151 is a source), and no path of the machine they were written on."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _comments_and_docstrings(path):
            if _ISSUE_REF.search(text) or _MACHINE_PATH.search(text):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {text.strip().splitlines()[0][:100]}")
    assert not bad, "\n".join(bad)
