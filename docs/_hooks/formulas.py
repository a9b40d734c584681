"""MkDocs hook: formulas rendered to MathML when the site is built, so they read offline.

``pymdownx.arithmatex`` (generic mode) marks ``$...$`` and ``$$...$$`` in the pages as
``<span class="arithmatex">\\(...\\)</span>`` and ``<div class="arithmatex">\\[...\\]</div>``;
this hook replaces each mark by the MathML that ``latex2mathml`` makes of it. Browsers draw
MathML themselves (MathML Core), so the site needs no script, font or CDN to show a formula.
"""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

INLINE = re.compile(r'<span class="arithmatex">\\\((?P<tex>.*?)\\\)</span>', re.S)
BLOCK = re.compile(r'<div class="arithmatex">\\\[(?P<tex>.*?)\\\]</div>', re.S)


def to_mathml(tex: str, display: str, page: str) -> str:
    """One formula as MathML; a formula latex2mathml cannot read fails the build, naming it."""
    try:
        return convert(html.unescape(tex).strip(), display=display)
    except Exception as err:  # latex2mathml raises its own and plain exceptions
        raise PluginError(f"{page}: cannot render the formula {tex!r}: {err}") from None


def on_page_content(html_text: str, page: Any, **_: Any) -> str:
    name = page.file.src_uri
    html_text = BLOCK.sub(
        lambda m: f'<div class="arithmatex">{to_mathml(m["tex"], "block", name)}</div>', html_text
    )
    return INLINE.sub(
        lambda m: f'<span class="arithmatex">{to_mathml(m["tex"], "inline", name)}</span>',
        html_text,
    )
