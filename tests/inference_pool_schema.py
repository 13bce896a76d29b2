"""A JSON Schema for ``InferencePool`` (``inference.networking.k8s.io/v1``), written here.

InferencePool is a custom resource of the Gateway API Inference Extension
(kubernetes-sigs/gateway-api-inference-extension), so no Kubernetes release carries its
schema and kubernetes-validate has none. This is not the project's CRD file: it is a
transcription, by hand, of the fields of its v1 ``openAPIV3Schema`` (releases v1.0.0 to
v1.6.0) that matter to what the renderer writes, made stricter where those releases differ so
that an object valid here is valid for all of them:

- ``endpointPickerRef`` required (v1.0.0 requires it; later releases make it optional), with
  ``port`` required (their CEL rule: a ``Service`` reference needs its port);
- exactly one ``targetPorts`` entry (v1.0.0 allows one; later releases up to eight);
- no field of the spec beyond the ones listed (the CRD prunes unknown fields silently; here
  they fail, which is what catches a misspelling).

``metadata`` is left to the name and label checks of the test. The real check of a cluster is
``kubectl apply --dry-run=server`` with the extension's CRDs installed.
"""

from __future__ import annotations

from typing import Any

_PORT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["number"],
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
}
_LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}

INFERENCE_POOL_V1: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["matchLabels"],
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "minProperties": 1,
                            "maxProperties": 64,
                            "additionalProperties": _LABEL_VALUE,
                        }
                    },
                },
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 1, "items": _PORT},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "port"],
                    "properties": {
                        "group": {"type": "string", "maxLength": 253},
                        "kind": {"const": "Service"},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}
