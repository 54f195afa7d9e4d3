"""mkdocs hooks: links from a docs page to a repository file outside docs/.

The pages link to the code they describe (``../src/effectflow/runtime/``, ``../../tests/...``), which
reads well where the repository is browsed but is not part of the site. Such a link is checked
here: a target that does not exist in the repository is a warning (so ``mkdocs build --strict``
fails, as for a broken link between pages); one that exists becomes a link to it under
``repo_url`` when mkdocs.yml sets one, and its text alone otherwise.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repository_links")

#: A Markdown inline link (not an image): its text and its target.
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
#: A fenced code block, left as it is (a link-looking line in an example is not a link).
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)


def _rewrite(
    markdown: str, page_path: Path, docs: Path, root: Path, repo_url: str, uri: str
) -> str:
    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("#", "mailto:", "/")):
            return match[0]
        path = target.partition("#")[0]
        resolved = (page_path.parent / path).resolve()
        inside_docs = resolved == docs or docs in resolved.parents
        if inside_docs and not resolved.is_dir():
            return match[0]  # a page or a file of the site: mkdocs checks it
        if root != resolved and root not in resolved.parents:
            log.warning("%s: the link %r leaves the repository", uri, target)
            return match["text"]  # reported once, here
        if not resolved.exists():
            log.warning("%s: the link %r names no file of the repository", uri, target)
            return match["text"]
        if not repo_url:
            return match["text"]
        kind = "tree" if resolved.is_dir() else "blob"
        return f"[{match['text']}]({repo_url.rstrip('/')}/{kind}/main/{resolved.relative_to(root)})"

    out: list[str] = []
    last = 0
    for fence in _FENCE.finditer(markdown):
        out.append(_LINK.sub(replace, markdown[last : fence.start()]))
        out.append(fence[0])
        last = fence.end()
    out.append(_LINK.sub(replace, markdown[last:]))
    return "".join(out)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """Check and rewrite the page's links that leave docs/ (mkdocs calls it for every page)."""
    docs = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).parent.resolve()
    return _rewrite(
        markdown,
        Path(page.file.abs_src_path),
        docs,
        root,
        config.get("repo_url") or "",
        page.file.src_uri,
    )
