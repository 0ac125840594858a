"""The masking of credentials in text bound for a log line or a trace
(`durable_agent.redact`): every shape a provider, an SDK or a tool puts a secret in, and
the words around it kept, so a tool's error still says what went wrong."""

from __future__ import annotations

import time

import pytest

from durable_agent.redact import MASK, mask

KEY = "sk-proj-AbCdEf0123456789xyzXYZ_-AbCdEf0123456789"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

SECRETS = [
    # (text, the secret that must go, what must stay)
    (f"Incorrect API key provided: {KEY}.", KEY, "Incorrect API key provided: sk-***."),
    ("Incorrect API key provided: sk-proj-********************wXyZ.", "wXyZ", "provided: sk-"),
    (f"Error code: 401 - {{'error': {{'message': 'bad key {KEY}'}}}}", KEY, "Error code: 401"),
    ("key sk-ant-api03-AbCdEfGh_IjKlMnOp-QrStUv", "AbCdEfGh", "key sk-***"),
    ("Authorization: Bearer abc.def.ghi-123", "abc.def", "Authorization: ***"),
    ("authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz", "authorization=***"),
    ("headers={'Authorization': 'Bearer tok123456', 'Host': 'api'}", "tok123456", "'Host': 'api'"),
    ('{"Authorization": "AWS4-HMAC-SHA256 Credential=AKIA/x"}', "HMAC", '{"Authorization": "***"}'),
    ("sent with Bearer eyJhbGciOiJIUzI1NiJ9xx and failed", "eyJhbGci", "and failed"),
    (
        "GET https://api.example.com/v1?key=AIzaSyA-1234567890abcdefghijklmnopqrs&q=1",
        "AIzaSy",
        "&q=1",
    ),
    ("url: /search?api_key=s3cr3tvalue&page=2", "s3cr3tvalue", "api_key=***&page=2"),
    ("OPENAI_API_KEY=abc123def456 was set", "abc123def456", "OPENAI_API_KEY=*** was set"),
    ("api_key = 'hunter2-but-longer'", "hunter2", "api_key = '***'"),
    ('config {"api_key": "k-123-456", "model": "gpt"}', "k-123-456", '"model": "gpt"'),
    ("x-api-key: 0123456789abcdef", "0123456789abcdef", "x-api-key: ***"),
    ("X-API-KEY:0123456789abcdef rest", "0123456789abcdef", "rest"),
    ("password=correct horse", "correct", "password=*** horse"),
    ('{"password": "correct horse battery"}', "battery", '{"password": "***"}'),
    ("client_secret: abcdef0123456789", "abcdef0123456789", "client_secret: ***"),
    ("token=ghp_abcdefghijklmnopqrstuvwxyz012345", "ghp_abc", "token=***"),
    ("pushed with ghp_abcdefghijklmnopqrstuvwxyz012345 today", "ghp_abc", "pushed with"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_", ""),
    ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890", "slack ***"),
    (f"aws_access_key_id={AWS_ID}", AWS_ID, "aws_access_key_id=AKIA***"),
    (f"The security token included in the request is invalid ({AWS_ID})", AWS_ID, "(AKIA***)"),
    (f"aws_secret_access_key={AWS_SECRET}", AWS_SECRET, "aws_secret_access_key=***"),
    (f"AWS_SECRET_ACCESS_KEY: {AWS_SECRET}", AWS_SECRET, "AWS_SECRET_ACCESS_KEY: ***"),
    (f"the secret {AWS_SECRET} is wrong", AWS_SECRET, "the secret *** is wrong"),
    (
        "?X-Amz-Signature=abcdef0123&X-Amz-Security-Token=IQoJb3Jp",
        "IQoJb3Jp",
        "X-Amz-Signature=***",
    ),
    ("postgresql://app:s3cr3t-pw@db.internal:5432/shop", "s3cr3t-pw", "postgresql://app:***@db"),
    ("redis://default:pa55word@cache:6379", "pa55word", "redis://default:***@cache"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY----- done",
        "MIIEpAIBAAKCAQEA",
        "done",
    ),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4", "SflKxwRJ", "jwt ***"),
]


@pytest.mark.parametrize(("text", "secret", "kept"), SECRETS)
def test_a_credential_is_masked_and_the_words_around_it_stay(
    text: str, secret: str, kept: str
) -> None:
    masked = mask(text)
    assert secret not in masked, masked
    assert MASK in masked
    assert kept in masked, masked
    assert mask(masked) == masked  # masking twice changes nothing more


PLAIN = [
    "order 123456 not found",
    "invalid arguments for order_status: order_id: string does not match '^\\d{6}$'",
    "missing key: order_id",
    "Unexpected token: '}' at position 12",
    "KeyError: 'customer'",
    "the monkey ate 3 bananas",
    "commit 0123456789abcdef0123456789abcdef01234567 is not on main",
    "request 4f1c2b9e-7d3a-4c1b-9a8e-2f6d5c4b3a21 timed out after 30 s",
    "Order 456789 has not shipped yet (status: processing), so it has no tracking link.",
    "model endpoint answered 503: The engine is currently overloaded, please try again later",
    "the risk-assessment tool is down; task-runner restarted",
    "connect to https://shop.example/track/123456 failed",
    "a token of thanks",
    "$19.98 refunded to card ending 4242",
]


@pytest.mark.parametrize("text", PLAIN)
def test_text_without_a_credential_is_left_as_it_is(text: str) -> None:
    assert mask(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "a-" * 100_000,
        "a." * 100_000,
        "key=" * 50_000,
        'key="' * 50_000,
        "x://" * 50_000,
        "A1b" * 70_000,
        "-----BEGIN " + "A" * 200_000,
        "authorization" * 20_000,
    ],
    ids=["dashes", "dots", "keys", "open-quotes", "schemes", "base64", "begin", "headers"],
)
def test_no_text_makes_masking_slow(text: str) -> None:
    started = time.perf_counter()
    mask(text)
    assert time.perf_counter() - started < 2.0
