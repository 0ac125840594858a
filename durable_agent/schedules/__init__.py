"""Schedules of turns: an agent asked on a cron, an interval or at a time, by the
Temporal server (`AgentClient.schedules`, `durable-agent schedule`)."""

from durable_agent.schedules._schedules import ScheduleInfo, Schedules, scheduled_turn_id
from durable_agent.schedules._when import NAME_PATTERN, OVERLAPS

__all__ = ["NAME_PATTERN", "OVERLAPS", "ScheduleInfo", "Schedules", "scheduled_turn_id"]
