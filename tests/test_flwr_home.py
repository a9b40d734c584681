"""No ``flwr`` command of fedbandit runs without fedbandit's ``FLWR_HOME``: ``flwr`` with the
default home (``~/.flwr``) and no SuperLink configured starts a local SuperLink of its own that
outlives the command. Every ``flwr`` process is started with an environment made by
``flower_environment`` (``FLWR_HOME`` in a folder of ours, with the connection written there)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from fedbandit.flower.processes import CONNECTION
from fedbandit.flower.submission import Submission

PACKAGE = Path(__file__).resolve().parents[1] / "fedbandit"
#: Calls that make fedbandit's environment for Flower processes.
ENVIRONMENT_MAKERS = {"environment", "flower_environment"}
SUBPROCESS_STARTERS = {"run", "Popen", "call", "check_call", "check_output"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]


def _starts_flwr(call: ast.Call) -> bool:
    """``subprocess.run/Popen/...(["flwr", ...], ...)``."""
    first = call.args[0] if call.args else None
    return (
        _name(call.func) in SUBPROCESS_STARTERS
        and isinstance(first, ast.List)
        and bool(first.elts)
        and isinstance(first.elts[0], ast.Constant)
        and first.elts[0].value == "flwr"
    )


def _env_argument(call: ast.Call, env_index: dict[str, int] | None = None) -> ast.expr | None:
    """The environment a call passes: its ``env=``, else the argument at the called function's
    ``env`` parameter (``env_index``: function name -> position, ``self`` left out), else its
    first argument."""
    keyword = next((k.value for k in call.keywords if k.arg == "env"), None)
    if keyword is not None or _starts_flwr(call):
        return keyword
    index = (env_index or {}).get(_name(call.func), 0)
    return call.args[index] if len(call.args) > index else None


def flwr_calls_without_our_home(sources: dict[str, str]) -> list[str]:
    """The calls in ``sources`` (file name -> text) that start ``flwr`` with another environment
    than fedbandit's. A call starts ``flwr`` when it is ``subprocess.*(["flwr", ...])`` or calls a
    function that passes its ``env`` parameter on to one (``Submission.flwr``, ``status``, ...,
    found across all sources); the environment it passes must be made by
    ``ENVIRONMENT_MAKERS`` (a call or a name assigned from one in the same function), or be the
    ``env`` parameter of such a passing function (whose callers are checked in turn)."""
    trees = {where: ast.parse(source) for where, source in sources.items()}
    functions = [f for tree in trees.values() for f in _functions(tree)]
    env_index = {
        f.name: [a.arg for a in f.args.args if a.arg != "self"].index("env")
        for f in functions
        if "env" in {a.arg for a in f.args.args}
    }

    def passes_env_on(function: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> bool:
        if "env" not in {arg.arg for arg in function.args.args}:
            return False
        return any(
            isinstance(call, ast.Call)
            and (_starts_flwr(call) or _name(call.func) in names)
            and isinstance(env := _env_argument(call, env_index), ast.Name)
            and env.id == "env"
            for call in ast.walk(function)
        )

    forwarding: set[str] = set()
    while grown := {f.name for f in functions if passes_env_on(f, forwarding)} - forwarding:
        forwarding |= grown
    wrong = []
    for where, tree in trees.items():
        for function in _functions(tree):
            made = {
                target.id
                for node in ast.walk(function)
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and _name(node.value.func) in ENVIRONMENT_MAKERS
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            if function.name in forwarding:
                made.add("env")
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not (
                    _starts_flwr(call) or _name(call.func) in forwarding
                ):
                    continue
                env = _env_argument(call, env_index)
                ours = (isinstance(env, ast.Call) and _name(env.func) in ENVIRONMENT_MAKERS) or (
                    isinstance(env, ast.Name) and env.id in made
                )
                if not ours:
                    wrong.append(f"{where}:{call.lineno}")
    return sorted(wrong)


def test_every_flwr_command_runs_with_fedbandits_home():
    sources = {
        str(path.relative_to(PACKAGE.parent)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    starts = sum(source.count('["flwr"') for source in sources.values())
    assert starts >= 2, "the check found no flwr command: did the code move?"
    wrong = flwr_calls_without_our_home(sources)
    assert not wrong, f"flwr started without fedbandit's FLWR_HOME at {wrong}"


def test_the_check_finds_a_flwr_command_with_the_default_home():
    source = (
        "import os, subprocess\n"
        "def flwr(env, *args):\n"
        "    return subprocess.run(['flwr', *args], env=env)\n"
        "def status(env, run):\n"
        "    return flwr(env, 'ls', run)\n"
        "def caller(submission):\n"
        "    env = submission.environment()\n"
        "    status(env, 1)\n"
        "    status(dict(os.environ), 1)\n"
        "    subprocess.run(['flwr', 'ls'], env=flower_environment(submission.state_dir))\n"
        "    subprocess.run(['flwr', 'ls'])\n"
        "    subprocess.Popen(['flwr', 'log'], env=os.environ)\n"
        "    flwr(os.environ, 'stop')\n"
    )
    wrong = flwr_calls_without_our_home({"x.py": source})
    assert wrong == ["x.py:11", "x.py:12", "x.py:13", "x.py:9"]


def test_the_environment_of_flwr_names_our_home_and_connection(tmp_path):
    env = Submission("127.0.0.1:9300", tmp_path / "cli", insecure=True).environment()
    home = Path(env["FLWR_HOME"])
    assert home == (tmp_path / "cli").resolve() / "flwr-home"
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["superlink"]["default"] == CONNECTION
    assert config["superlink"][CONNECTION] == {"address": "127.0.0.1:9300", "insecure": True}
