"""targets: loopback only, gateway or tier, tiers by name."""

import pytest

from backends.process import free_port
from measure.targets import TargetError, check_loopback, parse_tiers, resolve_targets
from tests.unit.measure.conftest import MODEL, StubServer


def test_check_loopback() -> None:
    assert check_loopback("http://127.0.0.1:8000/") == ("http://127.0.0.1:8000", 8000)
    assert check_loopback("http://localhost:9/v1") == ("http://localhost:9", 9)
    assert check_loopback("http://[::1]:7") == ("http://[::1]:7", 7)
    for bad in ("http://10.0.0.1:8000", "https://127.0.0.1:1", "example.com", "http://a.b:1"):
        with pytest.raises(TargetError):
            check_loopback(bad)


def test_parse_tiers() -> None:
    assert parse_tiers("") == []
    assert parse_tiers("fp16, int8,gateway") == ["fp16", "int8", "gateway"]
    with pytest.raises(TargetError, match="twice"):
        parse_tiers("fp16,fp16")


def test_unreachable_target() -> None:
    with pytest.raises(TargetError, match="unreachable"):
        resolve_targets(f"http://127.0.0.1:{free_port()}", [])


def test_a_server_without_readyz_is_a_tier(stub: StubServer) -> None:
    model, targets = resolve_targets(stub.url, [])
    assert model == MODEL
    assert [(t.kind, t.url) for t in targets] == [("tier", stub.url)]
    with pytest.raises(TargetError, match="needs a gateway"):
        resolve_targets(stub.url, ["fp16"])


def test_gateway_target_and_unknown_tier(stub_gateway: StubServer) -> None:
    _, targets = resolve_targets(stub_gateway.url, ["gateway"])
    assert [(t.label, t.kind) for t in targets] == [("gateway", "gateway")]
    # The stub gateway is the test process, which may have a real stack's tiers under it
    # when the integration tests run in the same session: ask for a tier no stack has.
    with pytest.raises(TargetError, match="unknown tier 'fp64'"):
        resolve_targets(stub_gateway.url, ["fp64"])
