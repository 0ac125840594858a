"""What the AWS backends share: a boto3 client with retries off, and error mapping."""

from __future__ import annotations

import re
from typing import Any

from durable_agent.errors import ModelCannotAnswer, ModelRequestRejected, ModelUnavailable

TRANSIENT_CODES = {
    "ThrottlingException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalFailure",
    "InternalServerException",
    "ModelTimeoutException",
    "ModelNotReadyException",
    "ServiceQuotaExceededException",
    "ModelStreamErrorException",  # the model failed mid-stream: "retry your request"
}
_TOO_LONG = re.compile(r"too long|too many (input )?tokens|context (window|length)", re.IGNORECASE)
"""How Bedrock says a conversation is longer than the model's context window."""
AUTH_CODES = {
    "AccessDeniedException",
    "UnrecognizedClientException",
    "ExpiredTokenException",
    "InvalidSignatureException",
}


def client(service: str, backend: str) -> Any:
    """A boto3 client that tries once: Temporal owns every retry."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ModelRequestRejected(
            f"the {backend} backend needs boto3: pip install -e '.[aws]'"
        ) from None
    return boto3.client(
        service, config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=50)
    )


def classify(e: Exception, service: str, what: str) -> Exception:
    """A botocore error as `ModelUnavailable` (retried) or `ModelRequestRejected` (not).

    `what` names the thing a user may have mistyped ("model id", "endpoint name").
    """
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        code = response.get("Error", {}).get("Code", "")
        # An exception event inside a stream names its type as the stream's member
        # does (`throttlingException`), with no HTTP status: the same error all the same.
        code = code[:1].upper() + code[1:]
        message = response.get("Error", {}).get("Message", "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        original = response.get("OriginalStatusCode", 0) or 0  # SageMaker ModelError
        if code in TRANSIENT_CODES or status >= 500 or original >= 500:
            return ModelUnavailable(f"{service} {code or status}: {message}")
        if code in AUTH_CODES:
            return ModelRequestRejected(
                f"{service} refused the credentials ({code}): check AWS_PROFILE / AWS_REGION "
                "and the account's access to this resource"
            )
        if code == "ValidationException" and _TOO_LONG.search(message):
            # This model's context window: another model's may be larger.
            return ModelCannotAnswer(
                f"{service}: the request is too long for the model ({message})"
            )
        if code == "ResourceNotFoundException":
            return ModelRequestRejected(f"{service}: not found ({message}); check the {what}")
        return ModelRequestRejected(f"{service} rejected the request ({code}): {message}")
    name = type(e).__name__
    if name == "NoCredentialsError":
        return ModelRequestRejected(
            "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    # ProtocolError: urllib3's, when a connection breaks while an event stream is read.
    if name in (
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ProtocolError",
    ):
        return ModelUnavailable(f"{service} unreachable: {e}")
    return e
