"""The public client (`durable_agent.AgentClient`), as a team's own code uses it, against
a real server and worker: ask, start and follow, approve and reject, conversations
picked up by id, finding turns, idempotent starts, and the errors it promises."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient, TurnResult
from durable_agent.approval import ApprovalPolicy
from durable_agent.errors import AgentClientError, NothingPending, NoWorker, UnknownTurn
from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.stream import DoneEvent, StepEvent
from durable_agent.types import Outcome, StepKind, ToolCall
from tests.conftest import Harness, last_result

RETURN = ToolCall(
    id="c1", name="start_return", arguments={"order_id": "123456", "reason": "arrived damaged"}
)


def returns() -> ScriptedModel:
    """Asks to start a return (a write), then answers with what it got."""
    return ScriptedModel(
        plans=[Reply(calls=[RETURN])], decisions=[lambda req: Reply(text=last_result(req))]
    )


def plain(client: Client) -> Client:
    """The same connection with the SDK's default converter: a team's own client."""
    return Client(client.service_client, namespace=client.namespace)


async def test_ask_returns_a_typed_result(env: WorkflowEnvironment, harness: Harness) -> None:
    async with harness.worker() as task_queue:
        agents = AgentClient(plain(env.client), task_queue=task_queue)
        result = await agents.ask("Has order 123456 shipped?", customer="demo")
    assert isinstance(result, TurnResult) and result.answered
    assert result.outcome is Outcome.ANSWERED and "123456" in result.answer
    assert result.workflow_id.startswith("turn-demo-")
    assert result.agent == "shop" and result.fingerprint
    assert result.usage.model_calls >= 1
    assert [s.kind for s in result.steps if s.kind is StepKind.TOOL_CALL]
    assert TurnResult.model_validate_json(result.model_dump_json()) == result


async def test_a_turn_is_followed_then_approved_from_code(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    async with harness.worker(returns(), approvals=ApprovalPolicy()) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        turn = await agents.start("Return order 123456, it is damaged", model="scripted")
        seen: list[str] = []
        async for offset, event in turn.events():
            assert offset == len(seen)
            seen.append(event.type)
            if isinstance(event, StepEvent) and event.step.kind is StepKind.APPROVAL:
                break
        (waiting,) = await turn.pending()
        assert waiting.call.name == "start_return"
        # Every turn of the namespace awaiting consent is listed (other tests' turns
        # too, their workers gone: marked `stalled`); this one's worker runs.
        (listed,) = [p for p in await agents.pending() if p.workflow_id == turn.id]
        assert listed.approval.call.id == waiting.call.id and not listed.stalled
        decided = await turn.approve(by="alice")
        assert (decided.approved, decided.call_id) == (True, waiting.call.id)
        # The stream resumes where the reader left off, and ends with the outcome.
        rest = [item async for item in turn.events(from_offset=len(seen))]
        assert [item.offset for item in rest] == list(range(len(seen), len(seen) + len(rest)))
        assert isinstance(rest[-1].event, DoneEvent)
        result = await turn.result()
    assert result.answered and "RTN" in result.answer.upper()
    assert harness.store.returns_for("123456")
    with pytest.raises(NothingPending, match="no call awaits approval"):
        await turn.approve(by="alice")


async def test_a_rejected_call_never_runs(env: WorkflowEnvironment, harness: Harness) -> None:
    async with harness.worker(returns(), approvals=ApprovalPolicy()) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        turn = await agents.start("Return order 123456", model="scripted")
        while not await turn.pending():
            await asyncio.sleep(0.05)
        await turn.reject(by="alice", reason="changed my mind")
        result = await turn.result()
    assert not harness.store.returns_for("123456")
    assert "declined by alice: changed my mind" in result.answer


async def test_the_same_request_id_is_the_same_turn(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        key = f"req-{uuid.uuid4().hex}"
        first = await agents.ask("Has order 123456 shipped?", request_id=key)
        again = await agents.ask("Has order 123456 shipped?", request_id=key)
        odd = await agents.start("Has order 123456 shipped?", request_id="a key/with spaces")
    assert again.workflow_id == first.workflow_id == f"turn-demo-req~{key[4:]}"
    assert again.steps == first.steps
    assert odd.id == "turn-demo-a%20key%2Fwith%20spaces"
    # Asked by another customer, the same key is another turn.
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        other = await agents.start("Has order 123456 shipped?", customer="c-2", request_id=key)
    assert other.id == f"turn-c~2-req~{key[4:]}"


async def test_a_conversation_is_picked_up_by_its_id(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        chat = agents.chat(customer="demo")
        first = await chat.send("Has order 123456 shipped?")
        later = agents.conversation(chat.id)
        second = await later.send("And order 234567?")
        history = await later.history()
        for _ in range(100):  # the conversation records the answer as it hears of it
            if len(history) == 2:
                break
            await asyncio.sleep(0.05)
            history = await later.history()
        await later.end()
    assert first.answered and second.answered
    assert [e.question for e in history] == ["Has order 123456 shipped?", "And order 234567?"]


async def test_find_turns_by_customer_and_outcome(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    customer = f"c-{uuid.uuid4().hex[:6]}"
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        asked = await agents.ask("Has order 123456 shipped?", customer=customer)
        for _ in range(100):  # the visibility store catches up
            found = await agents.find(customer=customer, outcome="answered")
            if found:
                break
            await asyncio.sleep(0.1)
    assert [row.workflow_id for row in found] == [asked.workflow_id]


async def test_errors_say_what_to_do(env: WorkflowEnvironment) -> None:
    agents = AgentClient(env.client, task_queue=f"nobody-{uuid.uuid4().hex[:6]}")
    with pytest.raises(UnknownTurn, match="no turn with workflow id 'turn-x-nope'"):
        await agents.turn("turn-x-nope").result()
    with pytest.raises(UnknownTurn):
        await agents.turn("turn-x-nope").approve(by="alice")
    with pytest.raises(AgentClientError, match="the question is empty"):
        await agents.start("   ")
    with pytest.raises(AgentClientError, match="outcome 'great': give one of answered"):
        await agents.find(outcome="great")
    with pytest.raises(AgentClientError, match="from_offset: give an event's offset"):
        await anext(agents.turn("turn-x-nope").events(from_offset=-1))
    with pytest.raises(NoWorker, match="no worker serves task queue 'nobody-"):
        await agents.ask("Has order 123456 shipped?", no_worker_after=0.5)


def test_a_client_keeps_its_own_codec(env: WorkflowEnvironment) -> None:
    class Codec:
        async def encode(self, payloads):  # type: ignore[no-untyped-def]
            return payloads

        async def decode(self, payloads):  # type: ignore[no-untyped-def]
            return payloads

    codec = Codec()
    theirs = Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=DataConverter(payload_codec=codec),  # type: ignore[arg-type]
    )
    converter = AgentClient(theirs).temporal.data_converter
    assert converter.payload_codec is codec
    assert converter.payload_converter_class is not DataConverter.default.payload_converter_class


class _PagedWorkers:
    """A namespace listing `pages` of worker heartbeats, one task queue per worker."""

    def __init__(self, pages: int) -> None:
        self.namespace, self.workflow_service, self.pages, self.asked = "default", self, pages, 0

    async def list_workers(self, request):  # type: ignore[no-untyped-def]
        from temporalio.api.worker.v1 import WorkerHeartbeat, WorkerInfo
        from temporalio.api.workflowservice.v1 import ListWorkersResponse

        page = int(request.next_page_token or b"0")
        self.asked += 1
        beat = WorkerHeartbeat(worker_identity=f"w{page}", task_queue=f"q{page}")
        more = str(page + 1).encode() if page + 1 < self.pages else b""
        return ListWorkersResponse(
            workers_info=[WorkerInfo(worker_heartbeat=beat)], next_page_token=more
        )


async def test_every_page_of_worker_heartbeats_is_read_up_to_a_bound() -> None:
    """A live worker listed past the first page still counts (`_live`, `sharing`)."""
    from durable_agent.runtime.turns import HEARTBEAT_PAGES, worker_heartbeats

    three = _PagedWorkers(3)
    beats = await worker_heartbeats(three)  # type: ignore[arg-type]
    assert [b.worker_identity for b in beats] == ["w0", "w1", "w2"] and three.asked == 3
    endless = _PagedWorkers(10 * HEARTBEAT_PAGES)
    assert len(await worker_heartbeats(endless)) == HEARTBEAT_PAGES  # type: ignore[arg-type]
