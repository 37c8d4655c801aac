"""The packages' layering, read from the source: lower layers never import higher ones, no
module imports another that imports it back (however indirectly, function-local and
type-checking imports included), and every function-local import says why it is local.

    common <- artifacts <- runtime <- calibration <- pipeline <- ingot (CLI, LLM)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# (directory, import name), lowest layer first.
LAYERS = (
    ("common", "ingot.common"),
    ("artifacts", "ingot.artifacts"),
    ("runtime", "ingot.runtime"),
    ("calibration", "ingot.calibration"),
    ("pipeline", "ingot.pipeline"),
    ("ingot", "ingot"),
)


@dataclass
class Module:
    name: str
    file: Path
    layer: int
    imports: dict[str, int] = field(default_factory=dict)  # imported module -> line
    local: list[tuple[int, str]] = field(default_factory=list)  # function-local imports


def _modules() -> dict[str, Module]:
    found = {}
    for layer, (directory, package) in enumerate(LAYERS):
        for file in sorted((ROOT / directory).rglob("*.py")):
            parts = list(file.relative_to(ROOT / directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            found[name] = Module(name, file, layer)
    return found


MODULES = _modules()


def _target(module: Module, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The ingot modules an import statement loads (the deepest module each name resolves to)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.name.split(".")
            if module.file.name != "__init__.py":
                package.pop()
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, *([node.module] if node.module else [])])
        names = [f"{base}.{alias.name}" for alias in node.names]
    targets = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module.name:
            targets.append(name)
    return targets


def _read_imports() -> None:
    for module in MODULES.values():
        tree = ast.parse(module.file.read_text())
        in_function = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                in_function |= {
                    id(sub)
                    for sub in ast.walk(node)
                    if sub is not node and isinstance(sub, ast.Import | ast.ImportFrom)
                }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if id(node) in in_function:
                module.local.append((node.lineno, ast.unparse(node)))
            for target in _target(module, node):
                module.imports.setdefault(target, node.lineno)


_read_imports()


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in MODULES[name].imports:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in MODULES:
        if name not in index:
            visit(name)
    return found


def test_the_walk_finds_the_packages():
    assert {"ingot.common.registry", "ingot.runtime.generate", "ingot.cli"} <= set(MODULES)
    assert "ingot.runtime.generate" in MODULES["ingot.runtime.model"].imports


def test_lower_layers_never_import_higher_ones():
    wrong = [
        f"{m.name} ({m.file.relative_to(ROOT)}:{line}) imports {target}"
        for m in MODULES.values()
        for target, line in m.imports.items()
        if MODULES[target].layer > m.layer
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    assert not _cycles(), _cycles()


@pytest.mark.parametrize("layer", [name for _, name in LAYERS])
def test_function_local_imports_say_why(layer):
    """A function-local import is for an optional heavy dependency (torch in a command of the
    CLI, requests only when a registry is named): a comment on its line or the line above
    says so, as the style guide asks."""
    silent = []
    for module in MODULES.values():
        if MODULES[module.name].layer != [n for _, n in LAYERS].index(layer):
            continue
        lines = module.file.read_text().splitlines()
        for lineno, statement in module.local:
            here = lines[lineno - 1]
            above = lines[lineno - 2].strip() if lineno > 1 else ""
            # A group of imports shares the comment above its first line.
            k = lineno - 2
            while k > 0 and lines[k].strip().startswith(("from ", "import ")):
                k -= 1
            group_above = lines[k].strip() if k >= 0 else ""
            if "#" not in here and not above.startswith("#") and not group_above.startswith("#"):
                silent.append(f"{module.file.relative_to(ROOT)}:{lineno}: {statement}")
    assert not silent, "function-local imports without a comment saying why:\n" + "\n".join(silent)
