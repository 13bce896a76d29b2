"""The Kubernetes rendering with plain values: every object, probes, selectors, the network
policy, the tiers' command lines (the argv builder's) and the co-located pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.launch import TierLaunch
from backends.spec import SpecError, parse_spec
from backends.tier_plan import VariantInfo
from backends.vllm_args import build_argv
from gateway.config import GatewayConfig
from gateway.server import SHUTDOWN_FLUSH
from model_optimizer.kubernetes.options import KubeOptions, OptionsError
from model_optimizer.kubernetes.render import Sources, render

SPEC = """\
model_name: tiny-chat
restart: {health_interval_s: 4, health_timeout_s: 3, health_misses: 5}
tiers:
  - {name: fp16, variant: fp16, port: 8101, gpu_memory_utilization: 0.3}
  - {name: int8, variant: int8, port: 8102, gpu_memory_utilization: 0.25, max_model_len: 1024}
  - {name: int4, variant: int4, port: 8103, gpu_memory_utilization: 0.2}
"""
SOURCES = Sources(policy_text="tiers: [fp16]\n", guard_text="# the guard\n")
PORTS = {"fp16": 8101, "int8": 8102, "int4": 8103}
Obj = dict[str, Any]


def _info(name: str) -> VariantInfo:
    return VariantInfo(
        folder=Path("/local") / name,
        variant=name,
        passed=True,
        framework="vllm==0.32.0",
        compile_level=1,
        max_model_len=2048,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        kv_cache_dtype="auto",
        kv_cache_memory_bytes=415457280,
        bytes_per_token=23040,
    )


def _render(text: str = SPEC, **options: Any) -> list[Obj]:
    spec = parse_spec(text, "t.yaml")
    variants = {t.name: _info(t.name) for t in spec.tiers}
    return render(spec, variants, SOURCES, KubeOptions(**options))


def _of(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[Obj], kind: str, name: str) -> Obj:
    [found] = [o for o in _of(objects, kind) if o["metadata"]["name"] == name]
    return found


def _pods(objects: list[Obj]) -> list[Obj]:
    """(labels, pod spec) of every Deployment's pod template."""
    return [d["spec"]["template"] for d in _of(objects, "Deployment")]


def _selects(selector: dict[str, str], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(key) == value for key, value in selector.items())


def _containers(objects: list[Obj]) -> dict[str, Obj]:
    return {c["name"]: c for pod in _pods(objects) for c in pod["spec"]["containers"]}


def test_every_object_kind_is_rendered_in_apply_order() -> None:
    objects = _render()
    kinds = [o["kind"] for o in objects]
    assert kinds[0] == "Namespace"
    assert {
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    } == set(kinds)
    names = {o["metadata"]["name"] for o in _of(objects, "Deployment")}
    assert names == {"gateway", "redis", "tier-fp16", "tier-int8", "tier-int4"}
    assert {o["metadata"]["name"] for o in _of(objects, "ConfigMap")} == {
        "routing-policy",
        "gateway-config",
        "tier-guard",
    }
    assert "Secret" not in kinds  # keys are referenced, never rendered
    for obj in objects[1:]:
        assert obj["metadata"]["namespace"] == "model-optimizer", obj["metadata"]["name"]


def test_gateway_probes_replicas_budget_and_autoscaler() -> None:
    objects = _render(gateway_replicas=3, max_gateway_replicas=9)
    gateway = _one(objects, "Deployment", "gateway")
    assert gateway["spec"]["replicas"] == 3
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # /readyz answers within readiness_timeout, inside the probe's own timeout
    readiness = GatewayConfig.model_fields["readiness_timeout"].default
    assert container["readinessProbe"]["timeoutSeconds"] > readiness
    assert container["command"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    pdb = _one(objects, "PodDisruptionBudget", "gateway")
    assert pdb["spec"]["selector"]["matchLabels"] == pod_labels
    assert pdb["spec"]["maxUnavailable"] == 1
    hpa = _one(objects, "HorizontalPodAutoscaler", "gateway")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 9)
    assert "cpu" in container["resources"]["requests"]  # the autoscaler's utilization needs it
    # SIGKILL comes after the gateway's whole shutdown bound (gateway/server.py), never midway
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    default = GatewayConfig.model_fields["shutdown_timeout"].default
    assert grace > default + SHUTDOWN_FLUSH


def test_tier_probes_come_from_the_specs_restart_policy() -> None:
    containers = _containers(_render())
    for name in PORTS:
        tier = containers[name]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert tier[probe]["httpGet"] == {"path": "/health", "port": PORTS[name]}
        live = tier["livenessProbe"]
        assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (
            4,
            3,
            5,
        )
        start = tier["startupProbe"]
        assert start["periodSeconds"] * start["failureThreshold"] >= 300  # start_timeout_s


def test_every_selector_matches_its_pods_and_only_those() -> None:
    objects = _render()
    pods = _pods(objects)
    for deployment in _of(objects, "Deployment"):
        template = deployment["spec"]["template"]["metadata"]["labels"]
        assert _selects(deployment["spec"]["selector"]["matchLabels"], template)
        others = [p for p in pods if p["metadata"]["labels"] != template]
        assert not any(
            _selects(deployment["spec"]["selector"]["matchLabels"], p["metadata"]["labels"])
            for p in others
        ), deployment["metadata"]["name"]
    for service in _of(objects, "Service"):
        chosen = [p for p in pods if _selects(service["spec"]["selector"], p["metadata"]["labels"])]
        assert len(chosen) == 1, service["metadata"]["name"]
        ports = {c["containerPort"] for c in chosen[0]["spec"]["containers"][0]["ports"]}
        assert service["spec"]["ports"][0]["targetPort"] in ports | {"http"}
    tiers = [s for s in _of(objects, "Service") if s["metadata"]["name"].startswith("tier-")]
    assert len(tiers) == 3 and all(s["spec"]["clusterIP"] == "None" for s in tiers)


def test_only_gateway_pods_reach_the_tiers_and_redis() -> None:
    objects = _render()
    pods = {p["metadata"]["labels"].get("app.kubernetes.io/component"): p for p in _pods(objects)}
    gateway_labels = pods["gateway"]["metadata"]["labels"]
    policies = {p["metadata"]["name"]: p["spec"] for p in _of(objects, "NetworkPolicy")}
    tiers = policies["tiers-from-gateway-only"]
    selected = [
        p["metadata"]["labels"].get("model-optimizer/tier")
        for p in _pods(objects)
        if _selects(tiers["podSelector"]["matchLabels"], p["metadata"]["labels"])
    ]
    assert sorted(selected) == ["fp16", "int4", "int8"]  # every tier pod, nothing else
    assert tiers["policyTypes"] == ["Ingress", "Egress"] and tiers["egress"] == []
    [rule] = tiers["ingress"]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector, no ipBlock
    assert peer["podSelector"]["matchLabels"] == gateway_labels
    assert sorted(p["port"] for p in rule["ports"]) == sorted(PORTS.values())
    redis = policies["redis-from-gateway-only"]
    assert _selects(redis["podSelector"]["matchLabels"], pods["redis"]["metadata"]["labels"])
    assert redis["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == gateway_labels


def test_tier_commands_are_the_argv_builders() -> None:
    containers = _containers(_render())
    expected = TierLaunch(
        name="int8",
        model_dir=Path("/variants/int8"),
        served_model_name="tiny-chat",
        port=8102,
        host="0.0.0.0",
        device="cuda",
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=415457280,
        gpu_memory_utilization=0.25,
        sleep_mode=True,
        extra_args=("-O1",),
    )
    assert containers["int8"]["command"] == build_argv(Path("python3"), expected)
    for name, port in PORTS.items():
        command = containers[name]["command"]
        assert command[command.index("--port") + 1] == str(port)
        assert command[command.index("--model") + 1] == f"/variants/{name}"


def test_tiers_need_a_gpu_and_the_key_from_the_secret() -> None:
    for name, tier in _containers(_render(secret_name="keys")).items():
        if name not in PORTS:
            continue
        assert tier["resources"] == {
            "requests": {"nvidia.com/gpu": 1},
            "limits": {"nvidia.com/gpu": 1},
        }
        env = {e["name"]: e for e in tier["env"]}
        assert env["VLLM_SERVER_DEV_MODE"]["value"] == "1"
        for key in ("MO_TIER_API_KEY", "VLLM_API_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "tier-key"}
        assert env["PYTHONPATH"]["value"] == "/opt/model-optimizer"


def test_the_co_located_shape_is_three_containers_sharing_one_gpu() -> None:
    objects = _render(shape="co-located")
    tier_pods = [d for d in _of(objects, "Deployment") if d["metadata"]["name"] == "tiers"]
    assert len(tier_pods) == 1 and not any(
        d["metadata"]["name"].startswith("tier-") for d in _of(objects, "Deployment")
    )
    pod = tier_pods[0]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["fp16", "int8", "int4"]
    assert "nvidia.com/gpu" not in yaml.safe_dump(objects)
    [claim] = pod["resourceClaims"]
    assert all(c["resources"] == {"claims": [{"name": claim["name"]}]} for c in pod["containers"])
    [template] = _of(objects, "ResourceClaimTemplate")
    assert template["metadata"]["name"] == claim["resourceClaimTemplateName"]
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1
    shares = [
        float(c["command"][c["command"].index("--gpu-memory-utilization") + 1])
        for c in pod["containers"]
    ]
    assert shares == [0.3, 0.25, 0.2]
    # The tiers start in turn: each but the last holds the next until its /health answers.
    hooks = [c.get("lifecycle", {}).get("postStart") for c in pod["containers"]]
    assert "8101/health" in hooks[0]["exec"]["command"][-1]
    assert "8102/health" in hooks[1]["exec"]["command"][-1]
    assert hooks[2] is None
    for service in [
        s for s in _of(objects, "Service") if s["metadata"]["name"].startswith("tier-")
    ]:
        assert _selects(
            service["spec"]["selector"], tier_pods[0]["spec"]["template"]["metadata"]["labels"]
        )


def test_the_gateway_config_names_the_tiers_as_served_and_no_key() -> None:
    objects = _render()
    text = _one(objects, "ConfigMap", "gateway-config")["data"]["gateway.yaml"]
    config = GatewayConfig.model_validate(yaml.safe_load(text))
    assert [(t.name, t.base_url, t.max_model_len) for t in config.tiers] == [
        ("fp16", "http://tier-fp16:8101", 2048),
        ("int8", "http://tier-int8:8102", 1024),
        ("int4", "http://tier-int4:8103", 2048),
    ]
    assert config.redis_url == "redis://redis:6379/0"
    assert config.tokenizer_dir == "/variants/fp16"
    assert config.policy_path == "/etc/model-optimizer/policy/routing.yaml"
    assert config.api_key_hashes == [] and all(t.api_key is None for t in config.tiers)
    assert _one(objects, "ConfigMap", "routing-policy")["data"] == {
        "routing.yaml": SOURCES.policy_text
    }
    guard = _one(objects, "ConfigMap", "tier-guard")["data"]
    assert guard == {"__init__.py": "", "tier_guard.py": SOURCES.guard_text}
    gateway = _one(objects, "Deployment", "gateway")["spec"]["template"]["spec"]
    [container] = gateway["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container["env"]}
    assert env["MO_GATEWAY_API_KEYS"] == {"name": "model-optimizer-keys", "key": "api-keys"}
    assert env["MO_TIER_API_KEY"] == {"name": "model-optimizer-keys", "key": "tier-key"}
    # The policy's folder is mounted whole (kubelet updates no subPath mount).
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert "subPath" not in mounts["routing-policy"]
    assert mounts["routing-policy"]["mountPath"] == "/etc/model-optimizer/policy"


def test_an_external_redis_renders_none() -> None:
    objects = _render(redis_url="redis://cache.example:6379/2")
    assert not [o for o in objects if o["metadata"]["name"].startswith("redis")]
    text = _one(objects, "ConfigMap", "gateway-config")["data"]["gateway.yaml"]
    assert yaml.safe_load(text)["redis_url"] == "redis://cache.example:6379/2"


def test_the_cuda_checks_of_up_hold() -> None:
    crowded = SPEC.replace("0.3}", "0.6}")
    with pytest.raises(SpecError, match=r"^t\.yaml:\d+: tiers: gpu_memory_utilization sums"):
        _render(crowded)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"namespace": "Bad_Name"}, "namespace"),
        ({"gateway_replicas": 0}, "gateway_replicas"),
        ({"gateway_replicas": 4, "max_gateway_replicas": 3}, "max_gateway_replicas"),
        ({"redis_url": "http://x"}, "redis_url"),
        ({"shape": "sideways"}, "shape"),
        ({"endpoint_picker_port": 0}, "endpoint_picker_port"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError, match=f"^{message}:"):
        KubeOptions(**options)


SCALED = SPEC.replace("max_model_len: 1024}", "max_model_len: 1024, replicas: 3}")


def test_a_scaled_tier_is_a_pool_behind_its_headless_service() -> None:
    objects = _render(SCALED)
    int8, fp16 = _one(objects, "Deployment", "tier-int8"), _one(objects, "Deployment", "tier-fp16")
    assert int8["spec"]["replicas"] == 3
    # One pod at a time, none added first (each holds a GPU): the pool keeps serving.
    assert int8["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert fp16["spec"]["replicas"] == 1 and fp16["spec"]["strategy"] == {"type": "Recreate"}
    text = _one(objects, "ConfigMap", "gateway-config")["data"]["gateway.yaml"]
    tiers = {t["name"]: t for t in yaml.safe_load(text)["tiers"]}
    assert tiers["int8"] == {
        "name": "int8",
        "dns": "http://tier-int8:8102",
        "max_model_len": 1024,
        "engine": "vllm",
    }
    assert tiers["fp16"] == {
        "name": "fp16",
        "base_url": "http://tier-fp16:8101",
        "max_model_len": 2048,
        "engine": "vllm",
    }
    config = {t.name: t for t in GatewayConfig.model_validate(yaml.safe_load(text)).tiers}
    assert config["int8"].dns == "http://tier-int8:8102" and config["fp16"].dns is None
    # The name the gateway resolves is the headless Service that selects the tier's pods.
    service = _one(objects, "Service", "tier-int8")["spec"]
    assert service["clusterIP"] == "None" and service["ports"][0]["port"] == 8102
    assert _selects(service["selector"], int8["spec"]["template"]["metadata"]["labels"])
    assert not service.get("publishNotReadyAddresses")  # only ready pods are resolved
    # A drain takes one pod of the pool at a time, and only the scaled tier has a budget.
    [budget] = [
        b for b in _of(objects, "PodDisruptionBudget") if b["metadata"]["name"] != "gateway"
    ]
    assert budget["metadata"]["name"] == "tier-int8" and budget["spec"]["maxUnavailable"] == 1
    chosen = [
        p["metadata"]["labels"].get("model-optimizer/tier")
        for p in _pods(objects)
        if _selects(budget["spec"]["selector"]["matchLabels"], p["metadata"]["labels"])
    ]
    assert chosen == ["int8"]


def test_one_replica_renders_as_before() -> None:
    one = SPEC.replace("max_model_len: 1024}", "max_model_len: 1024, replicas: 1}")
    assert _render(one) == _render()


def test_replicas_are_refused_where_they_cannot_run() -> None:
    with pytest.raises(SpecError, match=r"^t\.yaml:5: tiers\[1\]\.replicas: 3 replicas need"):
        _render(SCALED, shape="co-located")
    with pytest.raises(SpecError, match=r"^t\.yaml:5: tiers\[1\]\.replicas: "):
        _render(SCALED.replace("replicas: 3", "replicas: 0"))


def test_inference_pools_are_opt_in_and_select_each_tiers_pods() -> None:
    assert not _of(_render(), "InferencePool")
    objects = _render(inference_pools=True, endpoint_picker_port=9100)
    pools = {p["metadata"]["name"]: p for p in _of(objects, "InferencePool")}
    assert sorted(pools) == ["tier-fp16", "tier-int4", "tier-int8"]
    for name, port in PORTS.items():
        pool = pools[f"tier-{name}"]
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        spec = pool["spec"]
        assert spec["targetPorts"] == [{"number": port}]
        assert spec["endpointPickerRef"] == {"name": f"tier-{name}-epp", "port": {"number": 9100}}
        chosen = [
            p
            for p in _pods(objects)
            if _selects(spec["selector"]["matchLabels"], p["metadata"]["labels"])
        ]
        assert [p["metadata"]["labels"]["model-optimizer/tier"] for p in chosen] == [name]
        assert port in {c["containerPort"] for c in chosen[0]["spec"]["containers"][0]["ports"]}
    # The rest is the default rendering: the gateway still chooses the tier itself.
    assert [o for o in objects if o["kind"] != "InferencePool"] == _render()


def test_co_located_inference_pools_tell_the_tiers_apart_by_port() -> None:
    objects = _render(shape="co-located", inference_pools=True)
    [pod] = [
        p
        for p in _pods(objects)
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "tier"
    ]
    for pool in _of(objects, "InferencePool"):
        spec = pool["spec"]
        assert _selects(spec["selector"]["matchLabels"], pod["metadata"]["labels"])
        tier = pool["metadata"]["name"].removeprefix("tier-")
        [container] = [c for c in pod["spec"]["containers"] if c["name"] == tier]
        assert spec["targetPorts"] == [{"number": container["ports"][0]["containerPort"]}]


# --------------------------------------------------------------------------- llama.cpp tiers


def _gguf(name: str) -> VariantInfo:
    info = _info(name)
    return VariantInfo(
        **{
            **info.__dict__,
            "framework": "llama.cpp==0c1e570",
            "format": "gguf",
            "sampling": {"temperature": 0.2, "top_p": 0.9},
        }
    )


def _render_llama(**options: Any) -> list[Obj]:
    spec = parse_spec(SPEC, "t.yaml")
    variants = {t.name: _gguf(t.name) for t in spec.tiers}
    return render(spec, variants, SOURCES, KubeOptions(tier_engine="llama.cpp", **options))


def test_llama_cpp_tiers_run_llama_server_as_up_does_on_cpu_nodes() -> None:
    from backends.llama_args import build_argv as llama_argv

    objects = _render_llama(tier_cpus=4)
    containers = _containers(objects)
    int4 = containers["int4"]
    assert int4["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    launch = TierLaunch(
        name="int4",
        model_dir=Path("/variants/int4"),
        served_model_name="tiny-chat",
        port=8103,
        host="0.0.0.0",
        engine="llama.cpp",
        max_model_len=2048,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=415457280,
        sampling={"temperature": 0.2, "top_p": 0.9},
        threads=4,  # a pod of its own: its cores
        slot_dir=Path("/slots"),
    )
    assert int4["command"] == llama_argv(Path("/app/llama-server"), launch)
    assert int4["resources"] == {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}
    key = [e for e in int4["env"] if e["name"] == "LLAMA_API_KEY"]
    assert key and key[0]["valueFrom"]["secretKeyRef"]["name"] == "model-optimizer-keys"
    assert int4["readinessProbe"]["httpGet"]["path"] == "/health"
    # no tier guard to mount, no GPU to claim
    assert not [o for o in objects if o["metadata"]["name"] == "tier-guard"]
    assert "nvidia.com/gpu" not in str(objects)
    text = _one(objects, "ConfigMap", "gateway-config")["data"]["gateway.yaml"]
    tiers = {t["name"]: t for t in yaml.safe_load(text)["tiers"]}
    assert {t["engine"] for t in tiers.values()} == {"llama.cpp"}


def test_co_located_llama_tiers_share_a_pod_one_thread_each() -> None:
    objects = _render_llama(shape="co-located")
    [pod] = [p for p in _pods(objects) if "int4" in str(p["spec"]["containers"])]
    containers = pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["fp16", "int8", "int4"]
    for container in containers:
        command = container["command"]
        assert command[command.index("--threads") + 1] == "1"
        assert "lifecycle" not in container  # nothing to take turns for
    assert not _of(objects, "ResourceClaimTemplate")


def test_llama_cpp_refuses_what_it_cannot_do() -> None:
    with pytest.raises(OptionsError, match="endpoint picker reads vLLM's metrics"):
        KubeOptions(tier_engine="llama.cpp", inference_pools=True)
    with pytest.raises(OptionsError, match="tier_cpus"):
        KubeOptions(tier_engine="llama.cpp", tier_cpus=0)
    spec = parse_spec(SPEC, "t.yaml")
    safetensors = {t.name: _info(t.name) for t in spec.tiers}
    with pytest.raises(SpecError, match=r"llama\.cpp serves gguf variants"):
        render(spec, safetensors, SOURCES, KubeOptions(tier_engine="llama.cpp"))
