"""``Access.check_consumer``: the one rule for durable consumers every dialect goes through
(docs/consumers.md "Permissions"), over native patterns and qpubs topics alike."""

from __future__ import annotations

import pytest

from hubbub.auth import AllowAll, Grant, Identity, TokenAuthorizer
from hubbub.core.access import Access
from hubbub.errors import AuthError
from hubbub.log.consumers import ConsumerSpec, reach


def who(user: str, *reads: str, admin: bool = False) -> Identity:
    return Identity(user, Grant.parse([]), Grant.parse(reads), admin=admin, via="static")


OWNER, READER, ALL = who("owner", "/m/**"), who("reader", "/m/**"), who("all", "/**")
OUTSIDER, ADMIN = who("outsider", "/other/**"), who("admin", admin=True)
#: Two different tokens without a user (equal as identities: what tells them apart is the token alone).
NOBODY, NOBODY2 = who("", "/m/**"), who("", "/m/**", "/n/**")


def spec(pattern: str, syntax: str = "native", owner: str = "owner", separator: str = ".") -> ConsumerSpec:
    return ConsumerSpec("c", pattern, syntax=syntax, separator=separator, owner=owner)


def allowed(
    identity: Identity | None, s: ConsumerSpec, *, manage: bool = False, create: bool = False
) -> bool:
    access = Access(TokenAuthorizer())
    try:
        access.check_consumer(identity, s, "native", manage=manage, create=create)
    except AuthError as exc:
        assert exc.code == 4102
        assert access.refusals == {"forbidden": 1}
        return False
    assert access.refusals == {}
    return True


@pytest.mark.parametrize(
    ("s", "readers"),
    [
        (spec("/m/**"), {OWNER, READER, ALL, ADMIN}),
        (spec("/m/a"), {OWNER, READER, ALL, ADMIN}),
        (spec("/**"), {ALL, ADMIN}),
        # qpubs topics: their reach is what a live listen of them subscribes.
        (spec("m.*", "separated"), {OWNER, READER, ALL, ADMIN}),
        (spec("m.a.b", "separated"), {OWNER, READER, ALL, ADMIN}),
        (spec("m::*", "separated", separator="::"), {OWNER, READER, ALL, ADMIN}),
        (spec("*.x", "separated"), {ALL, ADMIN}),  # a tail topic may journal any channel
        (spec("other.*", "separated"), {OUTSIDER, ALL, ADMIN}),
        (spec("m*", "separated"), {OWNER, READER, ALL, OUTSIDER, ADMIN}),  # journals nothing
    ],
    ids=lambda v: v.pattern if isinstance(v, ConsumerSpec) else "",
)
def test_using_a_consumer_takes_read_over_all_it_journals(s: ConsumerSpec, readers: set[Identity]) -> None:
    for identity in (OWNER, READER, ALL, OUTSIDER, ADMIN):
        assert allowed(identity, s) is (identity in readers), identity.user
    assert not allowed(None, s)  # not authenticated


def test_managing_a_consumer_takes_ownership_too() -> None:
    assert allowed(OWNER, spec("/m/**"), manage=True)
    assert not allowed(READER, spec("/m/**"), manage=True)  # may use it, not delete it
    assert not allowed(OUTSIDER, spec("/m/**", owner="outsider"), manage=True)  # owns it, may not read it
    assert allowed(ADMIN, spec("/m/**"), manage=True)
    assert allowed(READER, spec("m.*", "separated", owner="reader"), manage=True)
    # No owner recorded (made with auth off, or by an admin without a user): admins only.
    assert not allowed(READER, spec("/m/**", owner=""), manage=True)
    assert not allowed(NOBODY, spec("/m/**", owner=""), manage=True)
    assert allowed(ADMIN, spec("/m/**", owner=""), manage=True)


def test_creating_a_consumer_takes_a_user_to_own_it() -> None:
    """Tokens without a user would all record the same (empty) owner, and so own each other's consumers:
    with auth on, such a token may use a consumer but not create one; an admin may."""
    assert allowed(READER, spec("/m/**", owner="reader"), create=True)
    assert not allowed(NOBODY, spec("/m/**", owner=""), create=True)
    assert not allowed(NOBODY2, spec("/m/**", owner=""), create=True)
    assert allowed(NOBODY, spec("/m/**"))  # using one it may read stays allowed
    assert allowed(who("", admin=True), spec("/m/**", owner=""), create=True)
    assert not allowed(READER, spec("/**", owner="reader"), create=True)  # and the reach still counts


def test_with_auth_off_everyone_may_do_everything() -> None:
    access = Access(AllowAll())
    access.check_consumer(None, spec("/**"), "native", manage=True)
    access.check_consumer(OUTSIDER, spec("*.x", "separated"), "qpubs", manage=True)


def test_reach() -> None:
    native = reach(spec("/m/*/x"))
    assert native is not None and native.text == "/m/*/x"
    texts = {
        "m.*": "/m/*/**",
        "a.%2F.b": "/a/%252F/b",
        "*.x": "/**",
        "m.*.x": "/m/%2A/x",  # a * inside a name is literal
        "": "/",
    }
    for topic, text in texts.items():
        got = reach(spec(topic, "separated"))
        assert got is not None and got.text == text, (topic, got)
    assert reach(spec("m*", "separated")) is None and reach(spec("*m", "separated")) is None
