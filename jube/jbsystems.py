"""The system profiles (jube/systems.ini and JOULEBENCH_PROFILE): read, checked, resolved for one system.

Why strict: a misspelled key or a section named like a tag would otherwise be ignored silently and the job
would run with other settings than the user wrote. `vendor = auto` (the `local` system) asks the vendors'
listing tools, not torch, whether this machine has an accelerator. Standard library only (Python >= 3.10).
"""

from __future__ import annotations

import configparser
import difflib
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

JUBE_DIR = Path(__file__).resolve().parent
REPO = JUBE_DIR.parent
PROFILE_FILE = JUBE_DIR / "systems.ini"
MODEL_TAGS = ("tiny", "117M", "800M", "13B", "175B")
INFERENCE_MODEL_TAGS = ("tiny", "gpt2", "llama-1b", "llama-8b")  # llm_inference presets
FRAMEWORK_TAGS = ("pytorch", "tensorflow")
FLAG_TAGS = ("wait", "synthetic", "container")
RESERVED_NAMES = {t.lower() for t in (*MODEL_TAGS, *INFERENCE_MODEL_TAGS, *FRAMEWORK_TAGS, *FLAG_TAGS)}
PATH_KEYS = ("carbon_intensity_csv", "price_csv")  # relative: to the profile file that sets them
CPU_OVERLAY = "cpu"  # [<system>.cpu]: applied over a `vendor = auto` system when no accelerator is found
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


class ConfigError(Exception):
    """A configuration that cannot work: the value, and what to do instead."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem, self.fix = problem.rstrip("."), fix
        super().__init__(f"{self.problem}. Fix: {fix}")


class PointRefused(ConfigError):
    """One sweep point cannot run; it gets an INVALID row, the other points go on."""

    settings: dict[str, str] | None = None  # the row's coordinates, once known (jbprofile.resolve sets them)


def check_name(value: str, what: str) -> str:
    """Names that end up in paths and job names: no separators, no `..`, no spaces."""
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise ConfigError(f"{what} {value!r} cannot be used as a file or job name",
                          "use letters, digits and _ . + - only (no /, no .., no spaces)")
    return value


def closest(word: str, known: list[str] | set[str]) -> str:
    match = difflib.get_close_matches(word.lower(), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _own_keys(path: Path) -> dict[str, dict[str, str]]:
    """Section -> the keys written in that section of one file ([DEFAULT] as a section of its own)."""
    raw = configparser.ConfigParser(interpolation=None, default_section="\0none")
    try:
        raw.read_string(path.read_bytes().decode("utf-8"), source=str(path))
    except configparser.Error as exc:
        raise ConfigError(f"{path} is not a valid profile file ({exc.message.splitlines()[0]})",
                          "write it in the form of jube/systems.ini: [SECTION] lines and key = value lines") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                          "save the profile file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror})", "make the profile file readable") from None
    return {section: dict(raw.items(section)) for section in raw.sections()}


def known_keys() -> set[str]:
    """Every profile key: those of [DEFAULT] in jube/systems.ini, which documents each of them."""
    return set(_own_keys(PROFILE_FILE).get("DEFAULT", {}))


def _check_file(path: Path, sections: dict[str, dict[str, str]], known: set[str]) -> None:
    """Unknown keys, sections named like tags, names that cannot become job or file names: errors."""
    for section, values in sections.items():
        system, _, overlay = section.partition(".")
        if section != "DEFAULT":
            check_name(system, f"profile section [{section}] of {path}:")
            if system.lower() in RESERVED_NAMES:
                raise ConfigError(f"profile section [{section}] of {path} has the name of a model, framework or flag "
                                  "tag, so the tag would be ambiguous", "rename the section")
            if overlay and overlay != CPU_OVERLAY:
                raise ConfigError(f"profile section [{section}] of {path}: only [<system>.{CPU_OVERLAY}] overlays "
                                  "exist", f"rename it to [{system}.{CPU_OVERLAY}] or remove it")
        for key in values:
            if key not in known:
                raise ConfigError(f"unknown key '{key}' in [{section}] of {path}{closest(key, known)}",
                                  "use a key listed at the top of jube/systems.ini, or remove it")


def _profile_files(environ: dict[str, str]) -> list[Path]:
    """jube/systems.ini, then the file JOULEBENCH_PROFILE names (its values win)."""
    files = [PROFILE_FILE]
    if environ.get("JOULEBENCH_PROFILE"):
        extra = Path(environ["JOULEBENCH_PROFILE"])
        if not extra.is_file():
            raise ConfigError(f"JOULEBENCH_PROFILE={extra} does not exist",
                              "point it to an .ini file of the form of jube/systems.ini")
        files.append(extra)
    return files


def _anchor_paths(profile: dict[str, str], sections: Sequence[str], environ: dict[str, str]) -> None:
    """A relative PATH_KEYS value is relative to the profile file that sets it (an overlay over the section over
    [DEFAULT], a later file over an earlier one: configparser's order), so it means the same from any directory."""
    files = _profile_files(environ)
    for key in PATH_KEYS:
        value = profile.get(key, "")
        if not value or Path(value).expanduser().is_absolute():
            continue
        setters = [(sections.index(section), index, path) for index, path in enumerate(files)
                   for section, values in _own_keys(path).items() if section in sections and key in values]
        if setters:
            profile[key] = str((max(setters)[2].parent / Path(value).expanduser()).resolve())


def _read_profiles(environ: dict[str, str]) -> tuple[configparser.ConfigParser, dict[str, dict[str, str]]]:
    """All profile files merged, and the keys each section sets itself (overlays apply only those)."""
    files = _profile_files(environ)
    known = known_keys()
    parser = configparser.ConfigParser(interpolation=None)
    own: dict[str, dict[str, str]] = {}
    for path in files:
        sections = _own_keys(path)
        _check_file(path, sections, known)
        for section, values in sections.items():
            own.setdefault(section, {}).update(values)
        parser.read(path, encoding="utf-8")  # _own_keys decoded it already
    return parser, own


def system_names(environ: dict[str, str] | None = None) -> list[str]:
    """The systems (tags) of the profile files; [<system>.cpu] overlays are not systems."""
    parser, _ = _read_profiles(dict(os.environ if environ is None else environ))
    return [s for s in parser.sections() if "." not in s]


def detect_accelerator(environ: dict[str, str]) -> tuple[str, str, int]:
    """(vendor, what was found, how many GPUs) on this machine, from the vendors' listing tools; torch is not
    imported."""
    path = environ.get("PATH", os.defpath)
    probes = (("nvidia", "nvidia-smi", ["-L"], r"^GPU (\d+): (.+?)(?: \(UUID.*)?$", ("CUDA_VISIBLE_DEVICES",)),
              ("amd", "rocm-smi", ["--showproductname"], r"^GPU\[(\d+)\]\s*: Card [Ss]eries:\s*(.+)$",
               ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")))
    for vendor, tool, args, pattern, visibility in probes:
        program = shutil.which(tool, path=path)
        if program is None:
            continue
        try:
            listing = subprocess.run([program, *args], capture_output=True, text=True, timeout=30, env=environ)
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = {m.group(1): m.group(2).strip()
                 for m in re.finditer(pattern, listing.stdout, re.MULTILINE)} if listing.returncode == 0 else {}
        hidden = [v for v in visibility if v in environ and environ[v].strip() in ("", "-1", "none", "NoDevFiles")]
        if found and not hidden:
            names = sorted(set(found.values()))
            usable, bound = visible_count(len(found), environ, visibility)
            return vendor, f"{len(found)} {vendor.upper()} GPU(s) found by {tool} ({', '.join(names)}){bound}", usable
        if found:
            return "cpu", f"{tool} lists GPUs, but {hidden[0]}={environ[hidden[0]]!r} hides them", 0
    return "cpu", "no GPU found (neither nvidia-smi -L nor rocm-smi lists one)", 0


def visible_count(found: int, environ: dict[str, str], visibility: Sequence[str]) -> tuple[int, str]:
    """How many of the `found` GPUs this job may use: a visibility variable's entries (CUDA_VISIBLE_DEVICES=1,2: 2)
    limit them, as the job binds its devices from it (jube/job.sh); and the words saying so."""
    for var in visibility:
        if environ.get(var, "").strip():
            usable = min(found, len([e for e in environ[var].split(",") if e.strip()]))
            return usable, f", {usable} usable by this job ({var})"
    return found, ""


def load_profile(system: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The system's settings: [DEFAULT] < [SYSTEM] < [SYSTEM.cpu] (`vendor = auto` and no accelerator)
    < JOULEBENCH_<KEY> < JOULEBENCH_<SYSTEM>_<KEY>. `selection` says which settings `vendor = auto` chose."""
    env = dict(os.environ if environ is None else environ)
    parser, own = _read_profiles(env)
    systems = [s for s in parser.sections() if "." not in s]
    section = next((s for s in systems if s.lower() == system.lower()), None)
    if section is None:
        raise ConfigError(f"system '{system}' has no profile in {PROFILE_FILE}",
                          f"use one of {', '.join(systems)} or add a section (docs/jube.md)")
    profile = {key: value.strip() for key, value in parser.items(section)}
    overrides = {key: value for key, (_, value) in _overrides(section, profile, env).items()}
    profile["selection"] = ""
    sections = ["DEFAULT", section]
    if overrides.get("vendor", profile["vendor"]) == "auto":
        vendor, found, count = detect_accelerator(env)
        profile["local_gpus"] = str(count)
        overlay = f"{section}.{CPU_OVERLAY}"
        if vendor == "cpu" and overlay in own:
            sections.append(overlay)
            profile.update({key: value.strip() for key, value in own[overlay].items()})
            profile["selection"] = f"{section}: {found}: CPU-sized settings of [{overlay}]"
        else:
            profile["selection"] = f"{section}: {found}: the settings of a GPU node"
        profile["vendor"] = vendor
    _anchor_paths(profile, sections, env)
    profile.update(overrides)  # a path from the environment: relative to the working directory
    profile["system"] = section
    return profile


def _overrides(section: str, keys: Iterable[str], env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """key -> (the environment variable that sets it, its value): JOULEBENCH_<SYSTEM>_<KEY> over JOULEBENCH_<KEY>."""
    upper_env = {key.upper(): (key, value.strip()) for key, value in env.items()
                 if key.upper().startswith("JOULEBENCH_")}
    return {key: upper_env[prefix + key.upper()] for prefix in ("JOULEBENCH_", f"JOULEBENCH_{section.upper()}_")
            for key in sorted(keys) if prefix + key.upper() in upper_env}


def value_source(system: str, key: str, environ: dict[str, str]) -> str:
    """Where load_profile took `key` of `system` from: the environment variable, or the profile files."""
    found = _overrides(system, [key], environ).get(key)
    extra = f" or {environ['JOULEBENCH_PROFILE']}" if environ.get("JOULEBENCH_PROFILE") else ""
    return found[0] if found else f"the profile file (jube/{PROFILE_FILE.name}{extra})"


def override_variable(system: str, key: str) -> str:
    """The environment variable that sets `key` for `system` over every other source (load_profile's order): the one a
    hint must name, since JOULEBENCH_<KEY> and the profile files lose to it. A system whose name a shell cannot put
    into a variable name (`-`, `+`) gets the way that works instead."""
    name = f"JOULEBENCH_{system.upper()}_{key.upper()}"
    if re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
        return name
    return f"{key} in [{system}] of a file named by JOULEBENCH_PROFILE ({name} cannot be exported)"


def resolve_python(profile: dict[str, str]) -> str:
    """`auto`: the repository's .venv (made by jube/setup.sh) if present, else python3 on PATH."""
    python = profile.get("python", "auto") or "auto"
    if python != "auto":
        return python
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"
