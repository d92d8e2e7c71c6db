"""Digest lock: first record, unchanged, a changed digest refused without --update, --update accepted with
history, atomic rewrites; and the digest lookup through skopeo and through the registry HTTP API."""

from __future__ import annotations

import datetime as dt
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.container.conftest import jbcontainer

BASE = "nvcr.io/nvidia/pytorch:25.12-py3"
FIRST = "sha256:" + "1" * 64
SECOND = "sha256:" + "2" * 64
NOON = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)  # noqa: UP017 (same form as the tool's)


def entry(lock_file: Path, name: str = "nvidia-pytorch") -> dict:
    return json.loads(lock_file.read_text())["images"][name]


def test_first_record_then_unchanged_without_rewriting(lock_file: Path) -> None:
    assert entry(lock_file)["digest"] is None
    assert jbcontainer.record_digest("nvidia-pytorch", BASE, FIRST, "skopeo inspect --raw", now=NOON) == "recorded"
    recorded = entry(lock_file)
    assert (recorded["digest"], recorded["recorded_utc"], recorded["source"]) == (
        FIRST, "2026-11-22T12:00:00Z", "skopeo inspect --raw")
    before = lock_file.stat()
    assert jbcontainer.record_digest("nvidia-pytorch", BASE, FIRST, "registry API") == "unchanged"
    after = lock_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert entry(lock_file, "amd-pytorch")["digest"] is None  # other images untouched


def test_changed_digest_is_refused_without_update(lock_file: Path) -> None:
    jbcontainer.record_digest("nvidia-pytorch", BASE, FIRST, "given")
    text = lock_file.read_text()
    with pytest.raises(jbcontainer.ValidationError, match=r"digest changed .*Fix: .*--update") as err:
        jbcontainer.record_digest("nvidia-pytorch", BASE, SECOND, "given")
    assert FIRST in str(err.value) and SECOND in str(err.value)
    assert lock_file.read_text() == text


def test_update_accepts_the_new_digest_and_keeps_the_old_one(lock_file: Path) -> None:
    jbcontainer.record_digest("nvidia-pytorch", BASE, FIRST, "given", now=NOON)
    assert jbcontainer.record_digest("nvidia-pytorch", BASE, SECOND, "given", update=True) == "updated"
    recorded = entry(lock_file)
    assert recorded["digest"] == SECOND
    assert recorded["history"] == [{"base": BASE, "digest": FIRST, "recorded_utc": "2026-11-22T12:00:00Z"}]


def test_moved_tag_needs_update_and_stops_building_from_the_old_digest(lock_file: Path) -> None:
    jbcontainer.record_digest("nvidia-pytorch", BASE, FIRST, "given")
    new_base = "nvcr.io/nvidia/pytorch:26.01-py3"
    assert jbcontainer.locked_digest("nvidia-pytorch", BASE) == FIRST
    assert jbcontainer.locked_digest("nvidia-pytorch", new_base) is None
    with pytest.raises(jbcontainer.ValidationError, match="base tag changed"):
        jbcontainer.record_digest("nvidia-pytorch", new_base, SECOND, "given")
    assert jbcontainer.record_digest("nvidia-pytorch", new_base, SECOND, "given", update=True) == "updated"
    assert entry(lock_file)["base"] == new_base


def test_malformed_digest_is_rejected(lock_file: Path) -> None:
    with pytest.raises(jbcontainer.ValidationError, match="not a sha256 digest"):
        jbcontainer.record_digest("nvidia-pytorch", BASE, "sha256:xyz", "given")


def test_readers_never_see_a_partial_lock_file(lock_file: Path) -> None:
    """Rewrites go through a temporary file and a rename: a concurrent reader always parses a whole file."""
    stop = threading.Event()
    parsed = []

    def read_continuously() -> None:
        while not stop.is_set():
            parsed.append(json.loads(lock_file.read_text())["images"]["nvidia-pytorch"]["digest"])

    reader = threading.Thread(target=read_continuously)
    reader.start()
    try:
        for i in range(150):
            jbcontainer.record_digest("nvidia-pytorch", BASE, (FIRST, SECOND)[i % 2], "given", update=True)
    finally:
        stop.set()
        reader.join()
    assert parsed and set(parsed) <= {None, FIRST, SECOND}
    assert sorted(p.name for p in lock_file.parent.iterdir() if p.name.startswith(".images")) == []


def test_cli_lock_records_then_refuses_a_change(lock_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert jbcontainer.main(["lock", "amd-tensorflow", "--digest", FIRST]) == 0
    assert "recorded" in capsys.readouterr().out
    assert jbcontainer.main(["lock", "amd-tensorflow", "--digest", SECOND]) == 64
    assert "Fix:" in capsys.readouterr().err
    assert jbcontainer.main(["lock", "amd-tensorflow", "--digest", SECOND, "--update"]) == 0
    assert entry(lock_file, "amd-tensorflow")["digest"] == SECOND


def test_digest_from_skopeo_is_the_hash_of_the_raw_manifest(tmp_path: Path, fake_env: dict[str, str]) -> None:
    manifest = tmp_path / "index.json"
    manifest.write_bytes(b'{"schemaVersion": 2, "manifests": []}')
    env = {**fake_env, "FAKE_SKOPEO_MANIFEST": str(manifest)}
    digest, source = jbcontainer.resolve_digest(BASE, env)
    assert (digest, source) == ("sha256:" + hashlib.sha256(manifest.read_bytes()).hexdigest(), "skopeo inspect --raw")


class FakeRegistry(http.server.BaseHTTPRequestHandler):
    """Registry v2 endpoints as Docker Hub/nvcr.io answer them: 401 + Bearer challenge, token, manifest."""

    manifest = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}'
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        host = f"127.0.0.1:{self.server.server_port}"
        if self.path.startswith("/token?"):
            self._send(200, json.dumps({"token": "anon-token"}).encode())
        elif self.headers.get("Authorization") != "Bearer anon-token":
            self._send(401, b"{}", {"WWW-Authenticate": f'Bearer realm="http://{host}/token",service="fake",'
                                                       'scope="repository:nvidia/pytorch:pull"'})
        elif self.path == "/v2/nvidia/pytorch/manifests/25.12-py3":
            digest = "sha256:" + hashlib.sha256(self.manifest).hexdigest()
            self._send(200, self.manifest, {"Docker-Content-Digest": digest})
        else:
            self._send(404, b"{}")

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeRegistry.seen = []
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def test_digest_from_the_registry_api_with_an_anonymous_token(registry: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}  # no skopeo
    digest, source = jbcontainer.resolve_digest(f"{registry}/nvidia/pytorch:25.12-py3", env, scheme="http")
    assert (digest, source) == ("sha256:" + hashlib.sha256(FakeRegistry.manifest).hexdigest(), "registry API")
    assert [auth for _, auth in FakeRegistry.seen] == ["", "", "Bearer anon-token"]
    assert "scope=repository%3Anvidia%2Fpytorch%3Apull" in FakeRegistry.seen[1][0]


def test_unreachable_registry_names_the_fix(registry: str) -> None:
    with pytest.raises(jbcontainer.ValidationError, match=r"cannot look up .*Fix: .*--digest"):
        jbcontainer.resolve_digest(f"{registry}/nvidia/missing:1.0", {"PATH": "/usr/bin:/bin"}, scheme="http")


@pytest.mark.parametrize(("reference", "expected"), [
    ("nvcr.io/nvidia/pytorch:25.12-py3", ("nvcr.io", "nvidia/pytorch", "25.12-py3")),
    ("rocm/pytorch:rocm6.4.1_x", ("registry-1.docker.io", "rocm/pytorch", "rocm6.4.1_x")),
    ("ubuntu:24.04", ("registry-1.docker.io", "library/ubuntu", "24.04")),
    ("localhost:5000/a/b@" + FIRST, ("localhost:5000", "a/b", FIRST)),
])
def test_references_split_like_docker(reference: str, expected: tuple[str, str, str]) -> None:
    assert jbcontainer.split_reference(reference) == expected


def test_build_reference_replaces_the_tag_by_the_digest() -> None:
    assert jbcontainer.with_digest(BASE, SECOND) == f"nvcr.io/nvidia/pytorch@{SECOND}"
    assert jbcontainer.with_digest("localhost:5000/a/b:1.0", SECOND) == f"localhost:5000/a/b@{SECOND}"
    assert jbcontainer.with_digest(f"localhost:5000/a/b@{FIRST}", SECOND) == f"localhost:5000/a/b@{SECOND}"
