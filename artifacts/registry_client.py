"""HTTP to one registry repository, through the oras client, with bounded retries.

oras' `Registry` supplies the session, the credentials (Docker config, `docker-credential-*`
helpers) and the bearer-token dance. ingot drives the requests itself, because oras':
  - `do_request` retries five times sleeping 3 to 83 s and re-sends an already consumed
    upload stream, and its requests have no timeout;
  - `put_upload` reads a whole blob into memory, and `download_blob` neither checks the
    digest nor resumes;
  - `upload_manifest` / `get_manifest` go through `json=` / `.json()`, while a manifest must
    travel as exact bytes (their sha256 is the artifact's identity).
So the undecorated `do_request` is used (auth included, oras' retry loop excluded) and this
module adds timeouts, retries with capped exponential backoff, Basic challenges, streamed
uploads and ranged, resumable downloads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import oras.auth
import oras.container
import oras.provider
import requests

from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.reference import Reference
from ingot.artifacts.store import FileBlob, PartialBlob
from ingot.common.errors import IngotError

__all__ = ["RegistryClient", "RegistryError", "RegistryUnavailable", "Retry"]

T = TypeVar("T")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# urllib3 drops the bytes of a read cut short by a dropped connection, so a resume restarts
# from the last whole chunk: small chunks lose little, and 64 KiB keeps hashing I/O-bound.
_CHUNK = 64 << 10


class RegistryError(IngotError, RuntimeError):
    """The registry answered, but not with what was asked for (auth, not found, refused)."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached (or kept failing) after the bounded retries."""


class _Transient(Exception):
    """One attempt failed in a way another attempt may not (connection, timeout, 5xx)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Attempts per request and the sleep between them: backoff, doubling, capped."""

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 8.0
    timeout: float = 60.0  # seconds to connect, and between two reads of a response

    @classmethod
    def from_env(cls) -> Retry:
        """Defaults, overridden by INGOT_REGISTRY_RETRIES / INGOT_REGISTRY_BACKOFF."""
        default = cls()
        attempts = int(os.environ.get("INGOT_REGISTRY_RETRIES", default.attempts))
        backoff = float(os.environ.get("INGOT_REGISTRY_BACKOFF", default.backoff))
        return cls(attempts=max(1, attempts), backoff=max(0.0, backoff))

    def delay(self, attempt: int) -> float:
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)


class _Auth(oras.auth.TokenAuth):
    """oras' token auth, plus Basic challenges (htpasswd registries), which it does not answer."""

    basic_sent = False

    def authenticate_request(self, original, headers, refresh=False):
        challenge = original.headers.get("Www-Authenticate", "")
        if not challenge.lower().startswith("basic"):
            return super().authenticate_request(original, headers, refresh)
        if not getattr(self, "_basic_auth", None) or (self.basic_sent and refresh):
            return headers, False
        self.basic_sent = True
        return {**headers, "Authorization": f"Basic {self._basic_auth}"}, True

    def upfront(self) -> dict[str, str]:
        # Sent before any challenge once Basic worked: an upload stream cannot be sent twice.
        return {"Authorization": f"Basic {self._basic_auth}"} if self.basic_sent else {}


class _Session(requests.Session):
    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        return super().request(*args, **kwargs)


class RegistryClient:
    """The repository of `ref` on its registry. Plain HTTP only for loopback or `insecure`."""

    def __init__(self, ref: Reference, *, insecure: bool = False, retry: Retry | None = None):
        self.ref = ref
        self.retry = retry or Retry.from_env()
        plain_http = insecure or ref.is_loopback
        self._oras = oras.provider.Registry(hostname=ref.host, insecure=plain_http)
        session = _Session(self.retry.timeout)
        session.cookies.set_policy(self._oras.session.cookies.get_policy())
        session.trust_env = not ref.is_loopback  # no proxy (nor ~/.netrc) for this machine
        self._auth = _Auth()
        self._auth.session, self._auth._tls_verify = session, True
        self._auth.prefix = "http" if plain_http else "https"
        self._oras.session, self._oras.auth = session, self._auth
        self._load_credentials()
        self._base = f"{'http' if plain_http else 'https'}://{ref.host}/v2/{ref.repository}"

    # -- manifests ------------------------------------------------------------------------

    def get_manifest(self, media_type: str, limit: int) -> bytes:
        """The raw bytes of the manifest `ref` names (at most `limit` bytes)."""
        url = f"{self._base}/manifests/{self.ref.target}"

        def attempt() -> bytes:
            with self._send("GET", url, headers={"Accept": media_type}, stream=True) as r:
                if r.status_code == 404:
                    raise RegistryError(f"{self.ref}: not found on {self.ref.host}")
                self._expect(r, (200,), "GET manifest")
                kind = r.headers.get("Content-Type", "").split(";")[0].strip()
                if kind and kind != media_type:
                    raise ArtifactError(
                        f"{self.ref}: the registry returned a {kind}, not an OCI image manifest "
                        "(not an ingot / ModelPack artifact)"
                    )
                data = b"".join(self._body(r, limit + 1))
            if len(data) > limit:
                raise ArtifactError(f"{self.ref}: manifest larger than {limit} bytes; refused")
            return data

        return self._retrying(attempt, f"GET {url}")

    def put_manifest(self, data: bytes, media_type: str, digest: str) -> None:
        """PUT the manifest under the reference's tag; the registry must agree on its digest."""
        url = f"{self._base}/manifests/{self.ref.tag or digest}"
        headers = {"Content-Type": media_type}

        def attempt() -> None:
            with self._send("PUT", url, headers=headers, data=data) as r:
                self._expect(r, (201,), "PUT manifest")
                echoed = r.headers.get("Docker-Content-Digest")
                if echoed and echoed != digest:
                    raise RegistryError(f"{self.ref.host} stored the manifest as {echoed}")

        self._retrying(attempt, f"PUT {url}")

    # -- blobs ----------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        url = f"{self._base}/blobs/{digest}"

        def attempt() -> bool:
            with self._send("HEAD", url) as r:
                if r.status_code in (200, 404):
                    return r.status_code == 200
                self._expect(r, (200,), "HEAD blob")
                return False

        return self._retrying(attempt, f"HEAD {url}")

    def upload_blob(self, digest: str, size: int, open_data: Callable[[], Any]) -> None:
        """Monolithic upload (POST, then one streamed PUT): no chunk round trips, no buffering.
        `open_data` opens the bytes again for each attempt."""

        def attempt() -> None:
            with self._send("POST", f"{self._base}/blobs/uploads/") as r:
                self._expect(r, (202,), "start blob upload")
                location = r.headers.get("Location", "")
            if not location:
                raise RegistryError(f"{self.ref.host}: no upload location for {digest}")
            if location.startswith("/"):
                location = self._base.split("/v2/")[0] + location
            url = location + ("&" if "?" in location else "?") + f"digest={digest}"
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            with open_data() as data, self._send("PUT", url, headers=headers, data=data) as r:
                self._expect(r, (201,), f"upload blob {digest}")

        self._retrying(attempt, f"upload of {digest}")

    def fetch_blob(self, blob: FileBlob, partial: PartialBlob) -> None:
        """Stream `blob` into `partial` (resuming with a Range request), then commit it."""
        url = f"{self._base}/blobs/{blob.digest}"

        def attempt() -> None:
            headers = {"Range": f"bytes={partial.offset}-"} if partial.offset else {}
            with self._send("GET", url, headers=headers, stream=True) as r:
                if r.status_code == 416:  # the range is not satisfiable: start over
                    partial.restart()
                    raise _Transient("range not satisfiable")
                if r.status_code == 404:
                    raise ArtifactError(f"{blob.path}: blob {blob.digest} missing in the registry")
                self._expect(r, (200, 206), f"GET blob {blob.digest}")
                start = r.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
                if r.status_code == 200 or start != str(partial.offset):
                    partial.restart()  # no (usable) range support: the whole blob again
                for chunk in self._body(r, blob.size + 1):
                    partial.write(chunk)
            if partial.offset < blob.size:
                raise _Transient(f"connection closed after {partial.offset} of {blob.size} bytes")
            partial.commit()

        self._retrying(attempt, f"download of {blob.path}")

    # -- plumbing -------------------------------------------------------------------------

    def _send(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One request with auth; connection problems and 5xx become _Transient."""
        headers = {**self._auth.upfront(), **kwargs.pop("headers", {})}
        try:
            response = self._oras.do_request.__wrapped__(
                self._oras, url, method, headers=headers, **kwargs
            )
        except ValueError as e:  # oras: "Cannot respond to request for authentication."
            raise self._auth_error() from e
        except requests.RequestException as e:
            raise _Transient(_reason(e)) from e
        if response.status_code in _TRANSIENT_STATUS:
            response.close()
            raise _Transient(f"HTTP {response.status_code} {response.reason}")
        if response.status_code in (401, 403):
            response.close()
            raise self._auth_error()
        return response

    def _body(self, response: requests.Response, limit: int) -> Iterator[bytes]:
        received = 0
        try:
            for chunk in response.iter_content(_CHUNK):
                received += len(chunk)
                yield chunk
                if received >= limit:
                    return
        except requests.RequestException as e:
            raise _Transient(_reason(e)) from e

    def _retrying(self, attempt: Callable[[], T], what: str) -> T:
        last = ""
        for number in range(1, self.retry.attempts + 1):
            try:
                return attempt()
            except _Transient as e:
                last = str(e)
            if number < self.retry.attempts:
                time.sleep(self.retry.delay(number))
        raise RegistryUnavailable(
            f"registry {self.ref.host} unavailable: {what} failed {self.retry.attempts} "
            f"time(s), last: {last}"
        )

    def _expect(self, response: requests.Response, ok: tuple[int, ...], what: str) -> None:
        if response.status_code in ok:
            return
        try:
            errors = response.json().get("errors", [])
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
        except ValueError:
            detail = response.text[:200]
        raise RegistryError(
            f"{self.ref.host}: {what} for {self.ref.repository}: HTTP {response.status_code} "
            f"{response.reason}{': ' + detail if detail else ''}"
        )

    def _auth_error(self) -> RegistryError:
        return RegistryError(
            f"{self.ref.host}: authentication failed for {self.ref.repository}; log in with "
            "`docker login` or set INGOT_REGISTRY_USER / INGOT_REGISTRY_PASSWORD"
        )

    def _load_credentials(self) -> None:
        # Only the environment and the Docker config: never anything an artifact carries.
        configs = []
        if os.environ.get("DOCKER_CONFIG"):
            configs.append(os.path.join(os.environ["DOCKER_CONFIG"], "config.json"))
        self._auth.load_configs(oras.container.Container("ingot", self.ref.host), configs)
        user, password = (
            os.environ.get("INGOT_REGISTRY_USER"),
            os.environ.get("INGOT_REGISTRY_PASSWORD"),
        )
        if user and password:
            self._auth.set_basic_auth(user, password)


def _reason(exc: BaseException) -> str:
    """The root cause of a requests error, e.g. 'connection refused', not three wrappers."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        inner = getattr(seen, "reason", None)
        if not isinstance(inner, BaseException) and seen.args:
            inner = seen.args[0] if isinstance(seen.args[0], BaseException) else None
        seen = inner or seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__
