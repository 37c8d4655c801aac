"""Registry references: `oci://HOST[:PORT]/REPO(:TAG|@sha256:HEX)`, parsed strictly.

A reference decides where registry traffic goes, so anything ambiguous is refused rather than
guessed: there is no default registry (Docker Hub) and no default tag (`latest`), and only
sha256 digests are accepted. The grammar is the OCI distribution spec's.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ingot.common.errors import IngotError

__all__ = ["OCI_SCHEME", "Reference", "InvalidReference", "is_oci_reference", "parse_reference"]

OCI_SCHEME = "oci://"

_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_EXAMPLE = "oci://registry.example.com:5000/models/llama:v1 or …/models/llama@sha256:<64 hex>"


class InvalidReference(IngotError, ValueError):
    """A registry reference that does not parse; the message says which part and why."""


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed reference. `digest` pins the content; `tag` is only a mutable pointer to it."""

    host: str  # "127.0.0.1:5000", "registry.example.com", "[::1]:5000"
    repository: str  # "models/llama"
    tag: str | None = None
    digest: str | None = None  # "sha256:<hex>"

    @property
    def name(self) -> str:
        """host/repository, as docker and oras print it."""
        return f"{self.host}/{self.repository}"

    @property
    def target(self) -> str:
        """What the manifest endpoint is asked for: the digest when there is one."""
        target = self.digest or self.tag
        assert target is not None  # parse_reference guarantees one of them
        return target

    @property
    def hostname(self) -> str:
        """The host without its port (and without IPv6 brackets)."""
        if self.host.startswith("["):
            return self.host[1 : self.host.index("]")]
        return self.host.rsplit(":", 1)[0] if ":" in self.host else self.host

    @property
    def is_loopback(self) -> bool:
        """localhost / 127.0.0.0/8 / ::1: the only registries spoken to over plain HTTP by
        default (traffic never leaves the machine)."""
        if self.hostname.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.hostname).is_loopback
        except ValueError:
            return False

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.host, self.repository, self.tag, digest)

    def pinned(self) -> str:
        """host/repo@sha256:… (the form a production pod should use); needs a digest."""
        if self.digest is None:
            raise ValueError(f"{self}: not pinned to a digest")
        return f"{self.name}@{self.digest}"

    def __str__(self) -> str:
        text = OCI_SCHEME + self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def is_oci_reference(value: object) -> bool:
    """Whether `value` is meant as a registry reference (rather than a local path)."""
    return isinstance(value, str) and value.startswith(OCI_SCHEME)


def parse_reference(text: str) -> Reference:
    """Parse `oci://HOST[:PORT]/REPO(:TAG|@sha256:HEX)`; raise InvalidReference saying why not."""
    if not is_oci_reference(text):
        raise InvalidReference(f"{text!r}: a registry reference starts with oci:// ({_EXAMPLE})")
    rest = text[len(OCI_SCHEME) :]
    host, slash, path = rest.partition("/")
    if not slash or not path:
        raise InvalidReference(f"{text!r}: missing the repository after the host ({_EXAMPLE})")
    _check_host(text, host)

    digest = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST.match(digest):
            raise InvalidReference(
                f"{text!r}: digest {digest!r} is not sha256:<64 lowercase hex digits>"
            )
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG.match(tag):
            raise InvalidReference(
                f"{text!r}: tag {tag!r} is not a valid OCI tag "
                "(letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
            )
    for component in path.split("/"):
        if not _REPO_COMPONENT.match(component):
            raise InvalidReference(
                f"{text!r}: repository component {component!r} is not valid "
                "(lower-case letters and digits, separated by '.', '_', '__' or '-')"
            )
    if len(path) > 255:
        raise InvalidReference(f"{text!r}: repository name longer than 255 characters")
    if tag is None and digest is None:
        raise InvalidReference(
            f"{text!r}: name a tag (:v1) or a digest (@sha256:…); there is no default tag"
        )
    return Reference(host, path, tag, digest)


def _check_host(text: str, host: str) -> None:
    if not host:
        raise InvalidReference(f"{text!r}: missing the registry host ({_EXAMPLE})")
    if host.startswith("["):  # [IPv6]:port
        address, _, after = host[1:].partition("]")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            why = f"host {host!r} is not a valid [IPv6] address"
            raise InvalidReference(f"{text!r}: {why}") from None
        if after:
            _check_port(text, after[1:] if after.startswith(":") else after)
        return
    name, colon, port = host.partition(":")
    if colon:
        _check_port(text, port)
    labels = name.split(".")
    if not all(_HOST_LABEL.match(label) for label in labels):
        raise InvalidReference(f"{text!r}: host {name!r} is not a valid host name or IPv4 address")


def _check_port(text: str, port: str) -> None:
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidReference(f"{text!r}: port {port!r} is not a number from 1 to 65535")
