"""A short crash campaign in CI (``tools/crash_campaign.py``): real ``hubbub serve`` processes killed with
SIGKILL while they acknowledge publishes from several connections over several channels, restarted, and
checked against each durability mode's promise (protocols README §5):

* ``fsync`` and ``commit``: every acknowledged event is there with its payload, seqs gapless, no epoch change;
* ``none``: nothing silent: a channel either kept everything acknowledged, or is in a new epoch that a client
  naming the old one is told about (409).

The long campaign (100 cycles of fsync) and its result are in docs/operations.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def campaign_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_campaign", ROOT / "tools" / "crash_campaign.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("crash_campaign", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize(("durability", "cycles"), [("fsync", 3), ("commit", 2), ("none", 2)])
def test_short_campaign(durability: str, cycles: int, tmp_path: Path) -> None:
    cc = campaign_module()
    summary = cc.run(cycles, durability, tmp_path / "data", kill_after=(0.2, 0.8), seed=14)
    assert summary["ok"], summary["failures"]
    assert summary["cycles"] == cycles
    # The kills came while publishes were being acknowledged, and everything acknowledged was checked.
    assert summary["acked"] > 0
    if durability != "none":
        assert summary["verified"] == summary["acked"] and summary["new_epochs"] == 0
    else:
        # After each kill every channel starts a new epoch (README §5): each one must have been reported.
        assert summary["new_epochs"] > 0
