"""A Llama Guard model as a shield, on any OpenAI-compatible Chat Completions server.

    AGENT_SHIELDS_OUTPUT=offline,llama_guard
    AGENT_LLAMA_GUARD_MODEL=llama-guard3:8b            the model's name on the server (required)
    AGENT_LLAMA_GUARD_BASE_URL=http://localhost:11434/v1   else OPENAI_BASE_URL
    AGENT_LLAMA_GUARD_API_KEY=ollama                   else OPENAI_API_KEY

Llama Guard's chat template writes its own classification prompt (the hazard
categories, the conversation, "provide your safety assessment") around the
messages it is sent, and judges the last one. So the shield sends only the
conversation to judge: the text as a user message for `input` and `tool_input`;
for `output` and `tool_output` the customer's question (the first context item)
as the user message and the text as the assistant's reply. Without a question,
the text goes alone as a user message.

The model answers `safe`, or `unsafe` with the violated categories on the next
line (`S1,S10`). The reply is read leniently (any case, stray whitespace and
punctuation, the codes on the same line); the first code is the verdict's
category and the message names them all (Llama Guard 3's taxonomy). A reply
that is neither is `ShieldUnavailable`: a retry usually reads right.

Errors are classified as the OpenAI backend does (`agent.backends.openai_chat`):
connection errors, timeouts, 408, 409, 429 and 5xx are `ShieldUnavailable`,
honouring Retry-After; 401, 403, 404 and other refusals are `ShieldConfigError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from durable_agent.backends.openai_chat import classify as classify_openai
from durable_agent.errors import ModelRequestRejected, ModelUnavailable
from durable_agent.shields import ShieldConfigError, ShieldRequest, ShieldUnavailable, Verdict

CATEGORIES = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex-Related Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}
"""Llama Guard 3's hazard categories (the MLCommons taxonomy, plus S14)."""

VERDICT_WORD = re.compile(r"^\W*(safe|unsafe)\b(.*)$", re.IGNORECASE | re.DOTALL)
CODE = re.compile(r"\b([SO]\d{1,2})\b", re.IGNORECASE)
SETTINGS_HINT = {
    401: "check AGENT_LLAMA_GUARD_API_KEY (else OPENAI_API_KEY)",
    403: "check AGENT_LLAMA_GUARD_API_KEY (else OPENAI_API_KEY)",
    404: "check AGENT_LLAMA_GUARD_MODEL and AGENT_LLAMA_GUARD_BASE_URL (else OPENAI_BASE_URL)",
}


class LlamaGuardShield:
    name = "llama_guard"

    def __init__(self, model: str, client: Any) -> None:
        self.model = model
        self._client = client

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LlamaGuardShield:
        env = os.environ if environ is None else environ
        model = env.get("AGENT_LLAMA_GUARD_MODEL", "").strip()
        if not model:
            raise ShieldConfigError(
                "the llama_guard shield needs AGENT_LLAMA_GUARD_MODEL: set it to the Llama "
                "Guard model's name on the server (e.g. llama-guard3:8b), or drop "
                "`llama_guard` from AGENT_SHIELDS_*"
            )
        base_url = env.get("AGENT_LLAMA_GUARD_BASE_URL") or env.get("OPENAI_BASE_URL") or None
        api_key = env.get("AGENT_LLAMA_GUARD_API_KEY") or env.get("OPENAI_API_KEY") or ""
        return cls(model, _client(base_url, api_key))

    async def check(self, request: ShieldRequest) -> Verdict:
        conversation = messages(request)
        if not conversation[-1]["content"].strip():
            return Verdict(shield=self.name)  # nothing to judge
        try:
            resp = await self._client.chat.completions.create(
                model=self.model, messages=conversation, temperature=0, max_tokens=64
            )
        except Exception as e:  # the openai package is optional: classify by shape
            raise classify(e) from e
        reply = (resp.choices[0].message.content or "") if resp.choices else ""
        return self.verdict(reply)

    def verdict(self, reply: str) -> Verdict:
        parsed = parse(reply)
        if parsed is None:
            raise ShieldUnavailable(
                f"{self.model} replied neither safe nor unsafe ({reply[:80]!r}); "
                "is AGENT_LLAMA_GUARD_MODEL a Llama Guard model?"
            )
        safe, codes = parsed
        if safe:
            return Verdict(shield=self.name)
        named = ", ".join(f"{c} {CATEGORIES[c]}" if c in CATEGORIES else c for c in codes)
        return Verdict(
            shield=self.name,
            allowed=False,
            category=codes[0] if codes else "unsafe",
            message=f"Llama Guard judged the text unsafe ({named or 'no category given'})",
        )


def _client(base_url: str | None, api_key: str) -> Any:
    try:
        from openai import AsyncOpenAI
    except ImportError:
        raise ShieldConfigError(
            "the llama_guard shield needs the `openai` package: pip install -e '.[openai]'"
        ) from None
    if not api_key:
        raise ShieldConfigError(
            "the llama_guard shield needs an API key: set AGENT_LLAMA_GUARD_API_KEY or "
            "OPENAI_API_KEY (any value for a local server that needs none)"
        )
    # Temporal owns every retry; a shield is a short call.
    return AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=8)


def messages(request: ShieldRequest) -> list[dict[str, str]]:
    """The conversation Llama Guard judges (its last message), as chat messages."""
    text = request.text or (request.call.render() if request.call else "")
    question = request.context[0] if request.context else ""
    if request.position in ("output", "tool_output") and question:
        return [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
    return [{"role": "user", "content": text}]


def parse(reply: str) -> tuple[bool, list[str]] | None:
    """(safe, category codes) from a Llama Guard reply; None if it is neither."""
    m = VERDICT_WORD.match(reply.strip())
    if m is None:
        return None
    if m.group(1).lower() == "safe":
        return True, []
    codes = [c.upper() for c in CODE.findall(m.group(2))]
    return False, list(dict.fromkeys(codes))


def classify(e: Exception) -> Exception:
    """An `openai` exception as `ShieldUnavailable` (retried) or `ShieldConfigError`."""
    mapped = classify_openai(e)
    if isinstance(mapped, ModelUnavailable):
        return ShieldUnavailable(f"Llama Guard: {mapped}", retry_after=mapped.retry_after)
    if isinstance(mapped, ModelRequestRejected):
        said = str(mapped).rsplit("; check", 1)[0]  # its own hint names OPENAI_* only
        status = getattr(e, "status_code", 0)
        hint = SETTINGS_HINT.get(status, "check the Llama Guard settings (AGENT_LLAMA_GUARD_*)")
        return ShieldConfigError(f"Llama Guard: {said}; {hint}")
    return mapped
