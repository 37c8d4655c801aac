"""`ingot plan ARTIFACT --serve ... --emit kubernetes`: a Deployment and a Service that run
`ingot serve oci://REPO@sha256:...` with the serving plan's options and memory.

- the artifact is pulled by digest when the container starts, into an emptyDir store
  (INGOT_STORE_DIR; on disk, not tmpfs, whose pages would count against the memory limit);
  registry credentials come from an optional Secret (INGOT_REGISTRY_USER / _PASSWORD);
- memory request = the plan's resident total, limit = --memory (runtime/serving_plan.py);
- probes: a startup probe on /health (503 until the artifact is pulled, verified and warmed
  up) allowing `STARTUP_S`, readiness on /health (503 again once draining), liveness on the
  TCP port (still open while draining, where /health is 503 by design);
- shutdown: a preStop pause so the Service stops routing here before SIGTERM, then `ingot
  serve`'s drain (--shutdown-grace) and uvicorn's backstop: terminationGracePeriodSeconds
  covers all three, so the kubelet's SIGKILL never cuts the drain short.

The YAML is written here (block style, every string a JSON string, which YAML reads as is):
the runtime install, where this runs, has no YAML library.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ingot.common.errors import IngotError
from ingot.runtime.serving_plan import ServingPlan

__all__ = ["DeploymentSpec", "KubernetesError", "kubernetes_objects", "to_yaml"]

PRE_STOP_S = 5  # endpoints are removed asynchronously; a few seconds lets routing catch up
STARTUP_S = 600  # pull + verify + load + warm-up at 8B on a slow volume
STORE_DIR = "/var/lib/ingot/store"
SECRET = "ingot-registry"  # optional: registry credentials


class KubernetesError(IngotError, ValueError):
    """The manifest cannot be written as asked (e.g. a reference that is not by digest)."""


class DeploymentSpec:
    """What the manifest needs besides the plan."""

    def __init__(
        self,
        name: str,
        image: str,
        reference: str,
        *,
        port: int = 8000,
        shutdown_grace: float = 30.0,
        backstop_s: float = 5.0,
        replicas: int = 1,
    ) -> None:
        if not reference.startswith("oci://") or "@sha256:" not in reference:
            raise KubernetesError(
                f"--artifact-ref {reference!r}: the pod pulls the artifact by digest, "
                "oci://REGISTRY/REPO@sha256:<64 hex digits> (`ingot push` prints it)"
            )
        self.name, self.image, self.reference = name, image, reference
        self.port, self.shutdown_grace, self.backstop_s = port, shutdown_grace, backstop_s
        self.replicas = replicas

    @property
    def termination_grace_s(self) -> int:
        return math.ceil(PRE_STOP_S + self.shutdown_grace + self.backstop_s)


def kubernetes_objects(plan: ServingPlan, spec: DeploymentSpec) -> list[dict[str, Any]]:
    """The Deployment and the Service, as the API takes them."""
    labels = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/component": "ingot-serve"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": spec.termination_grace_s,
                    "containers": [_container(plan, spec)],
                    "volumes": [{"name": "store", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
        },
    }
    return [deployment, service]


def _container(plan: ServingPlan, spec: DeploymentSpec) -> dict[str, Any]:
    args = ["serve", spec.reference, "--host", "0.0.0.0", "--port", str(spec.port)]
    args += [*plan.serve_args(), "--shutdown-grace", f"{spec.shutdown_grace:g}"]
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "name": "ingot",
        "image": spec.image,
        "args": args,
        "ports": [{"name": "http", "containerPort": spec.port}],
        "env": [
            {"name": "INGOT_STORE_DIR", "value": STORE_DIR},
            *(_secret_env(f"INGOT_REGISTRY_{key.upper()}", key) for key in ("user", "password")),
        ],
        "resources": {
            "requests": {"memory": f"{plan.memory_request >> 20}Mi"},
            "limits": {"memory": f"{plan.memory >> 20}Mi"},
        },
        "startupProbe": {**health, "periodSeconds": 5, "failureThreshold": STARTUP_S // 5},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 1},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
        "volumeMounts": [{"name": "store", "mountPath": STORE_DIR}],
    }


def _secret_env(name: str, key: str) -> dict[str, Any]:
    ref = {"name": SECRET, "key": key, "optional": True}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def to_yaml(objects: list[dict[str, Any]], header: str = "") -> str:
    """`objects` as YAML documents, `header` as comment lines above them."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + "".join("---\n" + _block(o, 0) for o in objects)


def _block(value: Any, indent: int) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        out = ""
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out += f"{pad}{key}:\n{_block(item, indent + 2)}"
            else:
                out += f"{pad}{key}: {_scalar(item)}\n"
        return out
    out = ""
    for item in value:
        if isinstance(item, dict | list) and item:
            inner = _block(item, indent + 2)
            out += f"{pad}- {inner[indent + 2 :]}"  # the first line after the dash
        else:
            out += f"{pad}- {_scalar(item)}\n"
    return out


def _scalar(value: Any) -> str:
    return json.dumps(value)  # numbers, true/false, {} and [] and "strings" read the same
