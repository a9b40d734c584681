"""MkDocs hook: one reference page per public object of fedbandit (``fedbandit.__all__``).

Each page ``reference/python/NAME.md`` is generated: mkdocstrings renders the object's formatted
signature, docstring, members and source (from the module that defines it), and a parameter
table is read from the live object (a pydantic model's fields, or the call signature). The
pages are added to the navigation under the Python API page, which must link every one of them:
an exported name missing there fails the build.
"""

from __future__ import annotations

import html
import inspect
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

import fedbandit

API_PAGE = "reference/api.md"
FOLDER = "reference/python"


def public_names() -> list[str]:
    return sorted((name for name in fedbandit.__all__ if name != "__version__"), key=str.lower)


def defining_module(name: str) -> str:
    return fedbandit._EXPORTS[name]


def cell(text: Any) -> str:
    """A table cell as inline HTML code: pipes of ``A | B`` types cannot split the row."""
    return f"<code>{html.escape(str(text)).replace('|', '&#124;')}</code>"


def plain(text: str) -> str:
    return " ".join(text.split()).replace("|", "&#124;")


def parameter_rows(obj: Any) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of a model's fields or a callable's parameters."""
    fields = getattr(obj, "model_fields", None)
    if isinstance(fields, dict):
        rows = []
        for field_name, field in fields.items():
            required = field.is_required()
            default = "required" if required else cell(field.get_default(call_default_factory=True))
            annotation = cell(getattr(field.annotation, "__name__", None) or field.annotation)
            rows.append((cell(field_name), annotation, default, plain(field.description or "")))
        return rows
    if not callable(obj):
        return []
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    rows = []
    for parameter in signature.parameters.values():
        if parameter.name == "self":
            continue
        shown = parameter.name
        if parameter.kind is parameter.VAR_POSITIONAL:
            shown = f"*{shown}"
        elif parameter.kind is parameter.VAR_KEYWORD:
            shown = f"**{shown}"
        annotation = "" if parameter.annotation is parameter.empty else cell(parameter.annotation)
        empty = parameter.default is parameter.empty
        default = (
            ""
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
            else ("required" if empty else cell(repr(parameter.default)))
        )
        keyword_only = " (keyword only)" if parameter.kind is parameter.KEYWORD_ONLY else ""
        rows.append((cell(shown), annotation, default, keyword_only.strip(" ()")))
    return rows


def kind_of(obj: Any) -> str:
    if hasattr(obj, "model_fields"):
        return "pydantic model"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return "constant"


def page_markdown(name: str) -> str:
    obj = getattr(fedbandit, name)
    module = defining_module(name)
    lines = [
        f"# fedbandit.{name}\n",
        f"A {kind_of(obj)}: `from fedbandit import {name}` (defined in `{module}`).\n",
    ]
    rows = parameter_rows(obj)
    if rows:
        title = "Fields" if hasattr(obj, "model_fields") else "Parameters"
        lines += [
            f"## {title}\n",
            "| name | type | default | notes |",
            "|---|---|---|---|",
            *(f"| {' | '.join(row)} |" for row in rows),
            "",
        ]
    if kind_of(obj) == "constant":
        lines.append(f"Value: `{obj!r}`.\n")
    lines += [
        "## Signature, documentation and source\n",
        f"::: {module}.{name}",
        "    options:",
        "      heading_level: 3",
        "      show_source: true",
        "      show_if_no_docstring: true",
        "",
    ]
    return "\n".join(lines)


def on_config(config: Any, **_: Any) -> Any:
    """Put the generated pages under the Python API entry of the navigation."""
    entries = [{name: f"{FOLDER}/{name}.md"} for name in public_names()]

    def replace(items: list[Any]) -> bool:
        for index, item in enumerate(items):
            if isinstance(item, dict):
                ((title, value),) = item.items()
                if value == API_PAGE:
                    items[index] = {title: [API_PAGE, *entries]}
                    return True
                if isinstance(value, list) and replace(value):
                    return True
        return False

    if not replace(config["nav"]):
        raise PluginError(f"the navigation has no entry for {API_PAGE}")
    return config


def on_files(files: Files, config: Any, **_: Any) -> Files:
    for name in public_names():
        files.append(File.generated(config, f"{FOLDER}/{name}.md", content=page_markdown(name)))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == API_PAGE:
        missing = [n for n in public_names() if f"(python/{n}.md)" not in markdown]
        if missing:
            raise PluginError(f"{API_PAGE} links no page for {', '.join(missing)}")
    return markdown
