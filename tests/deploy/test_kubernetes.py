"""deploy/kubernetes.yaml and its generator (`ingot plan ARTIFACT --serve --emit kubernetes`):
valid against the Kubernetes API schema, its resources and serve options from the serving
plan, its shutdown long enough for `ingot serve`'s drain, and the checked-in file the
generator's output for the demo."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from ingot.artifacts import read_manifest
from ingot.cli import main
from ingot.kubernetes import PRE_STOP_S, DeploymentSpec, KubernetesError, kubernetes_objects
from ingot.runtime.server.launch import SHUTDOWN_BACKSTOP_S
from ingot.runtime.serving_plan import ServingRequest, plan_serving

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "deploy" / "kubernetes.yaml"
REF = "oci://registry.example.com/ingot/demo@sha256:" + "0" * 64
# The demo's example, as deploy/kubernetes.yaml's first line says it was made.
EMIT = ["--serve", "--memory", "1GiB", "--emit", "kubernetes", "--artifact-ref", REF]
# The oldest Kubernetes still supported upstream when this was written, and the newest schema
# the validator bundles.
VERSIONS = ("1.32", kubernetes_validate.latest_version())


def _emitted(artifact: Path, *extra: str) -> str:
    result = CliRunner().invoke(main, ["plan", str(artifact), *EMIT, *extra])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("version", VERSIONS)
def test_the_checked_in_manifest_validates_against_the_api_schema(version):
    documents = list(yaml.safe_load_all(CHECKED_IN.read_text()))
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_what_the_api_would():
    deployment, _ = yaml.safe_load_all(CHECKED_IN.read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["periodSeconds"] = "often"
    with pytest.raises(kubernetes_validate.ValidationError, match="not of type 'integer'"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_the_checked_in_manifest_is_the_generators_output_for_the_demo(demo_artifact):
    assert _emitted(demo_artifact) == CHECKED_IN.read_text(), (
        "deploy/kubernetes.yaml is stale: regenerate it with `ingot plan out/demo "
        + " ".join(EMIT)
        + " > deploy/kubernetes.yaml` (out/demo built from recipes/demo.yaml)"
    )


def test_resources_args_probes_and_shutdown_come_from_the_plan(demo_artifact):
    plan = plan_serving(read_manifest(demo_artifact), ServingRequest(2 << 30, max_num_seqs=8))
    spec = DeploymentSpec("demo", "ingot:runtime", REF, shutdown_grace=60, backstop_s=5)
    deployment, service = kubernetes_objects(plan, spec)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"] == {
        "requests": {"memory": f"{plan.memory_request >> 20}Mi"},
        "limits": {"memory": "2048Mi"},
    }
    args = container["args"]
    assert args[:2] == ["serve", REF] and args[-2:] == ["--shutdown-grace", "60"]
    assert " ".join(plan.serve_args()) in " ".join(args)
    # the drain (grace + uvicorn's backstop) after the preStop pause, inside the grace period
    assert pod["terminationGracePeriodSeconds"] >= PRE_STOP_S + 60 + 5
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert "tcpSocket" in container["livenessProbe"]  # /health is 503 while draining
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for document in (deployment, service):
        kubernetes_validate.validate(document, VERSIONS[-1], strict=True)


def test_the_manifests_serve_command_is_one_ingot_serve_accepts():
    deployment, _ = yaml.safe_load_all(CHECKED_IN.read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "serve"
    context = main.commands["serve"].make_context("serve", container["args"][1:])
    params = context.params
    assert params["artifact"] == REF and params["host"] == "0.0.0.0"
    assert (
        params["shutdown_grace"] + SHUTDOWN_BACKSTOP_S + PRE_STOP_S
        <= (deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
    )


def test_the_artifact_is_pulled_by_digest(demo_artifact):
    with pytest.raises(KubernetesError, match="by digest"):
        DeploymentSpec("demo", "ingot:runtime", "oci://registry.example.com/ingot/demo:latest")
    result = CliRunner().invoke(
        main, ["plan", str(demo_artifact), "--serve", "--memory", "1GiB", "--emit", "kubernetes"]
    )
    assert result.exit_code == 1 and "pulls the artifact by digest" in result.output
