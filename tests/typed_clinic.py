"""An agent with an output type of its own, served by a worker in another process
(`tests/test_typed_outputs.py`): the test's own process has not loaded this module
until the test imports it."""

from __future__ import annotations

from pydantic import BaseModel

from durable_agent import Agent
from durable_agent.testing import TestModel


class Slot(BaseModel):
    slot_id: str
    time: str
    doctor: str


SLOT = {"slot_id": "s-17", "time": "2026-12-01 09:30", "doctor": "Dr Ng"}

clinic = Agent(
    name="clinic",
    model="test",
    models={"test": lambda _: TestModel(output=SLOT)},
    output_type=Slot,
)
