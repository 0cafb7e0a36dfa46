"""The package's imports form no cycle and flow one way (the layering of ``docs/design.md``):
every module under ``src/jaxmoe``, module-level and function-level imports alike, read with
``ast`` (nothing is imported to find them)."""

from __future__ import annotations

import ast
import pathlib
import re

import jaxmoe

PACKAGE_ROOT = pathlib.Path(jaxmoe.__file__).parent


def module_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every ``.py`` file under the package ``root``."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported_names(tree: ast.AST, module: str, is_package: bool):
    """Dotted names each import statement of ``module`` may load (a module, or a module's
    attribute, resolved later), relative imports made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):  # ast.walk reaches imports inside functions too
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package's modules that importing it runs first.

    Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too: those parent packages
    count, except the importer's own ancestors (already running when it is imported).
    """
    modules = module_files(root)
    graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        own_ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        if is_package:
            own_ancestors.add(module)
        targets = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported_names(tree, module, is_package):
            if name not in modules:
                continue  # a name inside a module (its module is yielded too), or not ours
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in modules and target not in own_ancestors and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_package_has_no_import_cycle():
    graph = import_graph(PACKAGE_ROOT)
    assert len(graph) > 30, sorted(graph)  # every module was read
    assert "jaxmoe.parallel.sharded" in graph["jaxmoe.layer"]
    assert find_cycles(graph) == []


def test_cycle_finder_sees_a_function_level_loop(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg import a  # a loop\n")
    (package / "c.py").write_text("from . import a\nfrom .sub.b import f\n")
    graph = import_graph(package)
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub", "pkg.sub.b"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    (package / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert find_cycles(import_graph(package)) == []


# Modules below everything else: they import nothing of jaxmoe but each other.
FOUNDATION = (
    "jaxmoe.compat",
    "jaxmoe.argument_checks",
    "jaxmoe.option_names",
    "jaxmoe.field_rules",
    "jaxmoe.sorted_search",
    "jaxmoe.debug",
    "jaxmoe.forward_mode",
    "jaxmoe.multilinear",
)
# One file per backend of an op (``jaxmoe.ops.<op>.pallas_*``, ``jaxmoe.ops.<op>.xla``) and the
# kernel code the ops share (the Mosaic GPU engine ``jaxmoe.ops.mosaic``,
# ``jaxmoe.ops.pallas_common``): only the ops and the benchmarks reach into them; everything
# else asks an op's API.
BACKEND_FILE = re.compile(r"jaxmoe\.ops\.(\w+\.(pallas\w*|xla)|mosaic(\.\w+)?|pallas_common)$")
# The Mosaic GPU engine sits below the ops that share it: it imports no op, only the modules the
# ops' kernels share.
ENGINE = "jaxmoe.ops.mosaic"
ENGINE_IMPORTS = (ENGINE, "jaxmoe.ops.pallas_common", "jaxmoe.ops.work_list")
# The permutation's weight gather is XLA's gather of a 1-D vector, which XLA fuses with its
# neighbours; it calls that backend's function directly rather than the op's dispatch.
BACKEND_FILE_EXCEPTIONS = {("jaxmoe.permutation", "jaxmoe.ops.row_gather.xla")}


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layering_violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """``(importer, imported, rule)`` for each import that breaks the layering:

    * the foundation modules import no other jaxmoe module;
    * ``jaxmoe.ops`` imports only itself and the foundation (no layer, parallel, nn, cli,
      bench);
    * nothing but ``jaxmoe.cli``, ``jaxmoe.bench`` and ``jaxmoe.__main__`` imports the command
      line or the benchmarks;
    * outside ``jaxmoe.ops`` only ``jaxmoe.bench`` imports an op's backend file or the kernels'
      shared modules (so the layer body asks the op, e.g.
      :func:`jaxmoe.ops.grouped_matmul.preferred_alignment`);
    * the Mosaic engine (``jaxmoe.ops.mosaic``) imports no op, only itself, the kernels' shared
      modules and the foundation.
    """
    found = []
    for importer, targets in sorted(graph.items()):
        for imported in sorted(targets):
            if _within(importer, *FOUNDATION) and not _within(imported, *FOUNDATION):
                found.append((importer, imported, "foundation imports jaxmoe"))
            if _within(importer, "jaxmoe.ops") and not _within(imported, "jaxmoe.ops", *FOUNDATION):
                found.append((importer, imported, "ops import above themselves"))
            if _within(imported, "jaxmoe.cli", "jaxmoe.bench") and not _within(
                importer, "jaxmoe.cli", "jaxmoe.bench", "jaxmoe.__main__"
            ):
                found.append((importer, imported, "library imports cli/bench"))
            if (
                BACKEND_FILE.match(imported)
                and not _within(importer, "jaxmoe.ops", "jaxmoe.bench")
                and (importer, imported) not in BACKEND_FILE_EXCEPTIONS
            ):
                found.append((importer, imported, "backend file imported outside its op"))
            if _within(importer, ENGINE) and not _within(imported, *ENGINE_IMPORTS, *FOUNDATION):
                found.append((importer, imported, "engine imports an op"))
    return found


def test_imports_follow_the_layering():
    graph = import_graph(PACKAGE_ROOT)
    assert {"jaxmoe.layer_body", "jaxmoe.ops.mosaic.tiles", "jaxmoe.ops.pallas_common"} <= set(
        graph
    )
    assert "jaxmoe.ops.mosaic.tiles" in graph["jaxmoe.ops.grouped_matmul.pallas_mosaic"]
    assert "jaxmoe.ops.grouped_matmul" in graph["jaxmoe.layer_body"]
    assert layering_violations(graph) == []


def test_the_layer_body_imports_no_backend_file():
    graph = import_graph(PACKAGE_ROOT)
    assert not any(BACKEND_FILE.match(name) for name in graph["jaxmoe.layer_body"])


def test_layering_rules_catch_each_break():
    graph = {
        "jaxmoe.layer_body": {"jaxmoe.ops.grouped_matmul.pallas_mosaic"},
        "jaxmoe.experts": {"jaxmoe.ops.mosaic.tiles", "jaxmoe.ops.pallas_common"},
        "jaxmoe.ops.grouped_matmul.api": {"jaxmoe.config", "jaxmoe.option_names"},
        "jaxmoe.ops.mosaic.launch": {"jaxmoe.ops.mosaic.tiles", "jaxmoe.ops.work_list"},
        "jaxmoe.ops.mosaic.tgmm_kernel": {"jaxmoe.ops.grouped_matmul.base", "jaxmoe.compat"},
        "jaxmoe.option_names": {"jaxmoe.config"},
        "jaxmoe.parallel.dispatch": {"jaxmoe.bench.timing"},
        "jaxmoe.bench.gemm": {"jaxmoe.ops.mosaic.tiles"},
        "jaxmoe.permutation": {"jaxmoe.ops.row_gather.xla"},
    }
    assert layering_violations(graph) == [
        ("jaxmoe.experts", "jaxmoe.ops.mosaic.tiles", "backend file imported outside its op"),
        ("jaxmoe.experts", "jaxmoe.ops.pallas_common", "backend file imported outside its op"),
        (
            "jaxmoe.layer_body",
            "jaxmoe.ops.grouped_matmul.pallas_mosaic",
            "backend file imported outside its op",
        ),
        ("jaxmoe.ops.grouped_matmul.api", "jaxmoe.config", "ops import above themselves"),
        ("jaxmoe.ops.mosaic.tgmm_kernel", "jaxmoe.ops.grouped_matmul.base", "engine imports an op"),
        ("jaxmoe.option_names", "jaxmoe.config", "foundation imports jaxmoe"),
        ("jaxmoe.parallel.dispatch", "jaxmoe.bench.timing", "library imports cli/bench"),
    ]


def private_name_uses(root: pathlib.Path) -> list[tuple[str, str]]:
    """``(module, name)`` for each private name (``_name``, not a dunder) that a module of the
    package ``root`` takes from another of its modules: ``from pkg.a import _name``, or
    ``a._name`` where ``a`` is an imported module of the package (``import pkg.a as a``,
    ``from pkg import a``, ``import pkg.a`` then ``pkg.a._name``)."""
    modules = module_files(root)

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found = []
    for module, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = {}  # local name -> the package's module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules or alias.name.split(".")[0] == root.name:
                        local = alias.asname or alias.name.split(".")[0]
                        aliases[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base not in modules:
                    continue
                for alias in node.names:
                    if private(alias.name) and base != module:
                        found.append((module, f"{base}.{alias.name}"))
                    if f"{base}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and private(node.attr)):
                continue
            parts, value = [], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if not isinstance(value, ast.Name) or value.id not in aliases:
                continue
            owner = ".".join([aliases[value.id], *reversed(parts)])
            if owner in modules and owner != module:
                found.append((module, f"{owner}.{node.attr}"))
    return sorted(set(found))


def test_no_module_uses_another_modules_private_name():
    assert private_name_uses(PACKAGE_ROOT) == []


def test_private_name_check_catches_each_form(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "def _helper():\n    return 1\n\n\ndef helper():\n    return _helper()\n"
    )
    (package / "sub" / "b.py").write_text("from pkg.a import _helper, helper\n")
    (package / "c.py").write_text("from pkg import a\n\n\ndef f():\n    return a._helper()\n")
    (package / "d.py").write_text(
        "import pkg.a as m\nimport pkg.a\n\nx = m._helper\ny = pkg.a._helper\n"
    )
    (package / "e.py").write_text(
        "from . import a\nfrom .a import helper\n\nz = a.helper, a.__name__\n"
    )
    (package / "f.py").write_text("import os\n\nw = os._exit\n")  # not the package's
    assert private_name_uses(package) == [
        ("pkg.c", "pkg.a._helper"),
        ("pkg.d", "pkg.a._helper"),
        ("pkg.sub.b", "pkg.a._helper"),
    ]
