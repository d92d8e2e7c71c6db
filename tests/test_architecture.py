"""The import rule of docs/architecture.md, checked on the source tree (AST; of ours only jpwr.__all__ is imported).

Layers only point down: the meter (jpwr) imports nothing of ours and no framework at module
level; the core (joulebench outside joulebench.analysis) imports no driver and no analysis;
drivers never import each other or analysis; analysis never imports a driver. Outside jpwr, product
code (the core, analysis, drivers, workflows, container tooling, GPU scripts) imports only the meter's
public names, `from jpwr import X` with X in `jpwr.__all__`: the rest of jpwr is private to it. Imports
inside functions count too (a lazy import is still a dependency), except the framework rule, which is
about what `import jpwr` loads. tests/ may reach into jpwr's modules: they test the meter's parts.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import jpwr

REPO = Path(__file__).resolve().parent.parent
DRIVERS = ("llm_training", "resnet50", "llm_inference")
OURS = ("jpwr", "joulebench", *DRIVERS)
PRODUCT = ("jpwr", "joulebench", *DRIVERS, "jube", "container", "benchmarks")  # every file here follows the rule
FRAMEWORKS = ("torch", "tensorflow", "keras", "transformers", "megatron", "matplotlib", "pandas")
ENTRY_POINTS = ("joulebench/__main__.py",)  # `python -m joulebench` starts the analysis CLI by design
# A GPU script that checks one of the meter's parts itself, as tests/jpwr does with fakes: it may reach inside.
METER_PROBES = ("benchmarks/check_nvml_backend.py",)  # the nvml backend against nvidia-ml-py on a real GPU


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # dotted name of the importing module
    target: str  # dotted name imported
    line: int
    top_level: bool  # at module level (not inside a function)
    names: tuple[str, ...] = ()  # `from target import names`; for `import target`, the attributes used on it


def layer(module: str) -> str | None:
    """'meter', 'core', 'analysis', a driver's name, or None for code outside the layers."""
    top = module.split(".")[0]
    if top == "jpwr":
        return "meter"
    if top == "joulebench":
        return "analysis" if module.startswith("joulebench.analysis") else "core"
    return top if top in DRIVERS else None


def imports_of(path: Path, root: Path) -> list[Import]:
    module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    tree = ast.parse(path.read_text(), filename=str(path))
    function_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                      for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(alias.name, _attributes_of(tree, alias.asname or alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            targets = [(base, tuple(alias.name for alias in node.names))]
        else:
            continue
        found += [Import(module, t, node.lineno, id(node) not in function_nodes, names) for t, names in targets]
    return found


def _attributes_of(tree: ast.Module, name: str) -> tuple[str, ...]:
    """The attributes read on an imported module's name (`jpwr.X` after `import jpwr`)."""
    return tuple(sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == name}))


def violations(root: Path, public: Collection[str] = tuple(jpwr.__all__)) -> list[str]:
    """Every import that breaks the rule, as 'file:line: module imports target (why)'."""
    problems = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ENTRY_POINTS:
                continue
            for imp in imports_of(path, root):
                why = _breaks(imp) or (None if rel in METER_PROBES else _private(imp, public))
                if why:
                    problems.append(f"{rel}:{imp.line}: {imp.module} imports {imp.target} ({why})")
    return problems


def _private(imp: Import, public: Collection[str]) -> str | None:
    """Outside the meter, only its public names: `from jpwr import X` with X in jpwr.__all__."""
    if layer(imp.module) == "meter" or layer(imp.target) != "meter":
        return None
    if imp.target != "jpwr":
        return "outside jpwr, import its public names: from jpwr import X"
    hidden = [name for name in imp.names if name not in public]
    return f"{', '.join(hidden)} not in jpwr.__all__" if hidden else None


def _breaks(imp: Import) -> str | None:
    source, target = layer(imp.module), layer(imp.target)
    top = imp.target.split(".")[0]
    if source == "meter":
        if target not in (None, "meter"):
            return "the meter imports nothing of the benchmarks built on it"
        if imp.top_level and top in FRAMEWORKS:
            return "the meter loads no framework at import time"
    if source == "core" and target not in (None, "meter", "core"):
        return "the core imports only the meter"
    if source in DRIVERS and target not in (None, "meter", "core", source):
        return "a driver imports only the meter, the core and itself"
    if source == "analysis" and target in DRIVERS:
        return "analysis reads records, it never imports a driver"
    return None


def test_the_tree_follows_the_import_rule():
    assert violations(REPO) == []


def test_a_forbidden_import_is_caught(tmp_path):
    """The rule's own negative cases: each planted import must be reported, with its reason."""
    planted = {
        "jpwr/bad_meter.py": "from joulebench.record import RunRecord\n",
        "jpwr/bad_framework.py": "import torch\n",
        "joulebench/bad_core.py": "def f():\n    from llm_training import train\n",
        "joulebench/analysis/bad_analysis.py": "import resnet50.driver\n",
        "llm_inference/bad_driver.py": "from llm_training.flops import parameter_count\n",
        "resnet50/bad_driver.py": "from joulebench.analysis import report\n",
        "jpwr/fine_lazy_framework.py": "def f():\n    import torch\n",
        "llm_training/fine.py": "from joulebench.record import RunRecord\nfrom jpwr import WindowMeter\n",
        "jpwr/fine_private.py": "from jpwr.trace_io import read_hdf5\n",  # inside the meter, its modules are its own
        "joulebench/analysis/bad_private.py": "def f():\n    from jpwr.trace_io import read_hdf5\n",
        "benchmarks/bad_private_name.py": "from jpwr import WindowMeter, read_hdf5\n",
        "container/bad_private_attribute.py": "import jpwr\n\njpwr.trace.read_hdf5\n",
        "jube/fine_public_attribute.py": "import jpwr\n\njpwr.load_trace\n",
    }
    for rel, text in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = violations(tmp_path)
    assert {line.split(":")[0] for line in found} == {rel for rel in planted if "bad_" in rel}
    assert any("the meter loads no framework" in line for line in found)
    assert any("read_hdf5 not in jpwr.__all__" in line for line in found)
    assert any("from jpwr import X" in line for line in found)


def test_every_public_name_of_the_meter_loads_and_import_jpwr_stays_cheap():
    """jpwr.__all__ is what product code may import: each name resolves, and `import jpwr` alone loads no numpy."""
    assert all(getattr(jpwr, name) is not None for name in jpwr.__all__)
    probe = "import sys, jpwr; print(sorted(m for m in ('numpy', 'h5py', 'jpwr.meter') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"


def test_the_meter_states_its_types_without_escape_hatches():
    """Results cross the meter's seams as dataclasses, so its code needs no `# type: ignore` (issue 29)."""
    marker = "type: " + "ignore"  # spelled apart so that this file does not match itself
    found = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "jpwr").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    assert found == []
