"""Manifests to files: one object per file, numbered in apply order, written all-or-nothing.

One file per object (``03-deployment-tier-fp16.yaml``) keeps a re-render's diff readable and
``kubectl apply -f DIR`` applies them in file-name order, the Namespace first. The folder is
built beside the output and renamed into place: a failure leaves the old folder as it was and
no half-written one. A folder is replaced only when it holds nothing but such files.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from model_optimizer.kubernetes.objects import Manifest

HEADER = (
    "# Rendered by `model-optimizer deploy kubernetes` from the deployment spec "
    "(docs/kubernetes.md).\n# Do not edit: change the spec or the options and render again.\n"
)
SECRET_EXAMPLE = "keys.secret.yaml.example"  # not .yaml: `kubectl apply -f DIR` skips it
_OURS = re.compile(r"\d{2}-[a-z]+-[a-z0-9.-]+\.yaml|" + re.escape(SECRET_EXAMPLE))


class OutputError(Exception):
    """The output folder cannot be (re)written; ``str()`` is one line."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the policy, the guard's source) as literal blocks; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def file_name(index: int, obj: Manifest) -> str:
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def rendered_files(objects: list[Manifest], secret_example: str) -> dict[str, str]:
    """File name → text, for every object and the Secret's example."""
    files = {file_name(i, obj): HEADER + to_yaml(obj) for i, obj in enumerate(objects)}
    files[SECRET_EXAMPLE] = secret_example
    return files


def secret_example(namespace: str, name: str) -> str:
    """What the Secret the pods read looks like; the values are placeholders to replace."""
    return (
        "# The Secret the manifests read (they never hold a key). Create it yourself, e.g.\n"
        f"#   kubectl -n {namespace} create secret generic {name} \\\n"
        '#     --from-literal=api-keys="$(openssl rand -hex 24)" \\\n'
        '#     --from-literal=tier-key="$(openssl rand -hex 32)" \\\n'
        '#     --from-literal=admin-keys="$(openssl rand -hex 24)"   # optional: /admin\n'
        "# or fill in this file, rename it to .yaml and apply it. Not applied as it is.\n"
        + to_yaml(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": "Opaque",
                "stringData": {
                    "api-keys": "REPLACE-ME-client-key-1,REPLACE-ME-client-key-2",
                    "tier-key": "REPLACE-ME-gateway-to-tier-key",
                    "admin-keys": "REPLACE-ME-admin-key",
                },
            }
        )
    )


def write_all(files: dict[str, str], output: Path) -> None:
    """Write ``files`` as the whole content of ``output``, all or nothing."""
    output = output.absolute()
    if output.exists():
        if not output.is_dir():
            raise OutputError(f"{output} exists and is not a folder")
        strangers = sorted(p.name for p in output.iterdir() if not _OURS.fullmatch(p.name))
        if strangers:
            raise OutputError(
                f"{output} holds files this command did not write ({', '.join(strangers[:3])}); "
                "give an empty or new folder"
            )
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        staging.chmod(0o755)
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            os.replace(output, old / output.name)
            try:
                os.replace(staging, output)
            except OSError:
                os.replace(old / output.name, output)  # the old folder back as it was
                raise
            shutil.rmtree(old)
        else:
            os.replace(staging, output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
