"""Amazon Bedrock Guardrails as a shield, through `ApplyGuardrail` (bedrock-runtime).

    AGENT_SHIELDS_INPUT=offline,bedrock
    AGENT_GUARDRAIL_ID=abc123xyz        the guardrail's id or ARN (required)
    AGENT_GUARDRAIL_VERSION=1           a published version, or DRAFT (the default)

The guardrail judges the text alone, with no model call. Credentials and region
come from the standard AWS settings the worker sees (AWS_PROFILE, AWS_REGION,
instance roles); the worker's role needs `bedrock:ApplyGuardrail` on the guardrail.

A guardrail applies its input policies or its output policies, by `source`:

    input, tool_input    INPUT     what reaches the model: the question, a planned call
    tool_output          INPUT     a tool result is read by the model like a prompt, and
                                   Bedrock's prompt-attack filter judges prompts only
    output               OUTPUT    the answer the customer reads

When the guardrail intervenes the verdict is a violation: its category names the
first policy that acted (`contentPolicy:PROMPT_ATTACK`,
`sensitiveInformationPolicy:CREDIT_DEBIT_CARD_NUMBER`, `topicPolicy:<topic>`), and
its message is the guardrail's own blocked-message text when it gave one. A
guardrail that only masks (ANONYMIZED) still counts as intervening: the shield
has no way to hand the masked text on, so the text is refused as a whole.

botocore's own retries are off (one attempt per activity attempt): throttling,
quota, 5xx and timeouts are `ShieldUnavailable` (retried); access denied, an
unknown guardrail or version and invalid requests are `ShieldConfigError`, with
what to fix.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from durable_agent.backends import _aws
from durable_agent.errors import ModelRequestRejected, ModelUnavailable
from durable_agent.shields import (
    Position,
    ShieldConfigError,
    ShieldRequest,
    ShieldUnavailable,
    Verdict,
)

SOURCES: dict[Position, str] = {
    "input": "INPUT",
    "tool_input": "INPUT",
    "tool_output": "INPUT",
    "output": "OUTPUT",
}
INTERVENED = "GUARDRAIL_INTERVENED"
SETTINGS = "AGENT_GUARDRAIL_ID / AGENT_GUARDRAIL_VERSION"

# Per policy of an assessment: the list of findings and the field that names one.
FINDINGS: tuple[tuple[str, str, str], ...] = (
    ("topicPolicy", "topics", "name"),
    ("contentPolicy", "filters", "type"),
    ("wordPolicy", "customWords", "match"),
    ("wordPolicy", "managedWordLists", "type"),
    ("sensitiveInformationPolicy", "piiEntities", "type"),
    ("sensitiveInformationPolicy", "regexes", "name"),
    ("contextualGroundingPolicy", "filters", "type"),
)


class BedrockGuardrail:
    name = "bedrock"

    def __init__(self, guardrail_id: str, version: str = "DRAFT", client: Any = None) -> None:
        self.guardrail_id = guardrail_id
        self.version = version
        self._client = client if client is not None else _client()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, client: Any = None
    ) -> BedrockGuardrail:
        env = os.environ if environ is None else environ
        guardrail_id = env.get("AGENT_GUARDRAIL_ID", "").strip()
        if not guardrail_id:
            raise ShieldConfigError(
                "the bedrock shield needs AGENT_GUARDRAIL_ID: set it to the guardrail's id "
                "or ARN (Bedrock console, Guardrails), or drop `bedrock` from AGENT_SHIELDS_*"
            )
        version = env.get("AGENT_GUARDRAIL_VERSION", "").strip() or "DRAFT"
        return cls(guardrail_id, version, client=client)

    async def check(self, request: ShieldRequest) -> Verdict:
        if not request.text.strip():
            return Verdict(shield=self.name)  # nothing to judge (and the API refuses it)
        kwargs = self.request(request)
        try:
            # boto3 is synchronous: keep the worker's event loop free meanwhile.
            resp = await asyncio.to_thread(self._client.apply_guardrail, **kwargs)
        except Exception as e:
            raise classify(e) from e
        return self.verdict(resp)

    def request(self, request: ShieldRequest) -> dict[str, Any]:
        """The `apply_guardrail` keyword arguments for a request."""
        return {
            "guardrailIdentifier": self.guardrail_id,
            "guardrailVersion": self.version,
            "source": SOURCES[request.position],
            "content": [{"text": {"text": request.text}}],
        }

    def verdict(self, resp: dict[str, Any]) -> Verdict:
        if resp.get("action") != INTERVENED:
            return Verdict(shield=self.name)
        category = _first_finding(resp.get("assessments") or []) or "intervened"
        said = " ".join(o.get("text", "") for o in resp.get("outputs") or []).strip()
        reason = resp.get("actionReason") or ""
        message = said or reason or f"the Bedrock guardrail intervened ({category})"
        return Verdict(shield=self.name, allowed=False, category=category, message=message)


def _client() -> Any:
    try:
        return _aws.client("bedrock-runtime", "bedrock")
    except ModelRequestRejected:  # boto3 missing
        raise ShieldConfigError("the bedrock shield needs boto3: pip install -e '.[aws]'") from None
    except Exception as e:  # botocore's NoRegionError, a broken AWS profile
        raise ShieldConfigError(
            f"the bedrock shield cannot create its AWS client ({e}); set AWS_REGION "
            "(and AWS_PROFILE or credentials) for the worker"
        ) from None


def _first_finding(assessments: list[dict[str, Any]]) -> str:
    """`policy:name` of the first finding the guardrail acted on (BLOCKED or
    ANONYMIZED; with a FULL output scope the others are listed too)."""
    for assessment in assessments:
        for policy, field, key in FINDINGS:
            for finding in (assessment.get(policy) or {}).get(field) or []:
                if finding.get("action", "NONE") != "NONE":
                    return f"{policy}:{finding.get(key, '')}"
        if assessment.get("automatedReasoningPolicy", {}).get("findings"):
            return "automatedReasoningPolicy"
    return ""


def classify(e: Exception) -> Exception:
    """A botocore error as `ShieldUnavailable` (retried) or `ShieldConfigError` (not)."""
    mapped = _aws.classify(e, "Bedrock Guardrails", "guardrail id and version")
    if isinstance(mapped, ModelUnavailable):
        return ShieldUnavailable(str(mapped))
    if not isinstance(mapped, ModelRequestRejected):
        return mapped
    code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
    if code == "AccessDeniedException":
        return ShieldConfigError(
            f"{mapped}: the worker's role needs bedrock:ApplyGuardrail on the guardrail "
            f"named by {SETTINGS}"
        )
    if code in ("ResourceNotFoundException", "ValidationException"):
        return ShieldConfigError(
            f"{mapped}; check {SETTINGS} (a version is a number or DRAFT) and AWS_REGION"
        )
    return ShieldConfigError(str(mapped))
