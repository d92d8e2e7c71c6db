#!/usr/bin/env python3
"""Pinned Apptainer images for joulebench: build or pull them, record base digests, make the job launcher.

    jbcontainer.py build NAME [--arch A] [--dir D] [--update] [--fakeroot]   # from container/NAME.def
    jbcontainer.py pull NAME --from URI [--arch A] [--dir D]                # a ready-made image (oras://, ...)
    jbcontainer.py lock NAME [--digest sha256:...] [--update]               # record the base image's digest
    jbcontainer.py launcher --system SYSTEM [--benchmark llm|resnet50] [--framework pytorch|tensorflow]
    jbcontainer.py check --system SYSTEM [--benchmark ...] [--framework ...] # runtime and image present?

Why a separate tool: definitions name their base by tag (readable, reviewable), while reproducibility needs
the digest. The digest is looked up once on a cluster (registries are unreachable from CI), written to
container/images.lock.json, and every later build uses `repo@digest`; a changed digest is refused unless
--update says the pin moves on purpose. Runs on the login node's python3 (standard library plus jpwr's
stdlib-only errors and atomic writer); the JUBE side (jube/jbprofile.py) calls job_settings()/ensure_image().
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

CONTAINER_DIR = Path(__file__).resolve().parent
REPO = CONTAINER_DIR.parent
for _path in (REPO, REPO / "jube"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from jbsettings import SETUP_FAILED, in_profile_shell  # noqa: E402  (jube/ is put on sys.path just above)

from jpwr import ValidationError  # noqa: E402  (the repository root is put on sys.path just above)
from jpwr.output import atomic_path, write_json_atomic  # noqa: E402  (the repository root is put on sys.path just above)

LOCK_FILE = CONTAINER_DIR / "images.lock.json"
DEFAULT_IMAGE_DIR = CONTAINER_DIR / "images"
RUNTIMES = ("apptainer", "singularity")
GPU_FLAGS = {"nvidia": ["--nv"], "amd": ["--rocm"], "cpu": []}
# Which image family serves a vendor: CPU systems use the NVIDIA images (their CUDA builds run on CPUs).
IMAGE_FAMILY = {"nvidia": "nvidia", "amd": "amd", "cpu": "nvidia"}
ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
GRAPHCORE_REASON = ("Graphcore's Poplar SDK images use Python 3.8, which joulebench (Python >= 3.11) does not "
                    "support, so there is no Graphcore image")


# ---------------------------------------------------------------------------------------------------
# Definitions and image names


def definition_path(name: str) -> Path:
    path = CONTAINER_DIR / f"{name}.def"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONTAINER_DIR.glob("*.def")))
        raise ValidationError(f"no container definition '{name}' ({path} does not exist)", f"use one of: {known}")
    return path


def definition_base(path: Path) -> str:
    """The `From:` of a definition's header (the part before the first %section)."""
    for line in path.read_text().splitlines():
        if line.startswith("%"):
            break
        key, _, value = line.partition(":")
        if key.strip().lower() == "from":
            return value.strip()
    raise ValidationError(f"{path} has no 'From:' line in its header", "add `From: registry/repo:exact-tag`")


def split_reference(reference: str) -> tuple[str, str, str]:
    """docker reference -> (registry, repository, tag or digest); Docker Hub names get their implicit parts."""
    name, _, digest = reference.partition("@")
    tag = ""
    if not digest and ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = "registry-1.docker.io", name
    if registry == "registry-1.docker.io" and "/" not in repository:
        repository = f"library/{repository}"
    return registry, repository, digest or tag


def with_digest(reference: str, digest: str) -> str:
    """`repo:tag` -> `repo@digest`: the form a build uses once the digest is locked."""
    name = reference.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return f"{name}@{digest}"


def normalise_arch(arch: str) -> str:
    if arch.lower() not in ARCH_ALIASES:
        raise ValidationError(f"architecture '{arch}' is not known", f"use one of {', '.join(sorted(ARCH_ALIASES))}")
    return ARCH_ALIASES[arch.lower()]


def host_arch() -> str:
    return normalise_arch(platform.machine())


def image_name(vendor: str, framework: str) -> str:
    """System vendor + driver framework -> definition name (e.g. amd-tensorflow)."""
    if vendor == "graphcore":
        raise ValidationError(GRAPHCORE_REASON, "meter Poplar's own examples with `jpwr -- CMD` instead")
    if vendor not in IMAGE_FAMILY:
        raise ValidationError(f"vendor '{vendor}' has no container image", f"use one of {', '.join(IMAGE_FAMILY)}")
    return f"{IMAGE_FAMILY[vendor]}-{framework}"


def sif_path(image_dir: Path, name: str, arch: str) -> Path:
    return image_dir / f"{name}-{arch}.sif"


# ---------------------------------------------------------------------------------------------------
# Lock file


def load_lock(path: Path | None = None) -> dict[str, Any]:
    try:
        return json.loads((path or LOCK_FILE).read_text())
    except FileNotFoundError:
        return {"images": {}}


def record_digest(name: str, base: str, digest: str, source: str, update: bool = False,
                  path: Path | None = None, now: dt.datetime | None = None) -> str:
    """Record `digest` for definition `name`; returns "recorded", "unchanged" or "updated".

    A digest (or base tag) that differs from the recorded one means the image under the pin changed:
    refused unless `update`, and the old value is kept in the entry's history.
    """
    if not DIGEST_RE.fullmatch(digest):
        raise ValidationError(f"'{digest}' is not a sha256 digest", "pass it as sha256:<64 hex digits>")
    lock = load_lock(path)
    entry = lock.setdefault("images", {}).setdefault(name, {"base": base, "digest": None, "history": []})
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017 (login python3 may be < 3.11)
    if entry.get("digest") == digest and entry.get("base") == base:
        return "unchanged"
    if entry.get("digest") and not update:
        what = "base tag" if entry.get("base") != base else "digest"
        raise ValidationError(
            f"{name}: the {what} changed ({entry['base']}@{entry['digest']} is locked; now {base}@{digest})",
            f"if the pin moves on purpose, run `jbcontainer.py lock {name} --update` (or build with --update) "
            "and commit container/images.lock.json")
    result = "updated" if entry.get("digest") else "recorded"
    if entry.get("digest"):
        entry.setdefault("history", []).append(
            {"base": entry["base"], "digest": entry["digest"], "recorded_utc": entry.get("recorded_utc")})
    entry.update(base=base, digest=digest, recorded_utc=stamp, source=source)
    write_json_atomic(path or LOCK_FILE, lock)
    return result


def locked_digest(name: str, base: str, path: Path | None = None) -> str | None:
    """The digest to build from, only while the lock entry still belongs to the definition's base tag."""
    entry = load_lock(path).get("images", {}).get(name) or {}
    return entry.get("digest") if entry.get("base") == base else None


# ---------------------------------------------------------------------------------------------------
# Digest lookup (on a cluster: skopeo if installed, else the registry's HTTP API)


def resolve_digest(reference: str, environ: dict[str, str] | None = None,
                   scheme: str = "https") -> tuple[str, str]:
    """The manifest digest the tag points to now (the multi-arch index for NGC): (digest, source)."""
    env = dict(os.environ if environ is None else environ)
    if _which("skopeo", env):
        proc = subprocess.run(["skopeo", "inspect", "--raw", f"docker://{reference}"], capture_output=True, env=env)
        if proc.returncode == 0:
            return "sha256:" + hashlib.sha256(proc.stdout).hexdigest(), "skopeo inspect --raw"
    registry, repository, tag = split_reference(reference)
    url = f"{scheme}://{registry}/v2/{repository}/manifests/{tag}"
    try:
        digest = _registry_digest(url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ValidationError(f"cannot look up the digest of {reference} ({exc})",
                              "run on a node with internet access, or pass the digest: "
                              "`jbcontainer.py lock NAME --digest sha256:...` (from `skopeo inspect` or the "
                              "registry's web page)") from None
    return digest, "registry API"


def _registry_digest(url: str) -> str:
    """GET the manifest; on a 401 Bearer challenge fetch an anonymous pull token and retry (registry v2 API)."""
    request = urllib.request.Request(url, headers={"Accept": MANIFEST_TYPES})
    try:
        response = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as exc:
        challenge = exc.headers.get("WWW-Authenticate", "")
        if exc.code != 401 or not challenge.lower().startswith("bearer "):
            raise
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
        with urllib.request.urlopen(f"{fields['realm']}?{query}", timeout=30) as token_response:
            token_doc = json.load(token_response)
        token = token_doc.get("token") or token_doc.get("access_token")
        request.add_header("Authorization", f"Bearer {token}")
        response = urllib.request.urlopen(request, timeout=30)
    with response:
        body = response.read()
        header = response.headers.get("Docker-Content-Digest", "")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if header and header != digest:
        raise ValueError(f"registry says {header} but the manifest hashes to {digest}")
    return digest


# ---------------------------------------------------------------------------------------------------
# Runtime and launcher


def _which(program: str, env: dict[str, str], setup: str = "") -> str | None:
    """Absolute path of `program` after the profile's setup lines (module loads can put apptainer on PATH)."""
    proc = subprocess.run(in_profile_shell(setup, ["sh", "-c", 'command -v "$1"', "jb-which", program]),
                          capture_output=True, text=True, env=env)
    if proc.returncode == SETUP_FAILED:
        raise ValidationError(f"profile key setup failed on the login node while looking for {program} (its lines "
                              "returned non-zero or ended the shell: `exit`, `set -e`)",
                              "make the setup lines succeed in bash; the job would fail the same way")
    found = proc.stdout.strip().splitlines()
    return found[-1] if proc.returncode == 0 and found and found[-1].startswith("/") else None


def find_runtime(environ: dict[str, str] | None = None, setup: str = "") -> str:
    env = dict(os.environ if environ is None else environ)
    for runtime in RUNTIMES:
        path = _which(runtime, env, setup)
        if path:
            return path
    raise ValidationError("neither apptainer nor singularity is on PATH (needed for the `container` tag)",
                          "load it (e.g. `module load Apptainer`, or add that to the system's `setup` in "
                          "jube/systems.ini), or run without the `container` tag (bare-metal venv)")


def launcher_argv(runtime: str, vendor: str, image: Path, binds: list[str]) -> list[str]:
    """`apptainer exec --nv|--rocm --bind ... IMAGE`: the prefix put before `python3 -m DRIVER ...`."""
    if vendor not in GPU_FLAGS:
        raise ValidationError(f"vendor '{vendor}' cannot run in a container", f"use one of {', '.join(GPU_FLAGS)}")
    unique = list(dict.fromkeys(str(Path(b)) for b in binds if b))
    for path in unique:
        if "," in path or ":" in path:
            raise ValidationError(f"path {path!r} has ',' or ':', which separate entries of Apptainer's --bind list",
                                  "move or link the repository or data (llm_data_path, resnet_data_dir) to a path "
                                  "without them")
    return [runtime, "exec", *GPU_FLAGS[vendor], *(["--bind", ",".join(unique)] if unique else []), str(image)]


def profile_image(profile: dict[str, str], framework: str) -> tuple[str, str, Path]:
    """(definition name, arch, .sif path) of a system profile; `container_dir` empty: container/images/.

    A relative container_dir is taken from the repository root, so the login node and the job agree.
    """
    name = image_name(profile.get("vendor", "nvidia"), framework)
    arch = normalise_arch(profile.get("arch") or "x86_64")
    image_dir = REPO / Path(profile.get("container_dir") or DEFAULT_IMAGE_DIR).expanduser()
    return name, arch, sif_path(image_dir, name, arch)


def data_binds(profile: dict[str, str]) -> list[str]:
    """Host paths the drivers read besides the repository: the LLM dataset's directory, the ImageNet tree."""
    binds = []
    if profile.get("llm_data_path"):
        binds.append(str(Path(profile["llm_data_path"]).parent))
    if profile.get("resnet_data_dir"):
        binds.append(profile["resnet_data_dir"])
    return binds


def job_settings(profile: dict[str, str], framework: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The JB_* settings for a job in the system's image; raises ValidationError before anything is submitted.

    The run directory and $TMPDIR (the samplers' sockets) are bound by job.sh through JB_CONTAINER_BIND_VAR,
    because only the job knows them.
    """
    name, arch, image = profile_image(profile, framework)
    allowed = arches(name)
    if arch not in allowed:
        raise ValidationError(f"image {name} exists for {', '.join(allowed)} only, system {profile.get('system')} "
                              f"is {arch}", "run this benchmark without the `container` tag on that system")
    runtime = find_runtime(environ, profile.get("setup", ""))
    argv = launcher_argv(runtime, profile.get("vendor", "nvidia"), image, [str(REPO), *data_binds(profile)])
    python = profile.get("python", "auto")
    return {
        "JB_CONTAINER": shlex.join(argv),
        "JB_CONTAINER_IMAGE": str(image),
        "JB_CONTAINER_NAME": name,
        "JB_CONTAINER_BIND_VAR": f"{Path(runtime).name.upper()}_BIND",
        "JB_PYTHON": "python3" if python in ("", "auto") else python,
    }


def arches(name: str) -> list[str]:
    """Architectures a definition can be built for (NGC tags are multi-arch; AMD's images are x86_64 only)."""
    return ["x86_64", "aarch64"] if name.startswith("nvidia-") else ["x86_64"]


# ---------------------------------------------------------------------------------------------------
# Build and pull


def build_definition_text(definition: Path, digest: str | None, extra_labels: dict[str, str]) -> str:
    """The definition as built: `From:` pinned to the locked digest, provenance labels appended."""
    base = definition_base(definition)
    text = definition.read_text()
    if digest:
        text = re.sub(r"(?im)^(From:\s*).*$", lambda m: m.group(1) + with_digest(base, digest), text, count=1)
    labels = "".join(f"    {key} {value}\n" for key, value in extra_labels.items())
    return re.sub(r"(?m)^%labels[ \t]*\n", lambda m: m.group(0) + labels, text, count=1)


def git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "n/a"


def build(name: str, image_dir: Path, arch: str | None = None, update: bool = False, fakeroot: bool = False,
          environ: dict[str, str] | None = None, setup: str = "") -> Path:
    """Build container/NAME.def into IMAGE_DIR/NAME-ARCH.sif from the locked (or now recorded) base digest."""
    definition = definition_path(name)
    arch = normalise_arch(arch or host_arch())
    if arch != host_arch():
        raise ValidationError(f"{name} for {arch} cannot be built on this {host_arch()} host",
                              f"run `python3 container/jbcontainer.py build {name}` on an {arch} node "
                              "(with internet access), e.g. through `srun -N1 -p PARTITION`")
    if arch not in arches(name):
        raise ValidationError(f"{name} has no {arch} base image", f"build it for {', '.join(arches(name))}")
    runtime = find_runtime(environ, setup)
    base = definition_base(definition)
    digest = None if update else locked_digest(name, base)
    if digest is None:
        digest, source = resolve_digest(base, environ)
        print(f"jbcontainer: {base} is {digest} ({source}): {record_digest(name, base, digest, source, update)}")
    labels = {"org.joulebench.base.digest": digest, "org.joulebench.git_commit": git_commit()}
    image_dir.mkdir(parents=True, exist_ok=True)
    pinned = CONTAINER_DIR / f".{name}.build.def"
    pinned.write_text(build_definition_text(definition, digest, labels))
    target = sif_path(image_dir, name, arch)
    with atomic_path(target) as partial:
        argv = [runtime, "build", "--force", *(["--fakeroot"] if fakeroot else []), str(partial), str(pinned)]
        print("jbcontainer:", shlex.join(argv), flush=True)
        try:
            rc = subprocess.call(argv, cwd=REPO, env=environ)
        finally:
            pinned.unlink(missing_ok=True)
        if rc != 0:
            raise ValidationError(f"`{runtime} build` of {name} failed (exit {rc}; its output is above)",
                                  "if it is a permission problem, retry with --fakeroot or ask the site how to build "
                                  "containers; the definition is container/" + definition.name)
    return target


def pull(name: str, source: str, image_dir: Path, arch: str | None = None,
         environ: dict[str, str] | None = None, setup: str = "") -> Path:
    """Fetch a ready-made joulebench image (e.g. pushed with `apptainer push` to oras://), then run its %test."""
    arch = normalise_arch(arch or host_arch())
    runtime = find_runtime(environ, setup)
    image_dir.mkdir(parents=True, exist_ok=True)
    target = sif_path(image_dir, name, arch)
    with atomic_path(target) as partial:
        for argv in ([runtime, "pull", "--force", str(partial), source], [runtime, "test", str(partial)]):
            print("jbcontainer:", shlex.join(argv), flush=True)
            if subprocess.call(argv, env=environ) != 0:
                raise ValidationError(f"`{shlex.join(argv)}` failed (its output is above)",
                                      f"check container_source={source} in jube/systems.ini, or build the image "
                                      f"instead: `python3 container/jbcontainer.py build {name}`")
    return target


def ensure_image(profile: dict[str, str], framework: str, environ: dict[str, str] | None = None) -> Path:
    """The system's image, built or pulled once (a file lock keeps concurrent workpackages to one build)."""
    name, arch, image = profile_image(profile, framework)
    if image.exists():
        return image
    image.parent.mkdir(parents=True, exist_ok=True)
    with open(image.parent / f".{image.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image.exists():  # another workpackage built it while this one waited
            return image
        if profile.get("container_source"):
            return pull(name, profile["container_source"], image.parent, arch, environ, profile.get("setup", ""))
        return build(name, image.parent, arch, environ=environ, setup=profile.get("setup", ""))


def check(profile: dict[str, str], framework: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Runtime present and image built: what a job needs; names the fix otherwise."""
    settings = job_settings(profile, framework, environ)
    image = Path(settings["JB_CONTAINER_IMAGE"])
    if not image.is_file():
        raise ValidationError(f"image {image} does not exist yet",
                              f"build it with `python3 container/jbcontainer.py build {settings['JB_CONTAINER_NAME']} "
                              f"--dir {image.parent}` on a {profile_image(profile, framework)[1]} node, or run the "
                              "JUBE workflow with the `container` tag, which builds it once")
    return settings


# ---------------------------------------------------------------------------------------------------
# Command line


def _system_profile(system: str) -> dict[str, str]:
    import jbprofile  # the JUBE side owns the system profiles; imported here only for the CLI

    try:
        return jbprofile.load_profile(system)
    except jbprofile.ConfigError as exc:
        raise ValidationError(str(exc).split(". Fix: ")[0], str(exc).split(". Fix: ")[-1]) from None


def _framework(args: argparse.Namespace) -> str:
    return "pytorch" if args.benchmark == "llm" else args.framework


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jbcontainer.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("build", "pull"):
        p = sub.add_parser(command)
        p.add_argument("name", help="definition name, e.g. nvidia-pytorch (container/NAME.def)")
        p.add_argument("--arch", help="x86_64 or aarch64 (default: this host's)")
        p.add_argument("--dir", default=os.environ.get("JOULEBENCH_CONTAINER_DIR") or str(DEFAULT_IMAGE_DIR),
                       help="where the .sif goes (default: $JOULEBENCH_CONTAINER_DIR, else container/images)")
    sub.choices["build"].add_argument("--update", action="store_true", help="accept a new base digest")
    sub.choices["build"].add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build")
    sub.choices["pull"].add_argument("--from", dest="source", required=True, help="oras://..., docker://..., ...")
    lock = sub.add_parser("lock", help="record the base image's digest in container/images.lock.json")
    lock.add_argument("name")
    lock.add_argument("--digest", help="sha256:... (default: look it up now)")
    lock.add_argument("--update", action="store_true", help="accept a digest that differs from the locked one")
    for command in ("launcher", "check"):
        p = sub.add_parser(command)
        p.add_argument("--system", required=True, help="a section of jube/systems.ini")
        p.add_argument("--benchmark", choices=("llm", "resnet50"), default="llm")
        p.add_argument("--framework", choices=("pytorch", "tensorflow"), default="pytorch",
                       help="resnet50 only; llm always uses the PyTorch image")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build(args.name, Path(args.dir), args.arch, args.update, args.fakeroot))
        elif args.command == "pull":
            print(pull(args.name, args.source, Path(args.dir), args.arch))
        elif args.command == "lock":
            base = definition_base(definition_path(args.name))
            digest, source = (args.digest, "given") if args.digest else resolve_digest(base)
            print(f"{args.name}: {base} {digest}: {record_digest(args.name, base, digest, source, args.update)}")
        elif args.command == "launcher":
            print(job_settings(_system_profile(args.system), _framework(args))["JB_CONTAINER"])
        else:
            settings = check(_system_profile(args.system), _framework(args))
            print(f"ok: {settings['JB_CONTAINER']}")
    except ValidationError as exc:
        print(f"jbcontainer: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
