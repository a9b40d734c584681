"""What there is to run: ``list`` (the named experiments, or the registered algorithms and
instance kinds), ``cite`` (the BibTeX of fedbandit and of algorithms' papers) and ``prepare`` (a
downloaded data set into the files its experiments read)."""

from __future__ import annotations

import argparse
import json
import types
import typing

from pydantic.fields import FieldInfo

from fedbandit.algorithms.base import AlgorithmSpec
from fedbandit.algorithms.citations import short_reference
from fedbandit.cli.options import add_experiments_option
from fedbandit.config import available_experiments, experiment_folders
from fedbandit.datasets import movielens20m
from fedbandit.registry import algorithms, instance_kinds
from fedbandit.results.provenance import citations_bib


def _cmd_list(args: argparse.Namespace) -> int:
    if args.algorithms or args.instances:
        return _list_registered(args.algorithms, args.instances)
    import tomllib

    experiments = available_experiments()
    folders = experiment_folders()
    if not experiments:
        print(f"no experiments found in {', '.join(str(folder) for folder in folders)}")
        return 1
    width = max(len(name) for name in experiments)
    own = len(folders) > 1
    for name, path in experiments.items():
        try:
            description = str(tomllib.loads(path.read_text()).get("description", ""))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            description = f"(unreadable: {err})"
        where = f"  [{path.parent}]" if own and path.parent != folders[-1] else ""
        print(f"{name:<{width}}  {description}{where}")
    if own:
        print(f"(experiments shipped with fedbandit are in {folders[-1]})")
    return 0


def _list_registered(show_algorithms: bool, show_instances: bool) -> int:
    """Registered algorithms and instance kinds (built in and plugins), with hyperparameters."""
    for show, registry, what in (
        (show_algorithms, algorithms(), "algorithms"),
        (show_instances, instance_kinds(), "instance kinds"),
    ):
        if not show:
            continue
        print(f"{what}:")
        for name in registry:
            entry = registry.entries[name]
            origin = registry.origins[name]
            where = "" if origin == "fedbandit" else f"  [plugin: {origin}]"
            print(f"  {name}  {entry.description}{where}")
            if isinstance(entry, AlgorithmSpec):
                reference = short_reference(entry.citation) or "none (no paper of its own)"
                print(f"      reference: {reference}")
            for key, field in entry.params.model_fields.items():
                if key != "kind":
                    print(_field_line(key, field))
        for name, error in sorted(registry.broken.items()):
            print(f"  {name}  [plugin failed to load: {error}]")
    if show_instances:
        print(
            "data cards of the real-data kinds: `fedbandit docs datasets`, "
            "`fedbandit docs movielens20m` (replay) and `fedbandit docs mslr_web10k` (mslr)"
        )
    return 0


def _cmd_cite(args: argparse.Namespace) -> int:
    """BibTeX: fedbandit's own entry and the papers of the algorithms named (default: all)."""
    names = args.algorithms or list(algorithms())
    print(citations_bib(names), end="")
    return 0


def _type_name(annotation: object) -> str:
    """A field's type as ``list --algorithms`` shows it: the allowed values of a ``Literal``
    (``"ball" | "simplex"``), a union member by member (``float or None``), an ``Annotated`` type
    as its base, a generic with its arguments (``list[int]``)."""
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(_value(value) for value in arguments)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_name(member) for member in arguments)
    if origin is typing.Annotated:
        return _type_name(arguments[0])
    if annotation is type(None) or annotation is None:
        return "None"
    if origin is not None and arguments:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(argument) for argument in arguments)}]"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _value(value: object) -> str:
    """A value as written in an experiment file: strings in double quotes, ``None`` as is."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _field_line(key: str, field: FieldInfo) -> str:
    """One hyperparameter of ``list --algorithms``: name, allowed values, default, meaning."""
    if field.is_required():
        default = "required"
    else:
        default = f"default {_value(field.get_default(call_default_factory=True))}"
    about = f": {field.description}" if field.description else ""
    return f"      {key} ({_type_name(field.annotation)}, {default}){about}"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``list`` and ``prepare``."""
    listing = sub.add_parser(
        "list", help="list the named experiments (or the registered algorithms/instance kinds)"
    )
    listing.add_argument(
        "--algorithms", action="store_true", help="registered algorithms and hyperparameters"
    )
    listing.add_argument(
        "--instances", action="store_true", help="registered instance kinds and parameters"
    )
    add_experiments_option(listing)
    listing.set_defaults(func=_cmd_list)

    cite = sub.add_parser(
        "cite",
        help="print BibTeX: fedbandit and the papers of algorithms (default: every algorithm)",
        description="BibTeX to cite: fedbandit's own entry, then each paper once, naming the "
        "algorithms that cite it (plugins included). Every results folder holds the same for "
        "the algorithms that ran, in CITATIONS.bib.",
    )
    cite.add_argument("algorithms", nargs="*", metavar="ALGORITHM", help="registered algorithms")
    cite.set_defaults(func=_cmd_cite)

    prepare = sub.add_parser(
        "prepare", help="turn a downloaded data set into the files its experiments read"
    )
    data_sets = prepare.add_subparsers(dest="dataset", required=True)
    movielens = data_sets.add_parser(
        "movielens20m",
        parents=[movielens20m.parser(add_help=False)],
        help="MovieLens-20M as Li & Wang's scripts make it (fed_contextual_movielens20m)",
        description=movielens20m.DESCRIPTION,
    )
    movielens.set_defaults(func=movielens20m.run)
