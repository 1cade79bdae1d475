"""`detlab fingerprint | diff`: checkpoints' tensors fingerprinted and compared, no server needed."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from detlab.cli.root import app


def _checkpoint_fingerprints(path: Path, certificates: bool, version: str) -> dict[str, dict[str, Any]]:
    from detlab.tensors.checkpoint import CheckpointError, fingerprints

    try:
        return fingerprints(path, certificates=certificates, version=version)
    except CheckpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


class FpVersion(StrEnum):
    fp2 = "fp2"
    fp1 = "fp1"


@app.command()
def fingerprint(
    path: Annotated[Path, typer.Argument(help="a .safetensors file or a torch.save checkpoint")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
    certificate: Annotated[bool, typer.Option(help="add a sha256 of the same bytes (audits, exports)")] = False,
    fp_version: Annotated[FpVersion, typer.Option(help="fingerprint version: fp2 (current) or fp1, to check "
                                                       "digests recorded before fp2")] = FpVersion.fp2,
) -> None:
    """Print the fingerprint (fp2; fp1 on request) of every tensor in a checkpoint. Exit 2 when the file or a
    tensor cannot be read (sparse, quantized, nested or meta tensors are refused: the message names the tensor
    and what to do)."""
    found = _checkpoint_fingerprints(path, certificate, fp_version.value)
    if as_json:
        typer.echo(json.dumps(found))
        return
    for name, info in found.items():
        sha = f"  sha256:{info['sha256']}" if certificate else ""
        typer.echo(f"{info['digest']}  {name}  {info['dtype']}{info['shape']}{sha}")


@app.command()
def diff(
    a: Annotated[Path, typer.Argument(help="checkpoint A")],
    b: Annotated[Path, typer.Argument(help="checkpoint B")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object: mode, differ, only_a, only_b")] = False,
    strict: Annotated[bool, typer.Option(help="compare sha256 of each tensor's bytes, not keyed digests")] = False,
) -> None:
    """List tensors that differ between two checkpoints. Exit 0 when identical, 1 otherwise, 2 when a file or a
    tensor cannot be read (a CI gate). Tensors are compared by dtype, shape and digest: fp2 under a random key
    drawn for this run, so collisions prepared against fp2's public constants do not carry over, or with
    --strict sha256 (docs/fingerprint.md, "Threat model")."""
    from detlab.tensors.checkpoint import CheckpointError, diff_files

    try:
        result = diff_files(a, b, strict=strict)
    except CheckpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    found = [result["differ"], result["only_a"], result["only_b"]]
    if as_json:
        typer.echo(json.dumps(result))
    else:
        how = {"keyed": "fp2 under a random key drawn for this run", "strict": "sha256 of each tensor's bytes"}
        typer.echo(f"mode: {result['mode']} ({how[result['mode']]})")
        for label, names in zip(("differs", f"only in {a}", f"only in {b}"), found, strict=True):
            for name in names:
                typer.echo(f"{label}: {name}")
        counts = f"{len(result['differ'])} differ, {len(result['only_a'])} only in A, {len(result['only_b'])} only in B"
        typer.echo("identical" if not any(found) else counts)
    raise typer.Exit(1 if any(found) else 0)
