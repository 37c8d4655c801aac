"""A real registry (Debian's docker-registry, the CNCF distribution) on 127.0.0.1, a tiny built
artifact, signing keys, and a TCP proxy that cuts a connection mid-blob."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from registry_binary import registry_binary

from ingot.artifacts.store import BlobStore

from fixtures import make_checkpoint, write_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on (a registry that is down)."""
    return _free_port()


@dataclass
class Registry:
    host: str  # 127.0.0.1:<port>
    storage: Path

    def ref(self, repo_and_tag: str) -> str:
        return f"oci://{self.host}/{repo_and_tag}"

    def blob_file(self, digest: str) -> Path:
        """Where distribution's filesystem driver keeps a blob's bytes."""
        hexdigest = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def start_registry(directory: Path, htpasswd: Path | None = None):
    try:
        binary = registry_binary()
    except RuntimeError as error:
        pytest.fail(f"the registry tests need a real registry: {error}", pytrace=False)
    port = _free_port()
    storage = directory / "storage"
    storage.mkdir(parents=True)
    auth = f"auth:\n  htpasswd: {{realm: ingot-test, path: {htpasswd}}}\n" if htpasswd else ""
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: error}\n"
        f"storage:\n  filesystem: {{rootdirectory: {storage}}}\n  delete: {{enabled: true}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n" + auth
    )
    log = open(directory / "registry.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen([str(binary), "serve", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            break
        except urllib.error.HTTPError:  # 401: up, and asking for credentials
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"docker-registry did not start: {(directory / 'registry.log')}")
            time.sleep(0.05)
    return process, log, Registry(f"127.0.0.1:{port}", storage)


def stop_registry(process, log) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    process, log, reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    stop_registry(process, log)


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory):
    """A registry behind htpasswd (Basic auth), user alice / secret."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # bcrypt through libxcrypt; the stdlib module is gone in 3.13

    directory = tmp_path_factory.mktemp("private-registry")
    hashed = crypt.crypt("secret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    (directory / "htpasswd").write_text(f"alice:{hashed}\n")
    process, log, reg = start_registry(directory, htpasswd=directory / "htpasswd")
    yield reg
    stop_registry(process, log)


@dataclass
class Built:
    checkpoint: Path
    recipe: Path
    cache: Path  # the stage cache it was built with (a rebuild there only packages)
    artifact: Path


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    """A tiny artifact built from an empty cache (kept pristine: tests copy it)."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    work = tmp_path_factory.mktemp("built")
    checkpoint = make_checkpoint(work / "ckpt")
    # With the portable graph (not shipped by default): the partial-pull tests add an OpenVINO
    # record that reads it, as an OpenVINO-only build's does.
    recipe = write_recipe(
        work / "recipe.yaml", checkpoint, artifact={"name": "tiny", "portable": True}
    )
    result = build(recipe, work / "tiny", cache=StageCache(work / "cache"))
    return Built(checkpoint, recipe, work / "cache", result.artifact)


@pytest.fixture(scope="session")
def built_artifact(built) -> Path:
    return built.artifact


@pytest.fixture
def artifact(tmp_path, built_artifact) -> Path:
    return Path(shutil.copytree(built_artifact, tmp_path / "artifact"))


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "store")


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict[str, Path]:
    """Two EC P-256 key pairs: `private`/`public` and an unrelated `other_public`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = tmp_path_factory.mktemp("keys")
    paths = {}
    for name in ("", "other_"):
        key = ec.generate_private_key(ec.SECP256R1())
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        (directory / f"{name}private.pem").write_bytes(private)
        (directory / f"{name}public.pem").write_bytes(public)
        paths[f"{name}private"] = directory / f"{name}private.pem"
        paths[f"{name}public"] = directory / f"{name}public.pem"
    return paths


class Proxy:
    """127.0.0.1 TCP proxy to the registry. Records what clients send; with `cut_after`, the
    first connection that has received that many bytes from the registry is dropped (once)."""

    def __init__(self, upstream: str, cut_after: int | None = None) -> None:
        self.upstream = upstream.split(":")
        self.cut_after = cut_after
        self.cuts = 0
        self.sent = bytearray()  # everything clients sent: request lines and headers
        self._server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def requests(self, pattern: str) -> list[str]:
        with self._lock:
            text = self.sent.decode("latin-1")
        return re.findall(pattern, text)

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.upstream[0], int(self.upstream[1])))
            threading.Thread(target=self._pump_up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(upstream, client), daemon=True).start()

    def _pump_up(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    self.sent += data
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _pump_down(self, upstream: socket.socket, client: socket.socket) -> None:
        received = 0
        try:
            while data := upstream.recv(65536):
                cut = self.cut_after is not None and self.cuts == 0
                if cut and received + len(data) > self.cut_after:
                    client.sendall(data[: self.cut_after - received])
                    self.cuts += 1
                    break  # drop both ends mid-response
                received += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


@pytest.fixture
def proxy(registry):
    made: list[Proxy] = []

    def make(cut_after: int | None = None) -> Proxy:
        made.append(Proxy(registry.host, cut_after))
        return made[-1]

    yield make
    for p in made:
        p.close()
