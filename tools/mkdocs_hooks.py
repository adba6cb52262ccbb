"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks:``).

* The home page is ``README.md``, so the front door and the site's first page never differ.
* The pages keep links that work on GitHub: ``../benchmarks/results/x.json`` from a page in
  ``docs/`` points to a file of the repository outside ``docs/``. Such a file is copied into
  the site under ``_repo/`` and the link rewritten to it; a link to a file that does not exist
  is a warning, so ``mkdocs build --strict`` fails on it.
* ``<!-- api-modules: partialfc.PKG -->`` expands into one mkdocstrings block per public module
  of ``PKG`` (``<!-- api-modules: partialfc -->``: the modules directly in ``partialfc/``); a
  package of ``partialfc/`` without an API page, or a page for a package that is gone, is a
  warning (a failure under ``--strict``).
* ``<!-- cli-help -->`` expands into the help screens of every ``partialfc`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.partialfc")

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "partialfc"
OUTSIDE = "_repo"  # where files of the repository outside docs/ land in the site
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
API_MODULES = re.compile(r"<!-- api-modules: (partialfc(?:\.[a-z_]+)?) -->")
FENCE = re.compile(r"^(```|~~~)")

# page (docs-relative) -> the file it is made from, for pages not stored under docs/
_ORIGIN: dict[str, Path] = {}


def _docs_dir(config) -> Path:
    return Path(config["docs_dir"]).resolve()


def _origin(src_uri: str, config) -> Path:
    return _ORIGIN.get(src_uri, _docs_dir(config) / src_uri)


def _links(markdown: str):
    """``(match)`` of every inline link outside fenced code blocks."""
    fenced = False
    offset = 0
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            for match in LINK.finditer(line):
                yield offset, match
        offset += len(line)


def _outside_target(target: str, origin: Path, docs: Path) -> Path | None:
    """The repository file a relative link points to, when it lies outside ``docs/``."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
        return None
    path = (origin.parent / target.split("#", 1)[0]).resolve()
    if path == docs or docs in path.parents:
        return None
    return path


def on_files(files: Files, config) -> Files:
    docs = _docs_dir(config)
    readme = REPO / "README.md"
    if files.get_file_from_path("index.md") is None:
        files.append(File.generated(config, "index.md", abs_src_path=str(readme)))
        _ORIGIN["index.md"] = readme
    _check_api_pages(docs)
    added: set[str] = set()
    queue = [file.src_uri for file in files if file.src_uri.endswith(".md")]
    while queue:
        src_uri = queue.pop()
        origin = _origin(src_uri, config)
        for _, match in _links(origin.read_text(encoding="utf-8")):
            path = _outside_target(match.group(2), origin, docs)
            if path is None:
                continue
            if not path.is_file() or REPO not in path.parents:
                log.warning(f"{src_uri}: link to {match.group(2)}: no such file")
                continue
            uri = f"{OUTSIDE}/{path.relative_to(REPO).as_posix()}"
            if uri not in added:
                files.append(File.generated(config, uri, abs_src_path=str(path)))
                added.add(uri)
                if uri.endswith(".md"):  # a README elsewhere becomes a page: follow its links
                    _ORIGIN[uri] = path
                    queue.append(uri)
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = _docs_dir(config)
    origin = _origin(page.file.src_uri, config)
    page_dir = posixpath.dirname(page.file.src_uri)

    def fix(target: str) -> str:
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return target
        path_part, _, anchor = target.partition("#")
        path = (origin.parent / path_part).resolve()
        if path == docs or docs in path.parents:
            new = posixpath.relpath(path.relative_to(docs).as_posix(), page_dir or ".")
        elif path.is_file() and REPO in path.parents:
            copied = f"{OUTSIDE}/{path.relative_to(REPO).as_posix()}"
            new = posixpath.relpath(copied, page_dir or ".")
        else:
            return target
        return new + (f"#{anchor}" if anchor else "")

    out, last = [], 0
    for offset, match in _links(markdown):
        start, end = offset + match.start(2), offset + match.end(2)
        out += [markdown[last:start], fix(match.group(2))]
        last = end
    markdown = "".join(out) + markdown[last:]
    markdown = API_MODULES.sub(lambda m: _api_blocks(m.group(1)), markdown)
    return markdown.replace("<!-- cli-help -->", _cli_help())


def _public_modules(package: str) -> list[str]:
    """Every public module of ``package``, subpackages included; for ``partialfc`` itself only
    the modules directly in it (each package has a page of its own)."""
    root = PACKAGE.parent / package.replace(".", "/")
    names = []
    paths = root.glob("*.py") if package == "partialfc" else root.rglob("*.py")
    for path in sorted(paths):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if ".".join(parts) == package or any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(parts))
    return names


def _api_blocks(package: str) -> str:
    return "\n".join(f"::: {name}\n" for name in _public_modules(package))


def _check_api_pages(docs: Path) -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} | {"partialfc"}
    pages = {}
    for page in (docs / "api").glob("*.md"):
        for match in API_MODULES.finditer(page.read_text(encoding="utf-8")):
            pages[match.group(1).partition(".")[2] or "partialfc"] = page.name
    for package in sorted(packages - set(pages)):
        name = "partialfc" if package == "partialfc" else f"partialfc.{package}"
        log.warning(
            f"{name} has no API page: add docs/api/{package}.md with "
            f"'<!-- api-modules: {name} -->' and list it in mkdocs.yml"
        )
    for package in sorted(set(pages) - packages):
        log.warning(f"docs/api/{pages[package]}: partialfc.{package} does not exist")


def _cli_help() -> str:
    from partialfc.cli import COMMANDS, build_parser, command_parser

    def screen(parser) -> str:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            parser.print_help()
        return out.getvalue()

    parts = ["```text", screen(build_parser()).rstrip(), "```", ""]
    for name in COMMANDS:
        parser = command_parser(name)
        parts += [f"## partialfc {name}", "", "```text", screen(parser).rstrip(), "```", ""]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    parts += [f"### partialfc {name} {sub_name}", "", "```text"]
                    parts += [screen(sub).rstrip(), "```", ""]
    return "\n".join(parts)
