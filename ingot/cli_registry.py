"""`ingot push`, `ingot pull` and `ingot sign`: artifacts in OCI registries, and signatures.

The artifact modules are imported inside the commands: requests, oras and model_signing (a
slow import) load only when a command that needs them runs, not for `ingot --help` or
another command.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ingot.cli_errors import UserError
from ingot.common.errors import IngotError

__all__ = ["register"]

_INSECURE_HELP = (
    "Plain HTTP to a registry that is not on this machine (loopback registries always use it)."
)


def register(main: click.Group) -> None:
    _register_push(main)
    _register_pull(main)
    _register_sign(main)


def _register_push(main: click.Group) -> None:
    @main.command()
    @click.argument("artifact", type=click.Path(exists=True, file_okay=False))
    @click.argument("reference")
    @click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
    @click.option("--json", "as_json", is_flag=True, help="Print reference, digest and tag.")
    def push(artifact: str, reference: str, insecure: bool, as_json: bool) -> None:
        """Verify ARTIFACT and push it to REFERENCE (oci://HOST[:PORT]/REPO:TAG) as a CNCF
        ModelPack artifact. Prints the manifest digest to pin in production."""
        # requests and oras load when the command runs (the module docstring says why)
        from ingot.artifacts.oci import push as run_push

        try:
            result = run_push(artifact, reference, insecure=insecure)
        except IngotError as e:  # a bad artifact, reference or registry
            raise UserError(f"push of {artifact} failed: {e}") from e
        if as_json:
            click.echo(json.dumps(result.to_json()))
        else:
            click.echo(result.digest)


def _register_pull(main: click.Group) -> None:
    @main.command()
    @click.argument("reference")
    @click.option(
        "--out", type=click.Path(file_okay=False), default=None,
        help="Artifact directory to create (default: inside the local store).",
    )  # fmt: skip
    @click.option(
        "--verify-key", type=click.Path(exists=True, dir_okay=False), default=None,
        help="PEM public key: the artifact must carry a valid signature by it.",
    )  # fmt: skip
    @click.option(
        "--target", default=None,
        help="Only what this engine runs, by name (onnxruntime-cpu) or kind (the first of that "
        "kind): common files, its engine files, the roles its record reads, its draft files.",
    )  # fmt: skip
    @click.option(
        "--role", "roles", multiple=True,
        help="Only the files of this role (repeatable; with --target: as well), e.g. "
        "interop:compressed-tensors, portable, eval. [default: every file]",
    )  # fmt: skip
    @click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
    @click.option("--json", "as_json", is_flag=True, help="Print path, reference and digest.")
    def pull(
        reference: str,
        out: str | None,
        verify_key: str | None,
        target: str | None,
        roles: tuple[str, ...],
        insecure: bool,
        as_json: bool,
    ) -> None:
        """Pull REFERENCE (oci://HOST[:PORT]/REPO:TAG or …@sha256:DIGEST) into the local store
        ($INGOT_STORE_DIR, default ~/.cache/ingot) and lay it out as a verified artifact
        directory. Interrupted pulls resume; nothing unverified is left at --out. With
        --target or --role, only those files: the others are listed as absent in
        ingot.partial.json, which `ingot verify` reads."""
        # requests and oras (with --verify-key, model_signing) load when the command runs
        from ingot.artifacts.oci import pull as run_pull
        from ingot.artifacts.signing import verify_signature

        check = (lambda root: verify_signature(root, verify_key)) if verify_key else None
        selection = _selection(target, roles)
        try:
            result = run_pull(reference, out=out, insecure=insecure, check=check, roles=selection)
        except IngotError as e:  # a bad artifact, reference or registry
            raise UserError(f"pull of {reference} failed: {e}") from e
        if as_json:
            click.echo(json.dumps(result.to_json()))
            return
        click.echo(f"{result.path}  {result.reference}")
        if result.partial is not None:
            roles_pulled = ", ".join(sorted(result.partial.roles))
            click.echo(f"  pulled {roles_pulled}; {len(result.absent)} files absent")


def _register_sign(main: click.Group) -> None:
    @main.command()
    @click.argument("artifact", type=click.Path(exists=True, file_okay=False))
    @click.option(
        "--key", required=True, type=click.Path(exists=True, dir_okay=False),
        help="PEM elliptic-curve private key (P-256/384/521); an encrypted key's password is "
        "read from $INGOT_SIGNING_KEY_PASSWORD.",
    )  # fmt: skip
    def sign(artifact: str, key: str) -> None:
        """Sign ARTIFACT's manifest.json into ARTIFACT/model.sig (sigstore model_signing,
        key-based, offline). The manifest lists every file's sha256, so this covers them all."""
        # model_signing (sigstore: a slow import) loads when the command runs
        from ingot.artifacts.signing import sign_artifact

        try:
            signature = sign_artifact(Path(artifact), Path(key))
        except IngotError as e:  # a bad artifact, reference or registry
            raise UserError(f"signing {artifact} failed: {e}") from e
        click.echo(f"signed  {signature}")


def _selection(target: str | None, roles: tuple[str, ...]):  # noqa: ANN202 - oci.Roles
    """What `ingot pull` fetches: None (everything), or a function of the artifact's manifest
    giving the roles of `--target`'s engine plus the `--role`s."""
    if target is None and not roles:
        return None
    # the artifact modules load when the command runs (module docstring)
    from ingot.artifacts.roles import check_roles, engine_roles, target_engine

    def selection(manifest):  # noqa: ANN001, ANN202 - Manifest -> frozenset[str]
        chosen = check_roles(manifest, roles)
        if target is not None:
            chosen |= engine_roles(manifest, target_engine(manifest, target))
        return chosen

    return selection
