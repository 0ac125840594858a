"""Credentials masked out of text that leaves the worker for a log line or a trace.

    mask("Incorrect API key provided: sk-proj-AbC123…")  ->  "Incorrect API key provided: sk-***"

An exception's text is the operator's to read, in the worker's log and the trace, never
the customer's (a turn's answer and steps say a fixed sentence per failure class:
`durable_agent.answers`). Even there it is masked: a provider's error repeats the key
it was given, a client library prints the headers it sent, a connection string holds
its password. What looks like a credential goes, the words around it stay, so a tool's
error still tells the model what went wrong.

What is masked: OpenAI-style keys (`sk-…`), bearer tokens, `Authorization` values,
values named for a credential (`key=`, `api_key=`, `token=`, `password=`, `"api_key":
"…"`, `x-api-key: …`), AWS access key ids and secret-looking 40-character strings,
GitHub, Slack and Google keys, JSON web tokens, passwords in URLs and private key blocks.
A heuristic: it masks what has a credential's shape or name, so a key pasted into a
sentence with nothing around it may pass, and a harmless value named `token=` is masked.
Every pattern runs in linear time: no text can make it backtrack.
"""

from __future__ import annotations

import re

MASK = "***"

_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"&,;)\]}>]+)"
"""A value after `name=`: quoted whole, else up to the next space or delimiter."""

_NAMED: list[re.Pattern[str]] = [
    # A whole Authorization header, whatever its scheme (`Bearer`, `Basic`, `AWS4-…`).
    re.compile(
        r"(?i)(\b(?:proxy-)?authorization['\"]?\s*[:=]\s*)(\"[^\"\n]*\"|'[^'\n]*'|[^\r\n]+)"
    ),
    # name=value, where the name ends in a credential's word: `key=`, `api_key=`,
    # `AWS_SECRET_ACCESS_KEY=`, `X-Amz-Signature=`, `?access_token=` (names are matched by
    # their end, so a prefix needs no pattern of its own).
    re.compile(
        r"(?i)((?:key|secret|token|password|passwd|pwd|signature|credential|credentials)"
        r"['\"]?\s*=\s*)" + _VALUE
    ),
    # name: value, for names that say credential whatever precedes them (a JSON or YAML
    # field, a header): not bare `key:` or `token:`, which errors use for other things
    # ("missing key: order_id", "unexpected token: '}'").
    re.compile(
        r"(?i)((?:api[_-]?key|apikey|secret[_-]?access[_-]?key|client[_-]?secret|secret[_-]?key"
        r"|password|passwd|private[_-]?key|access[_-]?token|refresh[_-]?token|session[_-]?token"
        r"|security[_-]?token|auth[_-]?token|bearer[_-]?token)['\"]?\s*:\s*)" + _VALUE
    ),
]
"""Patterns whose first group (the name and its separator) stays, and whose second (the
value) goes, its quotes kept."""

_SHAPED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]+"), f"Bearer {MASK}"),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_*-]{6,}"), f"sk-{MASK}"),
    (re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"), f"AKIA{MASK}"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        MASK,
    ),
]
"""Credentials known by their shape alone, and what each becomes."""

_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]{0,30}://[^/\s:@]+:)[^/\s@]+@")
_FORTY = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
"""An AWS secret access key's shape: 40 characters of base64, alone."""


def mask(text: str) -> str:
    """`text` with whatever looks like a credential replaced by `***`; the rest as it was."""
    for pattern in _NAMED:
        text = pattern.sub(_named, text)
    for pattern, masked in _SHAPED:
        text = pattern.sub(masked, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)
    return _FORTY.sub(_secret_looking, text)


def _named(m: re.Match[str]) -> str:
    value = m.group(2)
    quote = value[0] if value[0] in "'\"" else ""
    return f"{m.group(1)}{quote}{MASK}{quote}"


def _secret_looking(m: re.Match[str]) -> str:
    """A random-looking 40 characters (upper and lower case and digits, as a generated
    secret has): masked. A commit hash (hex, one case) or a word stays."""
    s = m.group(0)
    mixed = any(c.islower() for c in s) and any(c.isupper() for c in s)
    return MASK if mixed and any(c.isdigit() for c in s) else s
