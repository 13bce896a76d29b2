"""``model-optimizer deploy kubernetes``: the checked-in rendering is what the command renders
now, bad input is one line and exit 2, and the output folder is written all or nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from model_optimizer import cli
from model_optimizer.deploy import DEFAULT_POLICY, DEFAULT_SPEC, render_files
from model_optimizer.kubernetes import write
from model_optimizer.kubernetes.options import KubeOptions

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "deploy" / "kubernetes" / "manifests"
FACTS = ROOT / "deploy" / "kubernetes" / "default-variants"
TIERS = ("fp16", "int8", "int4")
RENDER_AGAIN = (
    "./mo deploy kubernetes --spec policies/deploy/tiers.yaml "
    "--variants deploy/kubernetes/default-variants --output deploy/kubernetes/manifests"
)


def _run(*args: str) -> int:
    return cli.main(["deploy", "kubernetes", *args])


def _tree(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())}


def test_the_checked_in_rendering_is_current() -> None:
    now = render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, KubeOptions())
    on_disk = _tree(SHIPPED)
    assert sorted(on_disk) == sorted(now), f"stale: {RENDER_AGAIN}"
    for name, text in now.items():
        assert on_disk[name] == text, f"{name} is stale: {RENDER_AGAIN}"


def test_the_command_writes_what_render_files_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    assert _run("--variants", str(FACTS), "--output", str(out), "--shape", "co-located") == 0
    assert "wrote 17 objects" in capsys.readouterr().out
    expected = render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, KubeOptions(shape="co-located"))
    assert _tree(out) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]  # no staging folder left behind


def test_inference_pools_are_written_when_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    args = ("--inference-pools", "--endpoint-picker-port", "9100")
    assert _run("--variants", str(FACTS), "--output", str(out), *args) == 0
    assert "wrote 21 objects" in capsys.readouterr().out
    pools = sorted(name for name in _tree(out) if "-inferencepool-" in name)
    assert [name[3:] for name in pools] == [f"inferencepool-tier-{t}.yaml" for t in TIERS]
    options = KubeOptions(inference_pools=True, endpoint_picker_port=9100)
    assert _tree(out) == render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, options)


def test_a_bad_spec_is_one_line_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "tiers.yaml"
    spec.write_text("model_name: m\ntiers:\n  - {name: fp16, variant: fp16, port: 80}\n")
    out = tmp_path / "k8s"
    assert _run("--spec", str(spec), "--variants", str(FACTS), "--output", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"model-optimizer: error: {spec}:3: tiers[0].port: ")
    assert not out.exists()


def test_without_variants_the_spec_line_says_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("--output", str(tmp_path / "k8s")) == 2
    err = capsys.readouterr().err
    assert f"{DEFAULT_SPEC}:" in err and ": variants_dir: null: give --variants DIR" in err


def test_a_policy_naming_an_unknown_tier_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "routing.yaml"
    routes = "{tolerant: [fp16], code: [fp16], math: [fp16], long: [fp16]}"
    policy.write_text(f"tiers: [fp16, int2]\nroutes: {routes}\n")
    out = tmp_path / "k8s"
    code = _run("--variants", str(FACTS), "--policy", str(policy), "--output", str(out))
    assert code == 2
    assert "unknown tier int2" in capsys.readouterr().err
    assert not out.exists()


def test_a_folder_holding_other_files_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _run("--variants", str(FACTS), "--output", str(out)) == 2
    assert "did not write (notes.txt)" in capsys.readouterr().err
    assert _tree(out) == {"notes.txt": "mine"}


def test_a_failed_write_leaves_the_previous_rendering_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "k8s"
    write.write_all({"00-namespace-a.yaml": "old\n"}, out)
    written: list[str] = []
    real = Path.write_text

    def failing(self: Path, text: str, encoding: str | None = None) -> int:
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(self.name)
        return real(self, text, encoding=encoding)

    monkeypatch.setattr(Path, "write_text", failing)
    files = {f"{i:02d}-configmap-x{i}.yaml": "new\n" for i in range(5)}
    with pytest.raises(OSError):
        write.write_all(files, out)
    assert _tree(out) == {"00-namespace-a.yaml": "old\n"}
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]


def test_a_rerender_replaces_the_folder_whole(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    write.write_all({"00-namespace-a.yaml": "a\n", "01-service-b.yaml": "b\n"}, out)
    write.write_all({"00-namespace-a.yaml": "a2\n"}, out)
    assert _tree(out) == {"00-namespace-a.yaml": "a2\n"}
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]


def test_the_secret_example_holds_placeholders_only_and_is_not_applied() -> None:
    files = render_files(DEFAULT_SPEC, FACTS, DEFAULT_POLICY, KubeOptions())
    example = files[write.SECRET_EXAMPLE]
    assert not write.SECRET_EXAMPLE.endswith((".yaml", ".yml", ".json"))  # kubectl skips it
    assert example.count("REPLACE-ME") == 4
    assert not any("kind: Secret" in text for name, text in files.items() if name.endswith(".yaml"))


def test_the_rendered_gateway_measures_its_tiers_and_knows_their_variants(
    tmp_path: Path,
) -> None:
    facts = tmp_path / "variants"
    shutil.copytree(FACTS, facts)
    meta = json.loads((facts / "int8" / "metadata.json").read_text())
    (facts / "int8" / "metadata.json").write_text(
        json.dumps({**meta, "input_key": {"digest": "d-int8"}})
    )
    files = render_files(DEFAULT_SPEC, facts, DEFAULT_POLICY, KubeOptions())
    configmap = yaml.safe_load(next(t for n, t in files.items() if "gateway-config" in n))
    gateway = yaml.safe_load(configmap["data"]["gateway.yaml"])
    assert gateway["measurement"] == {"enabled": True, "digests": {"int8": "d-int8"}}
