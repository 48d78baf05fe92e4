"""The core: the node, sessions, the log writer thread, and replay planning. Knows no wire format."""

from __future__ import annotations

from hubbub.disconnect import Disconnect

from .consumers import Batch, ConsumerService, GroupMember, Opener
from .node import Node, NodeSettings, Subscription
from .presence import LocalPresence, Member, Presence
from .replay import Gap, ReplayPlan, ReplaySpec
from .session import Encoder, Overflow, Session, new_session_id
from .supervisor import Policy, Supervision, Supervisor

__all__ = [
    "Batch",
    "ConsumerService",
    "Disconnect",
    "Encoder",
    "Gap",
    "GroupMember",
    "LocalPresence",
    "Member",
    "Node",
    "NodeSettings",
    "Opener",
    "Overflow",
    "Policy",
    "Presence",
    "ReplayPlan",
    "ReplaySpec",
    "Session",
    "Subscription",
    "Supervision",
    "Supervisor",
    "new_session_id",
]
