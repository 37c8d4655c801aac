"""Artifact signatures with sigstore's `model_signing` library: key-based and offline.

What is signed is manifest.json, into model.sig (a sigstore bundle) next to it. The manifest
lists the size and sha256 of every other file and verify_artifact refuses any file it does not
list, so a valid signature over it covers the whole artifact, and loading hashes the weights
once (signing the whole directory would hash them twice on every load). It is also exactly
the object a registry digest names. model.sig is the one file the manifest cannot list (it
signs the list); verification admits it unlisted, at the top level, as a regular file only.
The manifest digest stays reproducible; the signature does not (ECDSA nonces).

    ingot sign out/demo --key release.pem
    model_signing verify key out/demo/manifest.json \\
        --signature out/demo/model.sig --public_key release.pub     # the stock CLI agrees
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.paths import MANIFEST_NAME, SIGNATURE_NAME
from ingot.artifacts.verify import verify_artifact

__all__ = ["SIGNATURE_NAME", "check_signature", "sign_artifact", "verify_signature"]

# An encrypted private key's password, for `ingot sign` and recipe signing in CI.
PASSWORD_ENV = "INGOT_SIGNING_KEY_PASSWORD"


def sign_artifact(root: Path | str, key: Path | str, *, password: str | None = None) -> Path:
    """Verify the artifact, then sign its manifest.json into root/model.sig (replacing it).

    `key` is a PEM elliptic-curve private key (P-256, P-384 or P-521); `password` (default:
    $INGOT_SIGNING_KEY_PASSWORD) decrypts it if it is encrypted.
    """
    root, key = Path(root), Path(key)
    verify_artifact(root)  # never sign something that does not verify
    if not key.is_file():
        raise ArtifactError(f"{key}: no such private key file")
    from model_signing import signing  # slow import (sigstore); only when signing

    password = password if password is not None else os.environ.get(PASSWORD_ENV)
    fd, tmp = tempfile.mkstemp(dir=root.parent, prefix=f".{root.name}.sig-")
    os.close(fd)
    try:
        config = signing.Config().use_elliptic_key_signer(private_key=key, password=password)
        config.sign(root / MANIFEST_NAME, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, root / SIGNATURE_NAME)  # a signature appears whole or not at all
    except (ValueError, TypeError) as e:  # not a private key, unsupported curve, bad password
        raise ArtifactError(f"{key}: cannot sign with this key: {e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return root / SIGNATURE_NAME


def verify_signature(root: Path | str, public_key: Path | str) -> None:
    """Raise ArtifactError unless root/model.sig is a valid signature of root/manifest.json
    by the private key matching `public_key` (PEM)."""
    root, public_key = Path(root), Path(public_key)
    signature = root / SIGNATURE_NAME
    try:
        mode = os.lstat(signature).st_mode
    except FileNotFoundError:
        raise ArtifactError(
            f"{signature}: missing: the artifact is unsigned and a signature is required"
        ) from None
    if not stat.S_ISREG(mode):
        raise ArtifactError(f"{signature}: not a regular file (links are refused)")
    if not public_key.is_file():
        raise ArtifactError(f"{public_key}: no such public key file")
    from model_signing import verifying  # slow import (sigstore); only when verifying

    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
        config.verify(root / MANIFEST_NAME, signature)
    except Exception as e:  # noqa: BLE001 - bad key, bad bundle, mismatch: all are "refused"
        reason = str(e).strip() or type(e).__name__
        raise ArtifactError(
            f"{signature}: signature does not verify with {public_key}: {reason}"
        ) from None


def check_signature(
    root: Path | str, *, verify_key: Path | str | None, require: bool | None = None
) -> bool:
    """The loader's policy; returns whether a signature was verified.

    `require` defaults to "a key was given": then model.sig must exist and verify. With
    require=False and a key, a signature is verified if present; without a key nothing is
    checked (a key-based signature cannot be checked without its key).
    """
    require = verify_key is not None if require is None else require
    if require and verify_key is None:
        raise ValueError("require_signature needs verify_key (the signer's public key, PEM)")
    if verify_key is None:
        return False
    if not require and not os.path.lexists(Path(root) / SIGNATURE_NAME):
        return False
    verify_signature(root, verify_key)
    return True
