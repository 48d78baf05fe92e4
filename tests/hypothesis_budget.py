"""The suite's hypothesis profiles and the example budget of each property test.

A property test writes its budget as ``settings(max_examples=examples(300))``: ``300`` is its weight against
hypothesis's default of 100 (a test whose examples are dear asks for fewer, a cheap one for more), and the
profile scales every weight alike:

=========  ======  ==================================================================================
profile    scale   use
=========  ======  ==================================================================================
``ci``     1       the default: the README's test command and CI, each test's written budget
``deep``   4       ``HYPOTHESIS_PROFILE=deep`` (or ``--hypothesis-profile deep``), before a release or
                   after touching a codec, the router or a log engine: four times the ``ci`` search
=========  ======  ==================================================================================

Both profiles drop hypothesis's per-example deadline: on a loaded machine it fails tests for the machine's
speed, not for the code's. The state machines' ``stateful_step_count`` is not scaled: a shorter run of a
machine cannot reach the states a long one does, so the profile only changes how many runs there are.
"""

from __future__ import annotations

import os

from hypothesis import settings

__all__ = ["DEFAULT_PROFILE", "PROFILES", "examples", "load"]

#: hypothesis's own default ``max_examples``, which a weight is measured against.
BASE = 100
#: Profile name -> scale of every test's weight.
PROFILES = {"ci": 1.0, "deep": 4.0}
DEFAULT_PROFILE = "ci"
#: Fewer examples than this do not get a strategy past its simplest values.
FLOOR = 10


def load() -> None:
    """Register the profiles and load ``HYPOTHESIS_PROFILE`` (``ci`` when unset). Called by tests/conftest.py
    before any test module is imported; ``--hypothesis-profile`` given to pytest loads its profile later,
    still before collection, and :func:`examples` follows whichever is loaded."""
    for name, scale in PROFILES.items():
        settings.register_profile(name, max_examples=max(FLOOR, round(BASE * scale)), deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", DEFAULT_PROFILE))


def examples(weight: int) -> int:
    """The ``max_examples`` of a test of ``weight`` (its budget in hypothesis's default of 100) under the
    loaded profile, never under :data:`FLOOR`."""
    loaded = settings.default
    assert loaded is not None, "load() loads a profile before any test module is imported"
    scale = loaded.max_examples / BASE
    return max(FLOOR, round(weight * scale))
