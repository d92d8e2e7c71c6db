"""The import rule of docs/architecture.md, checked on the source tree (AST), and the meter's API in tiers.

Layers only point down: the meter (jpwr) imports nothing of ours and no framework at module
level; the core (joulebench outside joulebench.analysis) imports no driver and no analysis;
drivers never import each other or analysis; analysis never imports a driver. Outside jpwr, product
code (the core, analysis, drivers, workflows, container tooling, GPU scripts) imports only the meter's
public names: `from jpwr import X` with X in `jpwr.__all__`, or `from jpwr.M import X` with M a public
submodule (its docstring starts "public: for") and X in its `__all__`; the rest of jpwr is private to it.
Of the core, drivers and jube/ import only the names joulebench.API declares, and analysis has no import circle.
Imports inside functions count too (a lazy import is still a dependency), except the framework rule, which
is about what `import jpwr` loads. tests/ may reach into jpwr's modules: they test the meter's parts.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import joulebench
import jpwr

REPO = Path(__file__).resolve().parent.parent
DRIVERS = ("llm_training", "resnet50", "llm_inference")
OURS = ("jpwr", "joulebench", *DRIVERS)
PRODUCT = ("jpwr", "joulebench", *DRIVERS, "jube", "container", "benchmarks")  # every file here follows the rule
FRAMEWORKS = ("torch", "tensorflow", "keras", "transformers", "megatron", "matplotlib", "pandas")
ENTRY_POINTS = ("joulebench/__main__.py",)  # `python -m joulebench` starts the analysis CLI by design
# A GPU script that checks one of the meter's parts itself, as tests/jpwr does with fakes: it may reach inside.
METER_PROBES = ("benchmarks/check_nvml_backend.py",)  # the nvml backend against nvidia-ml-py on a real GPU
# Private modules that scripts under one folder may still import: the selftest's GPU load is no API, but the
# benchmarks scripts that check the meter on a GPU run the same load so that their numbers compare.
SHARED_PRIVATE = {"jpwr.selftest_load": "benchmarks/"}
PUBLIC_MARK = "public: for"  # how a public submodule of jpwr starts its docstring
# jpwr.__all__, each name approved with the reason jpwr/__init__.py states for it. A new name needs a reason
# there and a place here; the list stays at most MAX_API long (issue 42): everything else goes to a public
# submodule that says whom it serves.
APPROVED_API = frozenset({
    "__version__", "WindowMeter", "Window", "WindowEnergy", "IdleBaseline", "IdlePlan", "SettleRule", "NodeLive",
    "ADDR_ENV", "JpwrError", "ValidationError", "FormatError", "MethodUnavailableError", "OutputDirError", "ExitCode",
})
MAX_API = 15


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # dotted name of the importing module
    target: str  # dotted name imported
    line: int
    top_level: bool  # at module level (not inside a function)
    names: tuple[str, ...] = ()  # `from target import names`; for `import target`, the dotted attributes read
    bound: str = ""  # for `import target`: the module its name is bound to (`import jpwr.trace` binds jpwr)


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
            bound = [alias.name if alias.asname else alias.name.split(".")[0] for alias in node.names]
            found += [Import(module, alias.name, node.lineno, id(node) not in function_nodes,
                             _attributes_of(tree, alias.asname or name), name)
                      for alias, name in zip(node.names, bound, strict=True)]
            continue
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
    """The dotted attributes read on an imported module's name (`trace.load_trace` for `jpwr.trace.load_trace`)."""
    chains = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if parts and isinstance(node, ast.Name) and node.id == name:
            chains.add(".".join(reversed(parts)))
    return tuple(sorted(chains))


def public_submodules(root: Path = REPO) -> dict[str, frozenset[str]]:
    """jpwr's public submodules (their docstring starts "public: for") -> their `__all__`, read from the source."""
    found = {}
    for path in sorted((root / "jpwr").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if not (ast.get_docstring(tree) or "").startswith(PUBLIC_MARK):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        names = [node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
        found[module] = frozenset(ast.literal_eval(names[0])) if names else frozenset()
    return found


def violations(root: Path, public: Collection[str] = tuple(jpwr.__all__),
               submodules: dict[str, frozenset[str]] | None = None,
               core_api: dict[str, dict[str, str]] = joulebench.API) -> list[str]:
    """Every import that breaks the rule, as 'file:line: module imports target (why)'."""
    submodules = public_submodules() if submodules is None else submodules
    problems = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ENTRY_POINTS:
                continue
            for imp in imports_of(path, root):
                shared = imp.target in SHARED_PRIVATE and rel.startswith(SHARED_PRIVATE[imp.target])
                private = None if rel in METER_PROBES or shared else _private(imp, public, submodules)
                why = _breaks(imp) or private or _undeclared(imp, core_api)
                if why:
                    problems.append(f"{rel}:{imp.line}: {imp.module} imports {imp.target} ({why})")
    return problems


def _private(imp: Import, public: Collection[str], submodules: dict[str, frozenset[str]]) -> str | None:
    """Outside the meter, only its public names: jpwr.__all__, and the `__all__` of its public submodules."""
    if layer(imp.module) == "meter" or layer(imp.target) != "meter":
        return None
    if imp.bound:  # `import jpwr[.M]`: the module itself and every attribute read through its name
        base = imp.bound.split(".")[1:]
        paths = [imp.target.split(".")[1:], *(base + name.split(".") for name in imp.names)]
    else:  # `from jpwr[.M] import X`
        paths = [[*imp.target.split(".")[1:], name] for name in imp.names]
    hidden = [".".join(path) for path in paths if path and not _is_public(path, public, submodules)]
    if not hidden:
        return None
    return (f"{', '.join(hidden)} not public: import a name of jpwr.__all__ (from jpwr import X) or of a public "
            "submodule's __all__ (from jpwr.trace import Y)")


def core_names(imp: Import) -> list[str]:
    """The core names an import takes, dotted ('joulebench.record.RunRecord'); the core is joulebench outside
    joulebench.analysis. `import joulebench.M` takes each attribute read through its name (reading a module on the
    way to a name takes that name only)."""
    if layer(imp.target) != "core":
        return []
    if imp.bound:
        chains = [".".join([imp.bound, name]) for name in imp.names]
        return [c for c in chains if not any(other.startswith(f"{c}.") for other in chains)] or [imp.target]
    return [f"{imp.target}.{name}" for name in imp.names]


def _undeclared(imp: Import, core_api: dict[str, dict[str, str]]) -> str | None:
    """Drivers and jube/ import only the core's declared API (joulebench.API): a name of a declared module."""
    if layer(imp.module) not in DRIVERS and imp.module.split(".")[0] != "jube":
        return None
    hidden = [name for name in core_names(imp)
              if name.rpartition(".")[2] not in core_api.get(name.rpartition(".")[0], {})]
    if not hidden:
        return None
    return (f"{', '.join(hidden)} not in the core's API: use a name of joulebench.API, or declare it there with the "
            "reason a driver or jube needs it")


def _is_public(path: list[str], public: Collection[str], submodules: dict[str, frozenset[str]]) -> bool:
    """A path below jpwr (['trace', 'load_trace']): a top-level public name, a public submodule, or a name
    in that submodule's `__all__`; what lies below a public name is its own (`WindowMeter.open`)."""
    if path[0] in public:
        return True
    module = f"jpwr.{path[0]}"
    return module in submodules and (len(path) == 1 or path[1] in submodules[module])


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


def import_cycles(root: Path, package: str = "joulebench.analysis") -> list[list[str]]:
    """The package's modules that import one another in a circle (lazy and type-checking imports count: each is a
    dependency), as the modules of each strongly connected set; `from package import module` names the module."""
    folder = root.joinpath(*package.split("."))
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in sorted(folder.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for imp in imports_of(path, root):
            targets = [f"{imp.target}.{name}" for name in imp.names if f"{imp.target}.{name}" in modules]
            graph[module] |= {t for t in [*targets, imp.target] if t in modules and t != module}
    reach = {m: _reachable(graph, m) for m in graph}
    circles = {frozenset(n for n in reach[m] if m in reach[n]) | {m} for m in graph if m in reach[m]}
    return sorted(sorted(c) for c in circles)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph[node]
    return seen


def test_analysis_has_no_import_circle(tmp_path):
    """Analysis' modules form layers too (issue 57): the run layer (runs) under the verbs, no two importing each
    other, lazily or not; a planted circle is found."""
    assert import_cycles(REPO) == []
    planted = {"a.py": "from joulebench.analysis import b\n",
               "b.py": "def f():\n    from joulebench.analysis.c import x\n",
               "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from joulebench.analysis.a import y\n",
               "d.py": "from joulebench.analysis import a\n"}
    for name, text in planted.items():
        path = tmp_path / "joulebench" / "analysis" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert import_cycles(tmp_path) == [["joulebench.analysis.a", "joulebench.analysis.b", "joulebench.analysis.c"]]


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
        "joulebench/analysis/bad_private_module.py": "import jpwr.trace_io\n",
        "benchmarks/bad_private_name.py": "from jpwr import WindowMeter, read_hdf5\n",
        "jube/bad_moved_name.py": "from jpwr import load_trace\n",  # moved to jpwr.trace: the top level has it no more
        "llm_training/bad_unlisted_name.py": "from jpwr.estimator import planned_bound_j, counter_window\n",
        "container/bad_private_attribute.py": "import jpwr\n\njpwr.trace.read_hdf5\n",
        "resnet50/bad_private_alias_attribute.py": "import jpwr.output as out\n\nout.known_fields\n",
        "jube/fine_public_attribute.py": "import jpwr\n\njpwr.WindowMeter.open\njpwr.trace.load_trace\n",
        "llm_inference/fine_public_submodule.py": "from jpwr.trace import load_trace\nimport jpwr.output as out\n\n"
                                                  "out.fmt\n",
        "benchmarks/fine_selftest_load.py": "from jpwr.selftest_load import MATMUL_N\n",  # shared with benchmarks/
        "joulebench/bad_selftest_load.py": "from jpwr.selftest_load import MATMUL_N\n",  # ... and no one else
    }
    for rel, text in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = violations(tmp_path)
    assert {line.split(":")[0] for line in found} == {rel for rel in planted if "bad_" in rel}
    assert any("the meter loads no framework" in line for line in found)
    for hidden in ("trace_io.read_hdf5", "trace_io", "read_hdf5", "load_trace", "estimator.counter_window",
                   "trace.read_hdf5", "output.known_fields", "selftest_load.MATMUL_N"):
        assert any(f"({hidden} not public: import a name of jpwr.__all__" in line for line in found), hidden
    assert not any("planned_bound_j" in line for line in found)  # in jpwr.estimator.__all__: only its neighbour


def test_a_driver_or_jube_importing_an_undeclared_core_name_is_caught(tmp_path):
    """The core's API rule on planted sources, through the same checker: an undeclared name or module fails, a
    declared one passes, and analysis (which reads records beside the core) is not held to it."""
    planted = {
        "llm_training/bad_name.py": "from joulebench.record import RunRecord, parse_record\n",
        "resnet50/bad_module.py": "def f():\n    from joulebench.savings import saving\n",
        "jube/bad_attribute.py": "import joulebench.record\n\njoulebench.record.parse_record\n",
        "llm_inference/bad_submodule.py": "from joulebench import lifecycle\n",
        "llm_inference/fine.py": "from joulebench.record import RunRecord\nfrom joulebench.lifecycle import Lifecycle\n"
                                 "import joulebench.record as rec\n\nrec.RunRecord\n",
        "jube/fine_attribute.py": "import joulebench.record\n\njoulebench.record.RunRecord\n",
        "joulebench/analysis/fine_analysis.py": "from joulebench.savings import saving\n",
    }
    for rel, text in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    api = {"joulebench.record": {"RunRecord": "the record"}, "joulebench.lifecycle": {"Lifecycle": "the life"}}
    found = violations(tmp_path, core_api=api)
    assert {line.split(":")[0] for line in found} == {rel for rel in planted if "bad_" in rel}
    for hidden in ("joulebench.record.parse_record", "joulebench.savings.saving", "joulebench.lifecycle"):
        assert any(f"({hidden} not in the core's API" in line for line in found), hidden
    assert not any("RunRecord" in line for line in found)


def test_the_core_api_is_what_drivers_and_jube_use_each_name_with_its_reason():
    """joulebench.API (issue 57): each declared name loads from its module and states why a driver or jube needs it,
    and each is imported by a driver or jube today (a name no longer used leaves the declaration)."""
    used = {name for package in (*DRIVERS, "jube") for path in sorted((REPO / package).rglob("*.py"))
            for imp in imports_of(path, REPO) for name in core_names(imp)}
    declared = {f"{module}.{name}" for module, names in joulebench.API.items() for name in names}
    assert sorted(declared - used) == []
    for module, names in joulebench.API.items():
        loaded = importlib.import_module(module)
        for name, reason in names.items():
            assert hasattr(loaded, name), f"{module}.{name}"
            assert len(reason.split()) >= 4, f"joulebench.API[{module!r}][{name!r}] states no reason"


def test_the_docs_group_every_module_of_the_core_api():
    """docs/architecture.md ("The core's API"): its table names exactly the modules joulebench.API declares."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text[text.index("## The core's API"):]
    section = section[: section.index("\n## ", 1)]
    rows = [line.rsplit("|", 2)[1] for line in section.splitlines() if line.startswith("| ") and "modules" not in line]
    documented = {f"joulebench.{name}" for row in rows for name in _listed(row, r"[a-z_][\w.]*")}
    assert documented == set(joulebench.API)


def test_the_top_level_api_grows_only_with_a_listed_reason():
    """jpwr.__all__ is what a user of the meter needs (issue 42): a name added without a place in APPROVED_API and
    a reason in jpwr/__init__.py fails here, and the list stays at most MAX_API long."""
    assert len(jpwr.__all__) <= MAX_API
    assert set(jpwr.__all__) == APPROVED_API, (
        f"jpwr.__all__ changed: added {sorted(set(jpwr.__all__) - APPROVED_API)}, removed "
        f"{sorted(APPROVED_API - set(jpwr.__all__))}; a top-level name needs a reason in jpwr._API and a place "
        "in APPROVED_API, else it belongs in a public submodule")
    assert len(jpwr.__all__) == len(set(jpwr.__all__))
    for name, (home, reason) in jpwr._API.items():
        assert len(reason.split()) >= 4, f"jpwr._API[{name!r}] states no reason"
        assert getattr(importlib.import_module(home), name) is getattr(jpwr, name)


def test_each_public_submodule_says_whom_it_serves_and_each_public_name_has_one_home():
    """A public submodule's docstring starts "public: for <whom>", its `__all__` names all load, and no name is
    public in two places (one import line per name, whichever file writes it)."""
    submodules = public_submodules()
    assert {"jpwr.trace", "jpwr.output", "jpwr.arguments", "jpwr.devices", "jpwr.errors"} <= set(submodules)
    assert "jpwr.selftest_load" not in submodules  # the selftest's load is shared with benchmarks/, not API
    homes: dict[str, str] = {name: "jpwr" for name in jpwr.__all__}
    for module, names in submodules.items():
        loaded = importlib.import_module(module)
        assert len(loaded.__doc__.removeprefix(PUBLIC_MARK).split("\n")[0].split()) >= 2, f"{module}: for whom?"
        assert names and set(loaded.__all__) == names, f"{module} needs a literal __all__"
        assert all(getattr(loaded, name) is not None for name in names)
        for name in names:
            assert name not in homes, f"{name} is public in both {homes[name]} and {module}"
            homes[name] = module


def documented_tiers(section: str) -> dict[str, set[str]]:
    """The names "The meter's API" lists per tier: 'jpwr' -> tier 1's table, each public submodule -> its row of
    tier 2's table. A name is listed as a backticked word outside parentheses (inside them are its methods, notes)."""
    top, submodules = section.split("**2.", 1)
    tiers = {"jpwr": {name for line in top.splitlines() if line.startswith("| ") for name in _listed(line)}}
    for line in submodules.splitlines():
        found = re.match(r"\| `(jpwr\.\w+)` \|", line)
        if found:
            tiers[found[1]] = _listed(line.rstrip(" |").rsplit("|", 1)[1])
    return tiers


def _listed(cell: str, name: str = r"[A-Za-z_]\w*") -> set[str]:
    """The backticked names of a table cell outside its parentheses (`name`: the pattern of one)."""
    while re.search(r"\([^()]*\)", cell):
        cell = re.sub(r"\([^()]*\)", "", cell)
    return set(re.findall(f"`({name})`", cell))


def test_the_docs_list_every_tier_of_the_meter_api_as_the_code_does():
    """docs/architecture.md ("The meter's API"): tier 1's table lists exactly jpwr.__all__ and tier 2's table each
    public submodule with exactly its `__all__`; a name added to the code and not to the doc fails here."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text[text.index("## The meter's API"):]
    section = section[: section.index("\n## ", 1)]
    documented = documented_tiers(section)
    code = {"jpwr": set(jpwr.__all__), **{m: set(names) for m, names in public_submodules().items()}}
    assert documented.keys() == code.keys()
    differ = {tier: {"not in the doc": sorted(code[tier] - documented[tier]),
                     "not in the code": sorted(documented[tier] - code[tier])}
              for tier in code if documented[tier] != code[tier]}
    assert differ == {}


def test_the_tier_check_catches_a_missing_name():
    """The check above on a doc row that misses a name and names one in parentheses only."""
    row = "| `jpwr.output` | writers | `fmt` (\"n/a\", never 0), `atomic_path` (the writer; `atomic_paths` too) |\n"
    assert documented_tiers("| | names |\n| x | `Window` |\n**2. ...\n" + row) == {
        "jpwr": {"Window"}, "jpwr.output": {"fmt", "atomic_path"}}


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
