"""Tools that are AWS Lambda functions, as in the original e-commerce agent.

    order_status = lambda_tool(
        name="order_status",
        function="LLMAgentOrdersTool",
        args=OrderLookup,
        description="Status of a specific order ...",
        payload=lambda args, ctx: {"orderId": args.order_id, "customerId": ctx.customer_id},
    )
    TOOLS = ToolRegistry([order_status, ...])

`dispatch` runs it like any tool: `lambda.invoke` (RequestResponse) with the
payload, in a thread. What the model sees:
- a `FunctionError` (the function raised) → its `errorMessage`, as an observation;
- a payload that is not JSON → an observation saying so;
- `{"statusCode": 4xx/5xx, "body": ...}` (API-Gateway style) → the body, as an error;
- otherwise the `body` (or the whole payload) as the tool's result.
Throttling and Lambda service errors are retried by Temporal (botocore's own
retries are off); a missing function or denied access is not.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from durable_agent.errors import ToolError, ToolUnavailable
from durable_agent.tools import Tool, ToolContext

TRANSIENT_CODES = {
    "TooManyRequestsException",
    "ServiceException",
    "ResourceNotReadyException",
    "EC2ThrottledException",
    "ResourceConflictException",
}

Payload = Callable[[Any, ToolContext[Any]], dict[str, Any]]


def lambda_tool(
    *,
    name: str,
    function: str,
    args: type[BaseModel],
    description: str,
    examples: Sequence[str] = (),
    payload: Payload | None = None,
    client: Any = None,
    timeout: timedelta = timedelta(seconds=15),
    max_attempts: int = 3,
    side_effects: bool = False,
) -> Tool:
    """A tool that invokes the Lambda `function`. By default the payload is the
    arguments plus `customerId` (trusted, from the turn)."""
    state: dict[str, Any] = {"client": client}

    def invoke(a: BaseModel, ctx: ToolContext[Any]) -> Any:
        body = payload(a, ctx) if payload else {**a.model_dump(), "customerId": ctx.customer_id}
        if state["client"] is None:
            import boto3
            from botocore.config import Config

            state["client"] = boto3.client(
                "lambda", config=Config(retries={"max_attempts": 1, "mode": "standard"})
            )
        try:
            resp = state["client"].invoke(
                FunctionName=function,
                InvocationType="RequestResponse",
                Payload=json.dumps(body).encode(),
            )
        except Exception as e:
            raise _classify(e, function) from e
        return read_payload(name, resp)

    return Tool(
        name=name,
        description=description,
        args_model=args,
        fn=invoke,
        examples=tuple(examples),
        timeout=timeout,
        max_attempts=max_attempts,
        side_effects=side_effects,
    )


def read_payload(name: str, resp: dict[str, Any]) -> Any:
    raw = resp["Payload"].read()
    try:
        data = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        raise ToolError(f"{name} returned a payload that is not JSON") from None
    if resp.get("FunctionError"):
        message = data.get("errorMessage") if isinstance(data, dict) else None
        raise ToolError(f"{name} failed: {message or resp['FunctionError']}")
    if isinstance(data, dict) and "statusCode" in data:
        body = data.get("body")
        if isinstance(body, str):
            with contextlib.suppress(json.JSONDecodeError):  # a plain-text body stays text
                body = json.loads(body)
        if not 200 <= int(data["statusCode"]) < 300:
            raise ToolError(body if isinstance(body, str) else f"{name} answered {data}")
        return body
    return data


def _classify(e: Exception, function: str) -> Exception:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code", "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        if code in TRANSIENT_CODES or status >= 500:
            return ToolUnavailable(f"Lambda {function} unavailable ({code or status})")
        message = response.get("Error", {}).get("Message", "")
        return ToolError(f"Lambda {function} cannot be invoked ({code}): {message}")
    if type(e).__name__ in ("EndpointConnectionError", "ReadTimeoutError", "ConnectTimeoutError"):
        return ToolUnavailable(f"Lambda unreachable: {e}")
    return e
