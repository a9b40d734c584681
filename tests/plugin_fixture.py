"""A throwaway plugin distribution on sys.path: a ``*.dist-info`` folder with entry points, the
way pip installs one, so the registry is tested through ``importlib.metadata`` itself."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

PLUGIN_SOURCE = '''
from typing import Literal

import numpy as np
from pydantic import Field

import fedbandit
from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams
from fedbandit.instances import SyntheticParams, synthetic


class ScaledParams(LocalUCBParams):
    """Local UCB under another name (a plugin that reuses a built-in client)."""


SOLO = fedbandit.AlgorithmSpec(
    name="solo_ucb",
    description="Local UCB, registered by a test plugin",
    params=ScaledParams,
    make_server=lambda spec, params: fedbandit.NoCommunicationServer(spec),
    make_client=lambda spec, params, env: LocalUCBClient(spec, params, env),
)


class RingParams(SyntheticParams):
    kind: Literal["ring"] = "ring"  # type: ignore[assignment]
    spread: float = Field(1.0, gt=0, description="unused; shows a plugin's own key")


def ring(params):
    data = params.model_dump(exclude={"kind", "spread"})
    return synthetic(SyntheticParams(**data))


RING = fedbandit.InstanceKindSpec("ring", RingParams, ring, "A synthetic instance (test plugin)")
NOT_A_SPEC = 42
'''


def install_fake_plugin(root: Path, entry_points: str) -> Path:
    """Write module ``fb_test_plugin`` and its distribution's metadata under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "fb_test_plugin.py").write_text(PLUGIN_SOURCE)
    info = root / "fb_test_plugin-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fb-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


GOOD = """
[fedbandit.algorithms]
solo_ucb = fb_test_plugin:SOLO

[fedbandit.instances]
ring = fb_test_plugin:RING
"""

BROKEN = """
[fedbandit.algorithms]
solo_ucb = fb_test_plugin:SOLO
missing = fb_test_plugin:NOWHERE
wrong_type = fb_test_plugin:NOT_A_SPEC
fedpe = fb_test_plugin:SOLO
"""
