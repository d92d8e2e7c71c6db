"""Static checks of the workflows: schema, references, dry run, documented tags; the pattern check used by
the end-to-end tests on real runs."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.jube.conftest import JUBE_DIR, LLM_XML, REPO, RESNET_XML, jube, requires_jube
from tests.jube.test_profile import jbprofile, jbworkloads

jbtable = sys.modules["jbtable"]  # loaded by jbprofile from the same directory

COMMON_XML = JUBE_DIR / "common.xml"
STEPS_XML = JUBE_DIR / "steps.xml"
INFERENCE_XML = JUBE_DIR / "inference_benchmark.xml"
WORKFLOWS = (LLM_XML, RESNET_XML, INFERENCE_XML)
BENCHMARK_OF = {LLM_XML: "llm", RESNET_XML: "resnet50", INFERENCE_XML: "inference"}
JUBE_DTD = Path("/usr/share/jube/contrib/schema/jube.dtd")  # shipped by Debian's jube package; never copied here


# JUBE's number macros (its pattern.py, the same in 2.5.1 and 2.7.x), for reading typed patterns with Python's re
JUBE_MACROS = {"$jube_pat_int": r"([+-]?\d+)", "$jube_pat_fp": r"([+-]?(?:\d*\.?\d+(?:[eE][-+]?\d+)?|\d+\.))"}
TYPED_SUFFIX = "_value"  # NAME_value: the typed twin of the printed pattern NAME (common.xml says why two)


def _root(path: Path) -> ET.Element:
    """The workflow as JUBE reads it: each <include from="F" path="P"/> replaced by the elements P of F."""
    root = ET.parse(path).getroot()
    for parent in list(root.iter()):
        for index, child in reversed(list(enumerate(parent))):
            if child.tag == "include":
                parent.remove(child)
                for offset, element in enumerate(_root(path.parent / child.get("from")).findall(child.get("path"))):
                    parent.insert(index + offset, element)
    return root


def _pattern_elements(path: Path) -> dict[str, ET.Element]:
    """Pattern name -> <pattern> of the workflow, including the shared ones used from common.xml."""
    return {p.get("name"): p for source in (path, COMMON_XML) for p in _root(source).iter("pattern")}


def _patterns(path: Path) -> dict[str, str]:
    """Pattern name -> regex as Python's re reads it (JUBE's macros expanded)."""
    expanded = {}
    for name, element in _pattern_elements(path).items():
        regex = element.text or ""
        for macro, value in JUBE_MACROS.items():
            regex = regex.replace(macro, value)
        expanded[name] = regex
    return expanded


def _typed(path: Path) -> dict[str, str]:
    """Typed pattern name -> the printed pattern it twins."""
    return {name: name.removesuffix(TYPED_SUFFIX) for name, element in _pattern_elements(path).items()
            if element.get("type") in ("int", "float")}


@pytest.mark.skipif(not (JUBE_DTD.exists() and shutil.which("xmllint")), reason="needs jube's DTD and xmllint")
@pytest.mark.parametrize("path", [*WORKFLOWS, COMMON_XML, STEPS_XML], ids=lambda p: p.name)
def test_valid_against_the_installed_jube_dtd(path: Path) -> None:
    argv = ["xmllint", "--noout", "--dtdvalid", str(JUBE_DTD), str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_reference_resolves(path: Path) -> None:
    root, common = _root(path), _root(COMMON_XML)
    local_sets = {e.get("name") for e in root.iter() if e.tag in ("parameterset", "patternset", "analyser")}
    common_sets = {e.get("name") for e in common.iter() if e.tag in ("parameterset", "patternset")}
    for use in root.iter("use"):
        names = {n.strip() for n in (use.text or "").split(",")}
        assert names <= (common_sets if use.get("from") == "common.xml" else local_sets), names
    steps = {s.get("name") for s in root.iter("step")}
    assert all(s.get("depend") in steps for s in root.iter("step") if s.get("depend"))
    assert {a.get("step") for a in root.iter("analyse")} <= steps
    patterns = _patterns(path)
    for column in root.iter("column"):
        assert column.text in patterns, f"column {column.get('title')} uses unknown pattern {column.text}"
    for element in root.iter():
        assert "," not in (element.get("tag") or ""), "a comma in a tag expression is an error in JUBE 2.7"


def _full_keys(path: Path) -> list[str]:
    """The JB keys of the workflow's full table (jube/jbtable.py), in its column order."""
    return [key for _, key in jbtable.columns(jbworkloads.WORKLOADS[BENCHMARK_OF[path]])]


def _key_of(regex: str) -> str:
    """The JB key a pattern reads (`^JB energy_per_output_token_j=(\\S+)` -> energy_per_output_token_j)."""
    found = re.match(r"\^JB (\w+)=", regex)
    assert found, regex
    return found.group(1)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_sweep_parameter_has_a_column_in_the_full_table_and_reaches_jbprofile(path: Path) -> None:
    """The coordinate patterns are generated from the sweep parameterset (jube/jbcolumns.py), the full table's
    coordinate columns from the same names; jbprofile knows each parameter (an unknown one would be refused at
    validate) and JUBE exports each to it."""
    proc = subprocess.run([sys.executable, str(JUBE_DIR / "jbcolumns.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = [s for s in _root(path).iter("parameterset") if s.get("name") == "sweep"]
    names = list(dict.fromkeys(p.get("name") for p in sweep.iter("parameter")))
    assert tuple(names) == jbworkloads.WORKLOADS[BENCHMARK_OF[path]].sweep_keys
    assert all(p.get("export") == "true" for p in sweep.iter("parameter"))
    assert [key for key in _full_keys(path) if key.startswith("coord_")] == [f"coord_{n}" for n in names]
    assert '--sweep "$jube_wp_envlist"' in next(d.text for d in _root(path).iter("do") if "prepare" in (d.text or ""))


OTHER_BENCHMARKS_KEYS = {  # shared patterns (common.xml) that are training's, not inference's, or the other's
    LLM_XML: ("batch_per_device",), RESNET_XML: ("tp_pp_dp",),
    INFERENCE_XML: ("batch_per_device", "tp_pp_dp", "devices", "iterations", "time_per_iteration_s",
                    "model_tflops_per_device", "mfu")}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_full_table_has_every_figure_and_jubes_tables_only_columns_of_it(path: Path) -> None:
    """Narrowing JUBE's tables (at most 160 characters, tests/jube/test_local.py) loses nothing: the full table has a
    column for every line the analyser reads except the note's short form, which only the default table shows, and
    shared patterns another benchmark's columns give; no JUBE table is a CSV table (JUBE prints every table)."""
    tables = list(_root(path).iter("table"))
    assert all(table.get("style") == "pretty" for table in tables)
    patterns = _patterns(path)
    used = {name for s in _root(path).iter("analyser") for use in s.iter("use")
            for name in (use.text or "").split(",")}
    sets = [*_root(path).iter("patternset"), *_root(COMMON_XML).iter("patternset")]
    read = {_key_of(patterns[p.get("name")]) for s in sets if s.get("name") in used for p in s.iter("pattern")}
    full = _full_keys(path)
    assert len(full) == len(set(full))
    assert read - {"short_note", *OTHER_BENCHMARKS_KEYS[path]} <= set(full)
    assert set(full) <= read  # every column of the full table is a line JUBE reads too
    shown = {_key_of(patterns[c.text]) for table in tables for c in table.iter("column")}
    assert shown - {"short_note"} <= set(full)
    default = next(table for table in tables if table.get("name") == BENCHMARK_OF[path])
    assert len(list(default.iter("column"))) < len(full) / 2


@requires_jube
@pytest.mark.parametrize(("path", "tags"), [(LLM_XML, ["CI", "tiny"]), (RESNET_XML, ["A100", "pytorch"]),
                                           (INFERENCE_XML, ["CI", "tiny"])])
def test_jube_dry_run_parses_and_expands(path: Path, tags: list[str], jube_env: dict[str, str]) -> None:
    proc = jube("--debug", "run", str(path), "--tag", *tags, env=jube_env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for log in (JUBE_DIR / "jube-debug.log", JUBE_DIR / "jube-parse.log"):
        log.unlink(missing_ok=True)


def _documented_tags(text: str) -> list[str]:
    """Tags after --tag/-t in every `jube run` line of a document."""
    tags: list[str] = []
    for line in re.findall(r"jube run [^\n`]*", text):
        match = re.search(r"(?:--tag|-t)\s+([^|&;>#]*)", line)
        if match:
            tags += [t for t in match.group(1).split() if not t.startswith("-") and "[" not in t]
    return tags


def test_documented_tags_exist_in_the_workflows() -> None:
    known = set(jbprofile.system_names({})) | set(jbprofile.FLAG_TAGS)
    known |= {tag for w in jbworkloads.WORKLOADS.values() for tag in (*w.model_tags, *w.framework_tags)}
    expressions = [e.get("tag") or "" for p in (*WORKFLOWS, COMMON_XML) for e in _root(p).iter()]
    xml_tags = {t for expression in expressions for t in re.split(r"[!+|^()]", expression) if t}
    assert xml_tags <= known  # every tag the XML reacts to is one jbprofile accepts
    documents = [p for p in (REPO / "README.md", REPO / "docs" / "jube.md") if p.exists()]
    if not documents:
        pytest.skip("neither README.md nor docs/jube.md exists yet")
    tags = [t for doc in documents for t in _documented_tags(doc.read_text())]
    assert tags, "the documents show no `jube run ... --tag` line"
    examples = {name for doc in documents for name in re.findall(r"^\[(\w+)\]$", doc.read_text(), re.MULTILINE)}
    allowed = {k.upper() for k in known | examples} | {"SYSTEM", "MODEL"}
    unknown = sorted({t for t in tags if t.upper() not in allowed})
    assert not unknown, f"documented tags unknown to the workflows: {unknown}"


COMPARED = ("slowdown", "energy_saving", "compare_note", "point", "scaling",  # the compare step's compare.txt,
            "scaling_efficiency")  # not result.txt


def assert_patterns_match(path: Path, fields: str, compared: str | None = None) -> None:
    """Every printed pattern of the workflow matches the JB lines exactly once, and its typed twin (NAME_value) once
    where the printed value is a number, else never (n/a, `rejected`, a `(partial)` figure). Called on the result.txt
    of real workflow runs (test_local.py: LLM; test_e2e_slurm.py: ResNet-50 with numeric energy), not on typed lines;
    the compare step's patterns on its compare.txt where given."""
    patterns, typed = _patterns(path), _typed(path)
    for name, regex in patterns.items():
        text = compared if name in COMPARED or typed.get(name) in COMPARED else fields
        if text is None:
            continue
        matches = re.findall(regex, text, re.MULTILINE)
        if name in typed:
            (shown,) = re.findall(patterns[typed[name]], text, re.MULTILINE)
            assert matches == ([shown] if _is_number(shown) else []), f"typed {name} matched {matches} in\n{text}"
        else:
            assert len(matches) == 1, f"pattern {name} ({regex}) matched {matches} in\n{text}"


def _is_number(text: str) -> bool:
    return re.fullmatch(JUBE_MACROS["$jube_pat_fp"], text) is not None


SHIPPED_FIELDS = Path(__file__).resolve().parent / "golden" / "shipped_fields.json"
# besides a `(partial)` figure, what a numeric column prints where it has no number: a coordinate reads `default`
# (the driver's) or `-` (not a parameter of the point's mode)
NOT_A_NUMBER = ("n/a", "rejected", "default", "-")


IDENTIFIERS = {"job_id"}  # numbers that name something (a Slurm job: "1" in the shipped Slurm runs), not figures


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_numeric_column_has_a_typed_twin_reading_the_same_line(path: Path) -> None:
    """A JB key is numeric when the shipped records' rows have a number there or say why not; its printed pattern
    then has a typed NAME_value pattern (int or float) reading the same key, only where it holds a plain number, and
    no key that holds text has one."""
    rows = [dict(line[3:].split("=", 1) for line in text.splitlines())
            for text in json.loads(SHIPPED_FIELDS.read_text()).values()]
    values: dict[str, list[str]] = {}
    for row in rows:
        for key, value in row.items():
            values.setdefault(key, []).append(value)
    textual = {key for key, seen in values.items()
               if not all(_is_number(v) or v in NOT_A_NUMBER or v.endswith(" (partial)") for v in seen)}
    numeric = {key for key, seen in values.items()
               if key not in textual | IDENTIFIERS and any(_is_number(v) for v in seen)}
    elements, typed = _pattern_elements(path), _typed(path)
    key_of = {name: re.match(r"\^JB (\w+)=", element.text or "").group(1) for name, element in elements.items()}
    printed = {name for name in elements if name not in typed}
    assert {name for name in printed if key_of[name] in numeric} <= set(typed.values())
    for name, twin in typed.items():
        macro = "$jube_pat_int" if elements[name].get("type") == "int" else "$jube_pat_fp"
        assert elements[name].text == f"^JB {key_of[twin]}={macro}$", name
        assert name == twin + TYPED_SUFFIX and twin in printed and key_of[twin] not in textual, name


def test_the_workflow_helpers_read_analysis_only_through_its_public_table_functions() -> None:
    """jube/*.py may use joulebench.analysis.tables (public functions for the workflows' tables), never the report's
    or the Pareto module's parts, so those can change inside (issue 42)."""
    for path in sorted(JUBE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("joulebench.analysis"):
                assert node.module == "joulebench.analysis.tables", f"{path.name} imports {node.module}"
                assert not any(alias.name.startswith("_") for alias in node.names), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("joulebench.analysis") for a in node.names), path.name


def test_workflow_differences_live_in_the_workload_table() -> None:
    """No helper branches on which workflow or driver it serves (jbworkloads.py holds the differences), and the
    login node's command stays below 600 lines (issue 42)."""
    names = {*jbworkloads.WORKLOADS, *jbworkloads.BY_DRIVER}
    for path in sorted(JUBE_DIR.glob("*.py")):
        if path.name == "jbworkloads.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                literals = {c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)}
                assert not literals & names, f"{path.name}:{node.lineno} compares with {literals & names}"
    assert len((JUBE_DIR / "jbprofile.py").read_text().splitlines()) < 600
