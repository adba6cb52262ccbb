"""The front door: README.md stays short, keeps the two set-up commands, and every file it links
to exists (the documentation site checks its own pages with ``mkdocs build --strict``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    "pip install -e . && partialfc train --config configs/omniglot_cpu.yaml",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    "pip install -e '.[test]' && python -m pytest -q",
]


def _local_links(text: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"^[a-z]+:|^#", t)]


def test_the_readme_is_short_and_keeps_the_two_setup_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for command in SETUP:
        assert f"```bash\n{command}\n```" in text


def test_every_file_the_readme_links_to_exists():
    links = _local_links((REPO / "README.md").read_text())
    assert len(links) > 20
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_a_missing_target_is_seen():
    assert _local_links("[a](docs/x.md#h) [b](https://e.org) [c](#top)") == ["docs/x.md"]
