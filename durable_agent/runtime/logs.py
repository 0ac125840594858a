"""The worker's log lines, each naming the turn it belongs to.

    setup("text" | "json", level)

Every line logged during a turn carries its workflow id and run id, the activity
type and attempt when an activity logged it, and the trace id of the span that
was current, so a line leads to the turn in the Web UI and to its trace:

    text  08:09:52 INFO temporalio.activity: offline offline-keyword-v1: 45 in / 6 out
          tokens, cost $0 [turn-demo-26dfc0c4 plan#1 trace=4bf92f3577b34da6a3ce929d0e0e4736]
    json  {"time": "...", "level": "INFO", "logger": "temporalio.activity", "message": "...",
           "workflow_id": "turn-demo-26dfc0c4", "run_id": "...", "workflow_type": "AgentTurn",
           "activity_type": "plan", "activity_id": "1", "attempt": 1,
           "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "..."}

Whatever looks like a credential is masked out of every line, its traceback included
(`durable_agent.redact`): an error's text may repeat the key a provider was sent.

The SDK's workflow and activity loggers (`workflow.logger`, `activity.logger`)
already attach the ids (`temporal_workflow`, `temporal_activity`); any other logger
used inside an activity gets them from the activity's context. The trace id is
the current OpenTelemetry span's, in the W3C form trace viewers search by.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Any

from opentelemetry import trace
from temporalio import activity
from temporalio import workflow as temporal_workflow

from durable_agent import redact
from durable_agent.telemetry import attempt_span_context

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FORMAT_SETTING = "AGENT_LOG_FORMAT"
LEVEL_SETTING = "AGENT_LOG_LEVEL"

FIELDS = ("workflow_id", "run_id", "workflow_type", "activity_type", "activity_id", "attempt")
"""What a record learns about its turn, besides trace_id and span_id."""


class InfoSafeMessages(logging.Filter):
    """The SDK's workflow and activity loggers append the turn's info to a message
    (` ({'workflow_id': ...})`) before the message is formatted with its arguments, so
    a workflow id with a `%` in it (a tenant user's, `turn-acme%3Aada-…`) breaks the
    formatting: the line is lost ("Logging error"), and a handler that raises on
    that (pytest's) fails the workflow task. This formats such a record's own message
    with its arguments first, then appends the info as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.msg, str):
            head, appended, info = record.msg.rpartition(" ({'")
            if appended and "%" in info:
                try:
                    record.msg = (head % record.args) + appended + info
                except (TypeError, ValueError):
                    return True  # not the SDK's shape: left as it was
                record.args = ()
        return True


def guard_sdk_messages() -> None:
    """`InfoSafeMessages` on the SDK's workflow and activity loggers (once)."""
    for name in ("temporalio.workflow", "temporalio.activity"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, InfoSafeMessages) for f in logger.filters):
            logger.addFilter(InfoSafeMessages())


class TurnFields(logging.Filter):
    """Puts the turn's ids and the current trace id on every record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _temporal_fields(record)
        span = trace.get_current_span().get_span_context()
        if not span.is_valid and activity.in_activity():
            span = attempt_span_context() or span  # the SDK logs a failure after its span
        if span.is_valid:
            fields["trace_id"] = trace.format_trace_id(span.trace_id)
            fields["span_id"] = trace.format_span_id(span.span_id)
        record.turn = fields
        return True


def _temporal_fields(record: logging.LogRecord) -> dict[str, Any]:
    details = getattr(record, "temporal_activity", None)
    if details is None and activity.in_activity():
        info = activity.info()
        details = {
            "workflow_id": info.workflow_id,
            "workflow_run_id": info.workflow_run_id,
            "workflow_type": info.workflow_type,
            "activity_type": info.activity_type,
            "activity_id": info.activity_id,
            "attempt": info.attempt,
        }
    if details is not None:
        return {
            "workflow_id": details.get("workflow_id"),
            "run_id": details.get("workflow_run_id"),
            "workflow_type": details.get("workflow_type"),
            "activity_type": details.get("activity_type"),
            "activity_id": details.get("activity_id"),
            "attempt": details.get("attempt"),
        }
    details = getattr(record, "temporal_workflow", None)
    if details is None and temporal_workflow.in_workflow():
        run = temporal_workflow.info()
        details = {"workflow_id": run.workflow_id, "run_id": run.run_id}
        details["workflow_type"] = run.workflow_type
    if details is not None:
        return {k: details.get(k) for k in ("workflow_id", "run_id", "workflow_type")}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": redact.mask(record.getMessage()),
            **{k: v for k, v in getattr(record, "turn", {}).items() if v is not None},
        }
        if record.exc_info:
            line["exception"] = redact.mask(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`08:09:52 INFO name: message [turn-demo-1 plan#1 trace=…]`, for people."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = redact.mask(super().format(record))
        fields = getattr(record, "turn", {})
        where = [fields["workflow_id"]] if fields.get("workflow_id") else []
        if fields.get("activity_type"):
            where.append(f"{fields['activity_type']}#{fields.get('attempt') or 1}")
        if fields.get("trace_id"):
            where.append(f"trace={fields['trace_id']}")
        if not where:
            return text
        head, newline, rest = text.partition("\n")  # a traceback stays below the line
        return f"{head} [{' '.join(where)}]{newline}{rest}"


def setup(fmt: str | None = None, level: str | None = None) -> None:
    """Log to standard error in `fmt` (AGENT_LOG_FORMAT, default text) at `level`
    (AGENT_LOG_LEVEL, default warning). Raises ValueError naming the choices."""
    fmt = (fmt or os.environ.get(FORMAT_SETTING) or "text").strip().lower()
    level = (level or os.environ.get(LEVEL_SETTING) or "warning").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TurnFields())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The ids are fields of each line now; the SDK need not repeat them in the message.
    activity.logger.activity_info_on_message = False
    temporal_workflow.logger.workflow_info_on_message = False
