"""The core: the node, sessions, the log writer thread, and replay planning. Knows no wire format."""

from __future__ import annotations

from hubbub.disconnect import Disconnect

from .node import Node, NodeSettings, Subscription
from .replay import Gap, ReplayPlan, ReplaySpec
from .session import Encoder, Overflow, Session, new_session_id

__all__ = [
    "Disconnect",
    "Encoder",
    "Gap",
    "Node",
    "NodeSettings",
    "Overflow",
    "ReplayPlan",
    "ReplaySpec",
    "Session",
    "Subscription",
    "new_session_id",
]
