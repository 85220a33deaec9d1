"""The package's shape, checked from its source with `ast` (nothing is imported):

* only rocm_dspark/cli imports click (the library is usable without the CLI);
* no module imports a module of a higher layer (below), and nothing imports the CLI;
* no import cycles, counting imports inside functions too;
* the README's "Layout" table names every folder, and every path it names exists;
* the package root holds only the foundations; the templates are package data of rocm_dspark.launch, and
  the one symlink left is rocm_dspark/recipes (README, "Layout", says why).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rocm_dspark"

# Lower layers never import higher ones. A module's layer is that of its longest listed prefix.
LAYERS = {
    # foundations: what every subsystem imports
    "rocm_dspark": 0, "rocm_dspark.errors": 0, "rocm_dspark.atomic": 0, "rocm_dspark.inputs": 0,
    "rocm_dspark.textwidth": 0,
    "rocm_dspark.recipe": 0, "rocm_dspark.recipe.plan": 0, "rocm_dspark.recipe.capture": 0,
    "rocm_dspark.recipe.vllm_args": 0, "rocm_dspark.recipe.vllm_env": 0, "rocm_dspark.recipe.secret_env": 0,
    "rocm_dspark.recipe.k_schedule": 0,
    "rocm_dspark.launch": 0, "rocm_dspark.launch.quoting": 0, "rocm_dspark.launch.launch_facts": 0,
    # facts, kernels, runtime, planner
    "rocm_dspark.recipe.catalog": 1, "rocm_dspark.recipe.strategies": 1, "rocm_dspark.attention": 1,
    "rocm_dspark.runtime": 1, "rocm_dspark.planner": 1, "rocm_dspark.recipe.memory": 1,
    "rocm_dspark.runtime.server_phases": 1, "rocm_dspark.runtime.progress": 1,
    "rocm_dspark.images": 1, "rocm_dspark.images.pull": 4,  # pull is up's image step, shared with `launch --pull`
    # resolver and renderers
    "rocm_dspark.recipe.resolve": 2, "rocm_dspark.launch.render": 2, "rocm_dspark.launch.render_cluster": 2,
    "rocm_dspark.launch.launchers": 2, "rocm_dspark.launch.launch_group": 2, "rocm_dspark.launch.k8s": 2,
    # probe, plugin, selection
    "rocm_dspark.recipe.selection": 3, "rocm_dspark.recipe.cluster": 3, "rocm_dspark.probe": 3,
    "rocm_dspark.vllm_plugin": 3, "rocm_dspark.recipe.plan_apply": 3,
    "rocm_dspark.validate": 4, "rocm_dspark.up": 4,
    "rocm_dspark.cli": 5, "rocm_dspark.__main__": 5,
}
LAYER_NAMES = ["foundations", "facts, kernels, runtime, planner", "resolver and renderers", "probe, plugin, selection",
               "validation", "CLI"]


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


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, including those inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((sub if sub in MODULES else node.module, node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        targets = {_owner(mod) for mod, _ in imports(path) if mod.split(".")[0] == "rocm_dspark"}
        edges[name] = targets - {None, name}
    return edges


def layer(name: str) -> int:
    probe = name
    while probe not in LAYERS or (probe == "rocm_dspark" and name != probe):
        assert "." in probe, f"{name} has no layer: add it (or its package) to LAYERS in tests/test_layout.py"
        probe = probe.rpartition(".")[0]
    return LAYERS[probe]


def test_only_the_cli_imports_click():
    users = sorted(f"{name}:{line}" for name, path in MODULES.items() for mod, line in imports(path)
                   if mod.split(".")[0] == "click" and not (name == "rocm_dspark.cli" or name.startswith("rocm_dspark.cli.")))
    assert users == [], "click outside rocm_dspark/cli: " + ", ".join(users)


def test_no_module_imports_upward():
    upward = []
    for name, targets in graph().items():
        for target in targets:
            if layer(target) > layer(name):
                upward.append(f"{name} ({LAYER_NAMES[layer(name)]}) imports {target} ({LAYER_NAMES[layer(target)]})")
    assert upward == [], "\n".join(sorted(upward))


def test_the_checker_sees_an_upward_import():
    # The test above must be able to fail: the CLI sits above everything.
    assert layer("rocm_dspark.cli.recipe") > layer("rocm_dspark.validate.runner") > layer("rocm_dspark.recipe.catalog")
    assert "rocm_dspark.recipe.catalog" in graph()["rocm_dspark.recipe.resolve"]


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


def _layout_table() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("\n## ", 1)[0]


def test_readme_layout_names_every_folder_and_only_real_paths():
    table = _layout_table()
    tops = "|".join(re.escape(p.name) for p in ROOT.iterdir() if p.is_dir())
    named = set(re.findall(r"\]\(([^)#]+)\)", table)) | set(re.findall(rf"`((?:{tops})/[\w./-]*)`", table))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], f"README layout names paths that do not exist: {missing}"
    folders = [p.relative_to(ROOT).as_posix() + "/" for p in PACKAGE.iterdir()
               if p.is_dir() and (p / "__init__.py").exists()]
    folders += [p.name + "/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                and p.name not in ("tests", "rocm_dspark") and not p.name.endswith(".egg-info")]
    unnamed = sorted(f for f in folders if f"`{f}`" not in table and f"({f})" not in table)
    assert unnamed == [], f"folders the README layout section does not name: {unnamed}"


ROOT_MODULES = {"__init__", "__main__", "errors", "atomic", "inputs", "textwidth"}  # what every subsystem imports


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

