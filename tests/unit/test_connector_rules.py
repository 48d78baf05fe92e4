"""The connectors' pure rules (docs/connectors.md): Retry-After, the backoff, how each provider reads its
answers, the webhook signature, and how guble's message bodies become FCM and APNs messages."""

from __future__ import annotations

import hashlib
import hmac

import orjson

from hubbub.transports.apns import apns_payload
from hubbub.transports.connector import Gone, Refused, Retry, RetryPolicy, Sent, parse_retry_after
from hubbub.transports.fcm import _v1_error_code, fcm_message
from hubbub.transports.webhook import classify, sign


def test_retry_after_seconds_and_http_dates() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 3 ") == 3.0
    now = 1_800_000_000.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0.0  # long past: at once
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0
    for bad in (None, "", "soon", "-5", "1.5"):
        assert parse_retry_after(bad) is None


def test_backoff_doubles_up_to_its_cap_and_retry_after_is_capped() -> None:
    p = RetryPolicy(base_s=0.1, max_s=1.0, retry_after_max_s=60.0)
    for attempt, base in ((0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (40, 1.0)):
        assert base <= p.delay(attempt, None) <= base * 1.1
    assert p.delay(0, 5.0) == 5.0
    assert p.delay(0, 3600.0) == 60.0
    assert p.delay(0, -1.0) == 1.0  # the floor (retry_after_min_s)


def test_retry_after_has_a_floor_and_a_cap() -> None:
    """``Retry-After: 0`` waits the floor (a loop of requests otherwise), a huge one the cap."""
    assert RetryPolicy().delay(0, 0.0) == 1.0 and RetryPolicy().delay(0, 10**9) == 300.0
    p = RetryPolicy(retry_after_min_s=0.5, retry_after_max_s=2.0)
    assert (p.delay(3, 0.0), p.delay(3, 1.5), p.delay(3, 9.0)) == (0.5, 1.5, 2.0)


def test_an_item_is_given_up_past_its_tries_or_its_time() -> None:
    """``next_delay``: None once the tries are spent or the next try would come past ``max_retry_s``."""
    p = RetryPolicy(base_s=1.0, max_s=1.0, max_retry_s=10.0)
    assert p.next_delay(1, None, 0.0) is not None
    assert p.next_delay(1, None, 8.0) is not None  # 8 + at most 1.1 s
    assert p.next_delay(1, None, 9.05) is None  # 9.05 + at least 1 s > 10
    assert p.next_delay(1, 5.0, 4.0) == 5.0 and p.next_delay(1, 7.0, 4.0) is None  # Retry-After counts
    assert RetryPolicy(max_attempts=3, max_retry_s=0).next_delay(3, None, 1e9) is None
    assert RetryPolicy(max_attempts=0, max_retry_s=0).next_delay(10**6, None, 1e12) is not None
    assert RetryPolicy().max_retry_s == 86400.0  # bounded out of the box


def test_webhook_answers() -> None:
    assert classify(200, None) == Sent() and classify(204, None) == Sent()
    assert classify(429, "7") == Retry("http_429", 7.0)
    assert classify(503, None) == Retry("http_503", None)
    assert classify(408, None) == Retry("http_408", None)
    assert classify(410, None) == Gone("http_410")
    assert classify(400, None) == Refused("http_400")
    assert classify(301, None) == Refused("http_301")


def test_webhook_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"a":1}'
    mac = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", "1700000000", body) == "sha256=" + mac
    assert sign("k", "1700000001", body) != sign("k", "1700000000", body)


def test_guble_bodies_as_fcm_messages() -> None:
    both = {"notification": {"title": "t"}, "data": {"k": "v"}}
    assert fcm_message(orjson.dumps(both)) == both
    assert fcm_message(b'{"k":"v","n":1}') == {"data": {"k": "v", "n": 1}}
    assert fcm_message(b"hello") == {"data": {"message": "hello"}}
    assert fcm_message(b"[1,2]") == {"data": {"message": "[1,2]"}}
    unregistered = {"error": {"status": "NOT_FOUND", "details": [{"errorCode": "UNREGISTERED"}]}}
    assert _v1_error_code(orjson.dumps(unregistered)) == "UNREGISTERED"
    assert _v1_error_code(b'{"error":{"status":"INVALID_ARGUMENT"}}') == "INVALID_ARGUMENT"
    assert _v1_error_code(b"not json") == ""


def test_guble_bodies_as_apns_payloads() -> None:
    payload = b'{"aps":{"alert":"hi"},"x":1}'
    assert apns_payload(payload) == payload
    assert orjson.loads(apns_payload(b"plain text")) == {"aps": {"alert": "plain text"}}
