"""Convert every config InsightFace's ``arcface_torch`` ships and count what happens to each key.

The configs are read from a local copy of ``deepinsight/insightface`` given by ``--insightface``
(``recognition/arcface_torch/configs/*.py``, ``base.py`` and ``__init__.py`` excluded), each
with ``partialfc.tools.arcface_torch.config.convert_config`` (read without running it, its base
followed), written to a temporary folder and loaded again with the training config's loader.
Per config: converted or refused (with the error), the keys mapped (to which partialfc keys),
dropped (with the reason) and the keys with no explanation (mapped or dropped without a note is
not counted as unexplained when the meaning is the same; a dropped key always has a reason).

    python benchmarks/arcface_torch_configs.py --insightface /path/to/insightface \\
        --out benchmarks/results/arcface_torch_configs.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from partialfc.tools.arcface_torch.config import (
    ArcfaceConfigError,
    convert_config,
    write_converted,
)
from partialfc.train.config import load_config


def configs_folder(root: Path) -> Path:
    for candidate in (root / "recognition" / "arcface_torch" / "configs", root / "configs", root):
        if (candidate / "base.py").is_file():
            return candidate
    raise SystemExit(f"{root}: no recognition/arcface_torch/configs/base.py under it")


def insightface_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def measure(path: Path, scratch: Path) -> dict:
    entry: dict = {"config": path.name}
    try:
        converted = convert_config(path)
        output = write_converted(converted, scratch / f"{path.stem}.yaml")
        load_config(output)  # the written file loads with the real loader
    except (ArcfaceConfigError, ValueError) as err:
        entry.update(converted=False, error=str(err))
        return entry
    entry.update(
        converted=True,
        model=converted.data["model"]["name"],
        mapped={o.key: list(o.targets) for o in converted.mapped},
        dropped={o.key: o.note for o in converted.dropped},
        unexplained=[o.key for o in converted.dropped if not o.note],
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--insightface", required=True, help="a checkout of insightface")
    parser.add_argument(
        "--out",
        default="benchmarks/results/arcface_torch_configs.json",
        help="JSON result",
    )
    args = parser.parse_args(argv)
    root = Path(args.insightface)
    folder = configs_folder(root)
    paths = sorted(p for p in folder.glob("*.py") if p.name not in ("base.py", "__init__.py"))
    with tempfile.TemporaryDirectory() as scratch:
        results = [measure(p, Path(scratch)) for p in paths]
    converted = [r for r in results if r["converted"]]
    keys_dropped: dict[str, str] = {}
    for r in converted:
        keys_dropped.update(r["dropped"])
    totals = {
        "configs": len(results),
        "converted": len(converted),
        "refused": len(results) - len(converted),
        "keys_mapped": sum(len(r["mapped"]) for r in converted),
        "keys_dropped": sum(len(r["dropped"]) for r in converted),
        "keys_unexplained": sum(len(r["unexplained"]) for r in converted),
        "distinct_keys_mapped": sorted({k for r in converted for k in r["mapped"]}),
        "distinct_keys_dropped": dict(sorted(keys_dropped.items())),
    }
    report = {
        "insightface": {"configs": str(folder), "commit": insightface_commit(root)},
        "totals": totals,
        "configs": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{totals['converted']}/{totals['configs']} configs converted, "
        f"{totals['keys_mapped']} keys mapped, {totals['keys_dropped']} dropped with a reason, "
        f"{totals['keys_unexplained']} unexplained; refused: "
        + (", ".join(r["config"] for r in results if not r["converted"]) or "none")
    )
    print(f"wrote {out}")
    return 0 if totals["refused"] == 0 and totals["keys_unexplained"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
