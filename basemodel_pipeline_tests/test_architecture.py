"""Layers that only point down (docs/architecture.md).

The library's modules are read with `ast` (nothing is imported) and every import is an edge, the ones inside
functions too: a lazy import is a dependency all the same. Two rules hold:

* an import never goes from a lower layer to a higher one (LAYERS, bottom to top; a layer may import itself);
* no import cycle between modules, inside a package too (a strongly connected component of more than one).

Imports by name through importlib (the backend registries of sources/ and outputs/) are not edges here.
Edges that still break a rule are in ALLOWED, each with its reason; an entry whose edge no longer exists, or
no longer breaks a rule, fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PACKAGE = "basemodel_pipeline"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE  # the source tree beside the tests, installed or not

# Bottom to top. Names are the first component below basemodel_pipeline ("" is the package's __init__).
# A module at the root sits in the lowest layer that fits what it imports.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "ground",
        frozenset(
            {
                "",
                "config",
                "errors",
                "progress",
                "settings",
                "runtime",
                "dates",
                "metadata",
                "workspace",  # the layout of a config's workspace
                "files",  # atomic writes, staging and publishing, version names, LATEST: no layout
                "manifests",  # the sha256 records of every artifact's files
                "locks",
                "diskfaults",
                "stops",
                "retry",  # the retry policy of every remote call (sources, outputs, uploads)
            }
        ),
    ),
    ("sources", frozenset({"sources"})),
    ("outputs", frozenset({"outputs"})),  # the warehouse writers reuse the sources' connections
    ("cache", frozenset({"cache"})),
    ("features", frozenset({"features"})),
    ("model", frozenset({"model"})),
    ("evaluation", frozenset({"evaluation"})),
    ("training", frozenset({"training"})),
    ("targets", frozenset({"targets"})),  # labels, the events API, candidate examples, Python targets
    ("tasks", frozenset({"tasks"})),  # one class per task type, owning its labels (docs/tasks.md)
    ("candidates", frozenset({"candidates"})),  # the candidate models, their selection, blending and loading
    ("scenarios", frozenset({"scenarios"})),  # the fine-tuning stage
    ("inference", frozenset({"inference"})),
    ("reports", frozenset({"reports"})),
    ("ops", frozenset({"ops"})),  # retention, upload, alerts, verify (which reads what every stage wrote)
    ("pipeline", frozenset({"pipeline"})),
    ("demo", frozenset({"demo"})),  # demo data sets and configs, synthetic generators: no stage imports them
    ("faces", frozenset({"cli", "entrypoints", "defs", "definitions"})),
)

# Known violations not removed yet: "importer -> imported": why it is still there. The list only shrinks.
ALLOWED: dict[str, str] = {}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the library by its name below the package ("cache.build"; "" for the package)."""
    return {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _absolute(name: str) -> str | None:
    """ "basemodel_pipeline.cache.build" -> "cache.build"; None outside the package."""
    if name == PACKAGE:
        return ""
    return name.removeprefix(PACKAGE + ".") if name.startswith(PACKAGE + ".") else None


def imports_of(module: str) -> set[str]:
    """The library modules `module` imports, anywhere in its body."""
    path, known = modules()[module], modules()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _absolute(alias.name)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = _absolute(node.module or "")
            if target is None:
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != module}


@cache
def graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(imports_of(m)) for m in modules()}


def layer_of(module: str) -> int:
    top = module.split(".")[0]
    for i, (_, members) in enumerate(LAYERS):
        if top in members:
            return i
    raise KeyError(module)


def upward(a: str, b: str) -> bool:
    return layer_of(a) < layer_of(b)


def cycles(edges: dict[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def reachable(edges: dict[str, Iterable[str]], src: str) -> set[str]:
    """The modules `src` imports through one or more edges (`src` itself only through a cycle)."""
    seen: set[str] = set()
    todo = [src]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def reaches(edges: dict[str, Iterable[str]], src: str, dst: str) -> bool:
    return dst in reachable(edges, src)


def allowed_edges() -> set[tuple[str, str]]:
    return {(a, b) for a, _, b in (entry.partition(" -> ") for entry in ALLOWED)}


def _without_allowed() -> dict[str, set[str]]:
    allowed = allowed_edges()
    return {a: {b for b in bs if (a, b) not in allowed} for a, bs in graph().items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m or PACKAGE for m in modules() if not any(m.split(".")[0] in s for _, s in LAYERS))
    assert not unplaced, (
        f"modules in no layer (add them to LAYERS in this file and docs/architecture.md): {unplaced}"
    )
    tops = [name for _, members in LAYERS for name in members]
    assert len(tops) == len(set(tops)), "a name in two layers"
    gone = sorted(t for t in tops if t not in {m.split(".")[0] for m in modules()})
    assert not gone, f"LAYERS names modules that no longer exist (remove them): {gone}"


def test_imports_only_point_down() -> None:
    bad = sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
        for a, bs in _without_allowed().items()
        for b in bs
        if upward(a, b)
    )
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    found = cycles(_without_allowed())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_allow_list_only_shrinks() -> None:
    """Every allowed edge still exists and still breaks a rule (upward, or closing a cycle): remove the
    entry when the violation is gone."""
    full = graph()
    stale = sorted(
        f"{a} -> {b}"
        for a, b in allowed_edges()
        if a not in full or b not in full[a] or not (upward(a, b) or reaches(full, b, a))
    )
    assert not stale, "ALLOWED entries that no longer break a rule (delete them):\n" + "\n".join(stale)


def test_the_model_knows_no_workspace() -> None:
    """model/ takes file primitives (atomic writes, staging, manifests, version names) from the ground floor's
    file modules, never the workspace's layout: its callers pass the directories in."""
    bad = sorted(m for m, deps in graph().items() if m.startswith("model.") and "workspace" in deps)
    assert not bad, f"modules of model/ that import basemodel_pipeline.workspace: {bad}"


def test_the_checker_sees_lazy_imports_and_cycles() -> None:
    """The checker itself: a function-level import is an edge, and a cycle through three modules is found."""
    assert "inference.embed" in graph()["pipeline"]  # pipeline imports its stages inside functions
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []


# The one private import, and why: per-day data versions of a ranged extract have no public API in Dagster
# 1.13 (dagster-io/dagster#34013); test_orchestration_sensors.py::
# test_overlapping_ranges_keep_each_days_version_and_only_a_changed_day_rebuilds_the_cache fails if it stops working.
PRIVATE_DAGSTER_ALLOWED = {"defs.shared.execution: dagster._core.definitions.source_asset"}


def test_no_private_dagster_imports() -> None:
    """The Dagster layer uses Dagster's public API (`import dagster as dg`), never `dagster._core` and the like:
    private modules move between releases without notice (PRIVATE_DAGSTER_ALLOWED: the one exception)."""
    bad = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{module or PACKAGE}: {n}" for n in names if n.startswith("dagster._")]
    bad = [b for b in bad if b not in PRIVATE_DAGSTER_ALLOWED]
    assert not bad, "private Dagster imports:\n" + "\n".join(sorted(bad))


def test_design_citations_name_a_section_of_docs_design() -> None:
    """Comments cite the design notes as `docs/design.md, "<section>"`; each such section exists (the notes
    live in the repository, not in a document elsewhere)."""
    import re

    repo = ROOT.parent
    sections = set(re.findall(r"^## (.+)$", (repo / "docs" / "design.md").read_text(), re.M))
    cited: dict[str, set[str]] = {}
    for path in [*repo.glob("basemodel_pipeline/**/*.py"), *repo.glob("bench/*.py"), *repo.glob("docs/*.md")]:
        if path.name == "design.md":
            continue
        for name in re.findall(r'design\.md\)?,?\s*\(?"([^"]+)"', path.read_text()):
            cited.setdefault(name, set()).add(path.name)
    assert cited, "no citation found: the pattern is out of date"
    missing = {name: sorted(files) for name, files in cited.items() if name not in sections}
    assert not missing, f"citations of sections docs/design.md does not have: {missing}"


def test_every_package_has_an_init_with_a_docstring() -> None:
    """No namespace packages: every directory of modules has an __init__.py that says what it holds."""
    bad = []
    for directory in sorted({p.parent for p in ROOT.rglob("*.py")}):
        init = directory / "__init__.py"
        if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text())):
            bad.append(str(directory.relative_to(ROOT.parent)))
    assert not bad, f"packages without an __init__.py docstring: {bad}"


# ---- sizes: modules small enough to read at once, training functions that read top to bottom ----------------
MODULE_LINES = 460  # "no module over ~450 lines"
FUNCTION_LINES = 85  # "no function over ~80 lines in training/, candidates/ and scenarios/"
OVERSIZE: dict[str, str] = {}  # modules still over MODULE_LINES, each to split; the list only shrinks


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_modules_are_small_enough_to_read_at_once() -> None:
    sizes = {name: _lines(path) for name, path in modules().items()}
    over = sorted(f"{n} ({k} lines)" for n, k in sizes.items() if k > MODULE_LINES and n not in OVERSIZE)
    assert not over, f"modules over {MODULE_LINES} lines (split them): {over}"
    stale = sorted(n for n in OVERSIZE if sizes.get(n, 0) <= MODULE_LINES)
    assert not stale, f"OVERSIZE entries now small enough (delete them): {stale}"


def test_training_candidate_and_scenario_functions_read_top_to_bottom() -> None:
    long = []
    for name, path in modules().items():
        if not name.startswith(("training.", "candidates.", "scenarios.")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long.append(f"{name}.{node.name} ({length} lines)")
    assert not long, f"functions over {FUNCTION_LINES} lines in training/, candidates/ and scenarios/: {long}"


def test_copying_to_object_storage_is_called_upload() -> None:
    """ "publish" is the atomic switch of what readers see (files.publish_dir, a warehouse table swapped in, the
    published candidate); copying finished artifacts to s3:// is "upload" (ops/upload.py, its Dagster face
    defs/upload/; docs/architecture.md, "Words"): no module of that name, nothing importing one."""
    assert {"ops.upload", "defs.upload"} <= set(modules())
    old = ("ops.publish", "defs.publish")
    bad = sorted(m for m in modules() if m.startswith(old))
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            bad += [
                f"{module or PACKAGE}: {n}"
                for n in names
                if n.startswith(tuple(f"{PACKAGE}.{o}" for o in old))
            ]
    assert not bad, "S3 uploads named publish:\n" + "\n".join(bad)
