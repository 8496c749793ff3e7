"""The HTML page: one file with the data, the layout library, the style and the code inline,
so it opens from file:// with no server and no network (docs/architecture.md: the visualiser is offline).

The static parts live in ggmlpy/viz/static (installed with the package): page.html with
placeholders, viz.css, viz.js, and dagre.min.js (@dagrejs/dagre, MIT, licence beside it).
The data goes into a <script type="application/json"> element; "</" is written as "<\\/"
(the same string to JSON) so no tensor name can end the element early.
"""
from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from ggmlpy.viz.data import page_data
from ggmlpy.viz.snapshot import Snapshot

STATIC = "static"


def static_text(name: str) -> str:
    """A file of ggmlpy/viz/static, as installed."""
    return resources.files("ggmlpy.viz").joinpath(STATIC, name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    return text.replace("</", "<\\/")


def _vendored_js(name: str) -> str:
    """A vendored script without its source-map comment (the map is not shipped)."""
    return "\n".join(line for line in static_text(name).splitlines()
                     if not line.startswith("//# sourceMappingURL="))


def render_page(data: dict[str, Any]) -> str:
    """The page for page_data's output."""
    payload = _script_safe(json.dumps(data, separators=(",", ":"), allow_nan=False))
    parts = {
        "@TITLE@": html.escape(f"ggmlpy viz: {data['meta']['title']}"),
        "/*@CSS@*/": static_text("viz.css"),
        "/*@DAGRE@*/": _script_safe(_vendored_js("dagre.min.js")),
        "/*@APP@*/": _script_safe(static_text("viz.js")),
        "@DATA@": payload,
    }
    page = static_text("page.html")
    for marker, text in parts.items():   # one marker each; the data goes last, as it is largest
        head, sep, tail = page.partition(marker)
        if not sep:
            raise ValueError(f"page.html lacks the marker {marker}")
        page = head + text + tail
    return page


def write_page(snap: Snapshot, path: str) -> int:
    """Write the page for snap to path; returns its size in bytes."""
    text = render_page(page_data(snap))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text.encode())
