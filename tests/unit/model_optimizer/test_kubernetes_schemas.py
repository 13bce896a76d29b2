"""Every rendered manifest against the Kubernetes API's own schemas, offline.

``kubernetes-validate`` (requirements/gateway.txt) carries the API's OpenAPI definitions as JSON
Schema for Kubernetes 1.25 to 1.37, on disk: nothing is fetched (the tests below run with
sockets refused). Its strict schemas refuse unknown fields, so a misspelled or misplaced
field, a wrong type, a missing required field, a wrong apiVersion or kind fails here. Each
object is checked against 1.34, the oldest Kubernetes the rendering asks for (the co-located
shape's ``resource.k8s.io/v1`` claim), and 1.37, the newest the package carries.

What the schemas leave to the API server is checked by hand below, for what the renderer
writes: object, container and port names, label keys and values, port numbers.

A kind no Kubernetes release defines (the opt-in ``InferencePool``, a custom resource) has no
schema there: it is checked against the one in tests/inference_pool_schema.py, a transcription
of its CRD's v1 fields (stricter than every v1 release), and any other such kind fails.
"""

from __future__ import annotations

import copy
import functools
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from model_optimizer.deploy import DEFAULT_POLICY, DEFAULT_SPEC, render_files
from model_optimizer.kubernetes.options import KubeOptions
from tests.inference_pool_schema import INFERENCE_POOL_V1

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "deploy" / "kubernetes" / "manifests"
FACTS = ROOT / "deploy" / "kubernetes" / "default-variants"
FACTS_GGUF = ROOT / "deploy" / "kubernetes" / "default-variants-gguf"
VERSIONS = ("1.34", "1.37")
Obj = dict[str, Any]

# The API server's syntax rules the schemas do not carry (k8s.io/apimachinery validation).
_LABEL = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(rf"({_SUBDOMAIN.pattern}/)?{_LABEL}")
_LABEL_VALUE = re.compile(rf"({_LABEL})?")
_PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
# Services and Namespaces take DNS labels (a Service's must start with a letter).
_NAME_RULE = {"Service": re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"), "Namespace": _DNS_LABEL}
# Custom resources: (apiVersion, kind) -> the schema they are checked against instead.
CUSTOM = {("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL_V1}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection and no name lookup while validating: the schemas are on disk. Each schema
    file is parsed once (the package reads its 1.8 MB of definitions on every call)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the validation tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents", _schema_contents)


_schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


def problems(obj: Obj, version: str) -> list[str]:
    """What the API would refuse in ``obj`` at ``version``: the strict schema's first error
    (a custom resource's: ``CUSTOM``'s), then the syntax rules above. Empty: valid. A kind
    without a schema raises."""
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    found = []
    custom = CUSTOM.get((obj.get("apiVersion"), obj.get("kind")))
    error: jsonschema.ValidationError | None = None
    if custom is not None:
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(custom).iter_errors(obj)
        )
    else:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            error = exc
    if error is not None:
        found.append(f"{where}: {'.'.join(map(str, error.path))}: {error.message}")
    found.extend(f"{where}: {problem}" for problem in syntax_problems(obj))
    return found


def syntax_problems(obj: Obj) -> Iterator[str]:
    name = obj["metadata"]["name"]
    if not _NAME_RULE.get(obj["kind"], _SUBDOMAIN).fullmatch(name):
        yield f"metadata.name: {name!r} is not a valid {obj['kind']} name"
    for path, key, value in _walk(obj):
        if key in ("labels", "matchLabels", "selector") and isinstance(value, dict):
            for label, text in value.items():
                if not isinstance(text, str):
                    continue  # a LabelSelector, walked into below
                if not _LABEL_KEY.fullmatch(label) or not _LABEL_VALUE.fullmatch(text):
                    yield f"{path}: label {label}={text!r} is not a label"
        if key == "containers":
            for container in value:
                if not _DNS_LABEL.fullmatch(container["name"]):
                    yield f"{path}: container name {container['name']!r}"
        if key == "ports":
            for port in value:
                named = port.get("name")
                if named is not None and not _PORT_NAME.fullmatch(named):
                    yield f"{path}: port name {named!r}"
                for field in ("port", "containerPort", "targetPort", "number"):
                    number = port.get(field)
                    if isinstance(number, int) and not 1 <= number <= 65535:
                        yield f"{path}: {field} {number} is not a port"


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            yield where, key, value
            yield from _walk(value, where)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")


def _objects(files: dict[str, str]) -> list[tuple[str, Obj]]:
    """(file name, object) of every file the command writes, the Secret's example too."""
    return [(name, yaml.safe_load(text)) for name, text in sorted(files.items())]


RENDERINGS: dict[str, KubeOptions] = {
    "default": KubeOptions(),
    "co-located": KubeOptions(shape="co-located"),
    "external-redis": KubeOptions(
        redis_url="rediss://cache.example:6380/2",
        namespace="llm",
        secret_name="llm-keys",
        gateway_replicas=1,
        max_gateway_replicas=1,
    ),
    "scaled": KubeOptions(),  # the shipped spec with fp16 at 3 replicas, int4 at 2
    "inference-pools": KubeOptions(inference_pools=True),
    "inference-pools-co-located": KubeOptions(inference_pools=True, shape="co-located"),
}


def _scaled_spec(folder: Path) -> Path:
    """The shipped spec with two tiers of several pods (Deployment, budget, dns pool)."""
    text = DEFAULT_SPEC.read_text(encoding="utf-8")
    scaled = text.replace("    replicas: 1\n", "    replicas: 3\n", 1).replace(
        "gpu_memory_utilization: 0.20}", "gpu_memory_utilization: 0.20, replicas: 2}"
    )
    assert scaled.count("replicas: ") == text.count("replicas: ") + 1
    (folder / "tiers.yaml").write_text(scaled, encoding="utf-8")
    return folder / "tiers.yaml"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_every_rendered_object_is_valid(rendering: str, version: str, tmp_path: Path) -> None:
    spec = _scaled_spec(tmp_path) if rendering == "scaled" else DEFAULT_SPEC
    files = render_files(spec, FACTS, DEFAULT_POLICY, RENDERINGS[rendering])
    kinds = [obj["kind"] for _, obj in _objects(files)]
    if rendering == "scaled":
        assert kinds.count("PodDisruptionBudget") == 3  # the gateway's, fp16's, int4's
    assert kinds.count("InferencePool") == (3 if rendering.startswith("inference-pools") else 0)
    for name, obj in _objects(files):
        assert problems(obj, version) == [], name


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", ("per-tier", "co-located"))
def test_llama_cpp_tiers_render_valid_objects(shape: str, version: str) -> None:
    options = KubeOptions(tier_engine="llama.cpp", shape=shape)  # type: ignore[arg-type]
    files = render_files(DEFAULT_SPEC, FACTS_GGUF, DEFAULT_POLICY, options)
    kinds = [obj["kind"] for _, obj in _objects(files)]
    assert "ResourceClaimTemplate" not in kinds
    for name, obj in _objects(files):
        assert problems(obj, version) == [], name


@pytest.mark.parametrize("version", VERSIONS)
def test_the_checked_in_manifests_are_valid(version: str) -> None:
    files = {p.name: p.read_text(encoding="utf-8") for p in SHIPPED.iterdir()}
    assert len(files) > 10
    for name, obj in _objects(files):
        assert problems(obj, version) == [], name


def _tier() -> Obj:
    files = render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, KubeOptions())
    [text] = [t for n, t in files.items() if n.endswith("-deployment-tier-int8.yaml")]
    found: Obj = yaml.safe_load(text)
    return found


def _container(obj: Obj) -> Obj:
    found: Obj = obj["spec"]["template"]["spec"]["containers"][0]
    return found


def test_a_misspelled_field_fails() -> None:
    broken = _tier()
    container = _container(broken)
    container["readinesProbe"] = container.pop("readinessProbe")
    [problem] = problems(broken, "1.37")
    assert "spec.template.spec.containers.0" in problem and "'readinesProbe'" in problem


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda o: o["spec"].update(replicas="two"), "spec.replicas: 'two' is not of type"),
        (lambda o: o["spec"].pop("selector"), "'selector' is a required property"),
        (lambda o: o["spec"]["template"].update(replicas=2), "'replicas' was unexpected"),
        (lambda o: _container(o)["env"][0].update(value=1), ".value: 1 is not of type"),
        (lambda o: _container(o)["ports"][0].update(containerPort=99999), "is not a port"),
        (lambda o: o["metadata"].update(name="Tier_Int8"), "is not a valid Deployment name"),
        (lambda o: o["metadata"]["labels"].update({"tier": "int 8"}), "is not a label"),
    ],
)
def test_a_broken_object_fails(breakage: Any, expected: str) -> None:
    broken = copy.deepcopy(_tier())
    breakage(broken)
    found = problems(broken, "1.34")
    assert len(found) == 1 and expected in found[0], found


def test_a_kind_without_a_schema_is_not_passed_silently() -> None:
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        problems(unknown, "1.37")


def _pool() -> Obj:
    files = render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, KubeOptions(inference_pools=True))
    [text] = [t for n, t in files.items() if n.endswith("-inferencepool-tier-int4.yaml")]
    found: Obj = yaml.safe_load(text)
    return found


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda o: o["spec"].update(targetPort=o["spec"].pop("targetPorts")), "'targetPort'"),
        (lambda o: o["spec"]["endpointPickerRef"].pop("port"), "'port' is a required property"),
        (lambda o: o["spec"]["targetPorts"].append({"number": 9}), "is too long"),
        (lambda o: o["spec"]["targetPorts"][0].update(number="8103"), "'8103' is not of type"),
        (lambda o: o.update(apiVersion="inference.networking.x-k8s.io/v1alpha2"), "no schema"),
    ],
)
def test_a_broken_inference_pool_fails(breakage: Any, expected: str) -> None:
    pool = _pool()
    assert problems(pool, "1.37") == []
    breakage(pool)
    try:
        found = problems(pool, "1.37")
    except kubernetes_validate.SchemaNotFoundError:
        found = ["no schema"]
    assert len(found) == 1 and expected in found[0], found
