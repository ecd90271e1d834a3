"""The package's shape, read from the source with `ast` (no import): stages import only downward, no import
circle, and every module says its job in its docstring. A file's or a function's length is a guide, never a
reason to cut one concept in two (STYLE.md 13): no test caps either; review decides."""

import ast
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "ggpo_offline"

STAGES = ("core", "jobs", "pool", "generate", "evaluate", "train", "compare")
"""The pipeline's stages, lowest first: each imports only from itself and the stages before it."""
ALLOWED: dict[str, set[str]] = {stage: set(STAGES[:i]) for i, stage in enumerate(STAGES)}
ALLOWED["organism"] = {"core", "pool", "generate"}  # the tiny model sits on generation
ALLOWED["importing"] = {"core", "pool", "generate", "train"}  # rollouts of other tools, scored as train does
ALLOWED["compare"] |= {"organism"}  # the offline arc's report measures the organism's styles along the arc
FORBIDDEN_TOP = ("ggpo_cli", "cli")
"""The CLI sits on top of the library; nothing in it may reach back up."""


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or package), dotted
    line: int


def module_name(path: Path, root: Path) -> str:
    """ggpo_offline/train/run.py -> ggpo_offline.train.run; a package's __init__.py is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    return {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}


def imports(root: Path, package: str = PACKAGE) -> list[Import]:
    """Every import in ``package`` (module level, inside functions and under TYPE_CHECKING alike), each
    resolved to the most specific module of the tree it names, or to the imported name when outside it."""
    known = modules(root, package)
    found = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [Import(name, alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    found.append(Import(name, submodule if submodule in known else base, node.lineno))
    return found


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module of ``from <module> import ...`` (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    parts = importer.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def stage(module: str) -> str | None:
    """The stage a module belongs to (ggpo_offline.train.run -> train); None for the root package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layering_violations(root: Path, package: str = PACKAGE) -> list[str]:
    """Imports that reach sideways or up the pipeline, or into the CLI."""
    bad = []
    for imp in imports(root, package):
        top = imp.target.split(".")[0]
        if top in FORBIDDEN_TOP:
            bad.append(f"{imp.source}:{imp.line} imports the CLI ({imp.target})")
            continue
        if top != package:
            continue
        source, target = stage(imp.source), stage(imp.target)
        if target is None or target == source:
            continue  # the root package (version, docstring) is below every stage
        if source is None or source not in ALLOWED:
            bad.append(f"{imp.source}:{imp.line} is outside every stage and imports {imp.target}")
        elif target not in ALLOWED[source]:
            bad.append(f"{imp.source}:{imp.line} ({source}) imports {imp.target} ({target})")
    return bad


def import_cycles(root: Path, package: str = PACKAGE) -> list[list[str]]:
    """The module circles of the import graph (strongly connected components of more than one module, or a
    module importing itself), each sorted."""
    graph: dict[str, set[str]] = {name: set() for name in modules(root, package)}
    for imp in imports(root, package):
        if imp.target in graph:
            graph[imp.source].add(imp.target)
    return [sorted(c) for c in _components(graph) if len(c) > 1 or next(iter(c)) in graph[next(iter(c))]]


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def undocumented_modules(root: Path, folders: tuple[str, ...]) -> list[str]:
    """Modules that do not open with a docstring whose first line says their job (an empty ``__init__.py``
    is a package marker and needs none)."""
    bad = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text()
            docstring = ast.get_docstring(ast.parse(text), clean=False)
            if text.strip() and not (docstring and docstring.split("\n")[0].strip()):
                bad.append(str(path.relative_to(root)))
    return bad


# -- the package ------------------------------------------------------------------------------------------


def test_stages_import_only_downward():
    assert layering_violations(REPO) == []


def test_no_import_circle():
    assert import_cycles(REPO) == []


def test_every_module_says_its_job():
    assert undocumented_modules(REPO, (PACKAGE, "cli")) == []


def test_every_package_is_installed():
    """pyproject.toml lists packages explicitly; one left out is missing from a non-editable install."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(path, REPO) for path in (REPO / PACKAGE).rglob("__init__.py")}
    assert found - listed == set()


STDLIB_SINCE = {"tomllib": (3, 11), "annotationlib": (3, 14), "compression": (3, 14)}
"""Standard-library modules newer than the oldest Python a project of this age might claim."""


def test_the_oldest_python_claimed_runs_the_code(tmp_path):
    """requires-python is what ruff checks the syntax against (no target-version of its own), and no module
    imports a standard-library module that Python lacks."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "target-version" not in project["tool"]["ruff"]  # ruff reads requires-python instead
    oldest = tuple(int(part) for part in project["project"]["requires-python"].removeprefix(">=").split("."))
    sources = [*(REPO / PACKAGE).rglob("*.py"), *(REPO / "cli").rglob("*.py")]
    version = f"py{oldest[0]}{oldest[1]}"
    lint = subprocess.run(
        [
            str(Path(sys.executable).parent / "ruff"),
            "check",
            "--isolated",
            "--target-version",
            version,
            "--select",
            "UP036",
            *map(str, sources),
        ],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout  # a syntax error under the oldest version fails here
    too_new = {
        (path.name, name)
        for path in sources
        for name in imported_modules(path)
        if STDLIB_SINCE.get(name, (0,)) > oldest
    }
    assert too_new == set()
    bad = tmp_path / "newer_syntax.py"
    bad.write_text("type Score = float\n")  # PEP 695, Python 3.12: the check can fail
    planted = subprocess.run(
        [
            str(Path(sys.executable).parent / "ruff"),
            "check",
            "--isolated",
            "--target-version",
            version,
            str(bad),
        ],
        capture_output=True,
        text=True,
    )
    assert planted.returncode != 0 and "3.12" in planted.stdout


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


# -- the checks themselves, on a planted tree -------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    f"{PACKAGE}/__init__.py": '"""Root."""\n__version__ = "0"\n',
    f"{PACKAGE}/core/__init__.py": "",
    f"{PACKAGE}/core/errors.py": "class UserError(Exception): ...\n",
    f"{PACKAGE}/pool/__init__.py": "",
    f"{PACKAGE}/pool/source.py": "from ggpo_offline.core import errors\nfrom ggpo_offline import __version__",
    f"{PACKAGE}/train/__init__.py": "",
    f"{PACKAGE}/train/run.py": f"from {PACKAGE}.train import checkpoint\nfrom . import layout\n",
    f"{PACKAGE}/train/checkpoint.py": "from ggpo_offline.train.layout import STATE_FILE\n",
    f"{PACKAGE}/train/layout.py": 'STATE_FILE = "state.pt"\n',
    f"{PACKAGE}/organism/__init__.py": "",
    f"{PACKAGE}/organism/tiny.py": f"from {PACKAGE}.pool import source\nimport torch\n",
}


def test_clean_tree_passes(tmp_path):
    root = _tree(tmp_path, CLEAN)
    assert layering_violations(root) == []
    assert import_cycles(root) == []


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        ("pool/source.py", "def f():\n    from ggpo_offline.train import run", "(pool) imports"),
        ("core/errors.py", "from ggpo_offline.pool.source import x", "(core) imports ggpo_offline.pool"),
        ("organism/tiny.py", "from ggpo_offline.train.run import x", "(organism) imports ggpo_offline.train"),
        ("pool/source.py", "from ggpo_offline.organism import tiny\n", "imports ggpo_offline.organism.tiny"),
        ("train/run.py", "import ggpo_cli.main\n", "imports the CLI (ggpo_cli.main)"),
        ("train/run.py", "from ..compare import x\n", "(train) imports ggpo_offline.compare"),
        ("train/__init__.py", "from ggpo_cli import main\n", "imports the CLI (ggpo_cli)"),
    ],
)
def test_layering_catches_an_upward_import(tmp_path, module, text, expected):
    root = _tree(tmp_path, {**CLEAN, f"{PACKAGE}/compare/__init__.py": "", f"{PACKAGE}/{module}": text})
    violations = layering_violations(root)
    assert len(violations) == 1 and expected in violations[0], violations


def test_cycle_is_found_through_a_lazy_import(tmp_path):
    lazy = "def f():\n    from ggpo_offline.train.run import x\n"
    root = _tree(tmp_path, {**CLEAN, f"{PACKAGE}/train/layout.py": lazy})
    assert import_cycles(root) == [
        [f"{PACKAGE}.train.checkpoint", f"{PACKAGE}.train.layout", f"{PACKAGE}.train.run"]
    ]


def test_self_import_is_a_cycle(tmp_path):
    root = _tree(tmp_path, {**CLEAN, f"{PACKAGE}/train/layout.py": "from ggpo_offline.train import layout\n"})
    assert import_cycles(root) == [[f"{PACKAGE}.train.layout"]]


def test_a_module_without_its_job_is_found(tmp_path):
    folder = f"{PACKAGE}/core/"
    ok = '"""Reads the pool footer."""\nx = 1\n'
    root = _tree(tmp_path, {folder + "ok.py": ok, folder + "empty.py": ""})
    assert undocumented_modules(root, (PACKAGE,)) == []
    _tree(root, {folder + "bare.py": "x = 1\n", folder + "blank.py": '"""\n\nDetails only."""\nx = 1\n'})
    assert undocumented_modules(root, (PACKAGE,)) == [f"{folder}bare.py", f"{folder}blank.py"]
