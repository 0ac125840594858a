"""The web chat, through a real browser (Debian's chromium, headless, driven by
Playwright) against the session's dev server and real workers: steps as they
happen, an answer that types itself out, approvals in one click, a reload that
shows nothing twice, and a worker killed while the answer is being written.

`UPDATE_SCREENSHOTS=1 python -m pytest tests/test_web.py` also writes the
README's screenshots (docs/web-chat.png, docs/web-approval.png).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import unicodedata
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import jwt
import pytest
from playwright.async_api import Browser, Locator, Page, Route, async_playwright, expect
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, ApprovalPolicy, Principal
from durable_agent.chat import ConversationInput
from durable_agent.client import AgentClient
from durable_agent.frontends.web import serve
from durable_agent.memory import MemorySettings
from durable_agent.model import Reply
from durable_agent.outputs import OUTPUT_TOOL
from durable_agent.runtime.server import LOCAL_UI_PORT, Connection, free_port, is_listening
from durable_agent.runtime.streams import turn_events
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.stream import TokensEvent
from durable_agent.types import StepKind, ToolCall, TurnOutput
from tests.conftest import Harness
from tests.test_web_server import keeper_plan

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
UI_URL = f"http://localhost:{LOCAL_UI_PORT}"
RETURN = "Please start a return for order 123456, the soap arrived damaged"
POLICY_ANSWER = (
    "Our Returns policy says: You can return any unused item in its original packaging "
    "within 30 days of delivery for a full refund. Opened personal care products (soaps, "
    "oils, bath salts) can be returned only if they are faulty. To start a return, tell us "
    "your order ID and why the item is going back; you get a return ID (like rtn001) and a "
    "prepaid shipping label by email."
)
SHIPPED_ANSWER = (
    "Yes — order 123456 shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."
)

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="the browser tests need chromium (apt-get install chromium; CI installs it)",
)

# Record the last answer's text as the page changes it: at every frame the page
# draws (what a person saw), or after every change (each event the page handled).
RECORDER = """(every) => {
  window.seen = [];
  const record = () => {
    const answers = document.querySelectorAll("[data-testid=answer]");
    const text = answers.length ? answers[answers.length - 1].textContent : "";
    if (window.seen.at(-1) !== text) window.seen.push(text);
  };
  if (every === "frame") {
    const sample = () => { record(); requestAnimationFrame(sample); };
    sample();
  } else {
    const options = { subtree: true, childList: true, characterData: true };
    new MutationObserver(record).observe(document.getElementById("log"), options);
  }
}"""


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        await browser.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 900, "height": 760})
    page = await context.new_page()
    yield page
    await context.close()


@asynccontextmanager
async def web_chat(
    client: Client,
    task_queue: str,
    chat: ConversationInput | None = None,
    agent: Agent | None = None,
) -> AsyncIterator[str]:
    """`serve` on a free port, for customer `demo` (or `chat`'s), of `agent` if given; its
    URL."""
    port = free_port()
    conn = Connection(client=client, ui_url=UI_URL)
    chat = chat or ConversationInput(customer_id="demo")
    serving = asyncio.create_task(serve(conn, chat, port=port, task_queue=task_queue, agent=agent))
    while not is_listening("127.0.0.1", port):
        assert not serving.done(), serving
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def say(page: Page, text: str) -> None:
    await page.get_by_test_id("message").fill(text)
    await page.get_by_test_id("send").click()


def answer(page: Page, n: int) -> Locator:
    """The answer of the page's n-th turn (from 1), once the turn recorded it."""
    return page.locator(f"section.turn:nth-of-type({n}) [data-testid=answer][data-outcome]")


async def step_texts(page: Page) -> list[str]:
    """Each step on the page, as `kind text` (an approval: its tool and why)."""
    return await page.get_by_test_id("step").evaluate_all(
        """steps => steps.map(s => s.dataset.kind + " " + (s.dataset.kind === "approval"
            ? s.querySelector(".tool").textContent + " " + s.querySelector(".why").textContent
            : s.querySelector(".text, pre").textContent))"""
    )


def shown_steps(result: TurnOutput) -> list[str]:
    """What the page shows of a turn's steps: all but the answer (its own bubble)."""
    shown = []
    for s in result.steps:
        if s.kind is StepKind.APPROVAL:
            shown.append(f"approval {s.calls[0].name} {s.text.split(' awaits approval: ')[1]}")
        elif s.kind not in (StepKind.ANSWER, StepKind.LIMIT):
            shown.append(f"{s.kind.value} {s.text}")
    return shown


def screenshot(tmp_path: Path, name: str) -> Path:
    """Where a test saves a screenshot: docs/ with UPDATE_SCREENSHOTS=1."""
    return (ROOT / "docs" if os.environ.get("UPDATE_SCREENSHOTS") else tmp_path) / name


async def turn_result(client: Client, page: Page, n: int) -> TurnOutput:
    turn_id = await page.locator("section.turn").nth(n - 1).get_attribute("data-turn")
    assert turn_id
    return await client.get_workflow_handle(turn_id, result_type=TurnOutput).result()


async def test_a_question_is_answered_with_its_steps_as_it_is_written(
    harness: Harness, page: Page, tmp_path: Path
) -> None:
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, "Has order 123456 shipped?")
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        first = await turn_result(harness.client, page, 1)
        assert await step_texts(page) == shown_steps(first)
        # Tool calls with their arguments; results folded until opened.
        calls = page.locator("[data-testid=step][data-kind=tool_call]")
        await expect(calls).to_have_text(["calls order_status(order_id='123456')"])
        await expect(page.locator("[data-kind=observation] details")).not_to_have_attribute(
            "open", ""
        )
        turn_id = await page.locator("section.turn").first.get_attribute("data-turn")
        await expect(page.locator("section.turn .meta a")).to_have_attribute(
            "href", f"{UI_URL}/namespaces/default/workflows/{turn_id}"
        )

        await page.evaluate(RECORDER, "frame")
        await say(page, "What is your return policy?")
        await expect(answer(page, 2)).to_have_text(POLICY_ANSWER)
        frames: list[str] = await page.evaluate("window.seen")
        # The operator's view: every step, call and check, and the history links.
        await expect(page.locator("[data-kind=tool_call]").first).to_be_hidden()
        await page.locator("#show-checks").check()
        await page.locator("section.turn").nth(1).locator("details").first.click()
        await page.screenshot(path=screenshot(tmp_path, "web-chat.png"), full_page=True)

    drafts = [f for f in frames if f and f != POLICY_ANSWER and POLICY_ANSWER.startswith(f)]
    assert len(drafts) >= 2, f"the answer appeared in {len(drafts)} stage(s): {frames}"
    assert drafts == sorted(drafts, key=len), "the text only grows"


def new_returns(store: ShopStore) -> list[str]:
    return [r.return_id for r in store.returns_for("123456")]


async def test_approve_in_one_click_after_a_reload_mid_turn(
    harness: Harness, page: Page, tmp_path: Path
) -> None:
    before = new_returns(harness.store)
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, RETURN)
        approval = page.locator("[data-kind=approval] .consent")
        await expect(approval.locator(".tool")).to_have_text("start_return")
        await expect(approval.locator(".args")).to_contain_text("123456")
        await expect(approval.locator(".args")).to_contain_text("the soap arrived damaged")
        await page.screenshot(path=screenshot(tmp_path, "web-approval.png"))
        shown = await step_texts(page)
        assert new_returns(harness.store) == before  # nothing written while it waits

        # Mid-turn (it waits for consent): the reloaded page reads the conversation
        # from its start, and shows each step once.
        await page.reload()
        await expect(page.get_by_test_id("approve")).to_have_count(1)
        assert await step_texts(page) == shown

        # A second tab on the same conversation sees the same; a decision taken in
        # one takes the buttons away in both.
        other = await page.context.new_page()
        await other.goto(page.url)
        await expect(other.get_by_test_id("approve")).to_have_count(1)
        assert await step_texts(other) == shown

        await page.get_by_test_id("approve").click()
        for tab in (page, other):
            # Each tab reads the stream on its own: wait for each to have the answer.
            await expect(answer(tab, 1)).to_contain_text("(status: requested)")
            await expect(tab.get_by_test_id("approve")).to_have_count(0)
            await expect(tab.get_by_test_id("reject")).to_have_count(0)
        result = await turn_result(harness.client, page, 1)
        assert await step_texts(page) == await step_texts(other) == shown_steps(result)

    assert "decision start_return: approved by web" in shown_steps(result)
    (created,) = [r for r in new_returns(harness.store) if r not in before]
    assert created in result.answer


async def test_reloads_and_tabs_never_hold_up_consent(
    harness: Harness, browser: Browser, page: Page
) -> None:
    """Readers come and go as they like (a reload storm, fifty tabs): the turn
    waiting for consent takes the decision at once, and writes once."""
    before = new_returns(harness.store)
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, RETURN)
        await expect(page.get_by_test_id("approve")).to_have_count(1)
        for _ in range(100):
            await page.reload(wait_until="domcontentloaded")
        # Tabs of browsers of their own: one browser keeps at most six connections to
        # a server, which fifty open streams would hold.
        contexts = [await browser.new_context() for _ in range(50)]
        tabs = [await c.new_page() for c in contexts]
        await asyncio.gather(*(tab.goto(page.url, wait_until="domcontentloaded") for tab in tabs))
        await page.reload()
        await expect(page.get_by_test_id("approve")).to_have_count(1)
        await page.get_by_test_id("approve").click()
        # The decision is taken (the update is accepted: nothing holds the turn)...
        await expect(page.get_by_test_id("approve")).to_have_count(0, timeout=15_000)
        await expect(page.locator("[data-testid=notice].error")).to_have_count(0)
        # ...and the turn finishes, for every reader (fifty browsers are slow to render
        # on a busy machine).
        await expect(answer(page, 1)).to_contain_text("(status: requested)", timeout=30_000)
        for tab in tabs[:3]:  # the readers that stayed see it too
            await expect(answer(tab, 1)).to_contain_text("(status: requested)", timeout=30_000)
        for context in contexts:
            await context.close()
    assert len([r for r in new_returns(harness.store) if r not in before]) == 1


async def test_reject_writes_nothing_and_the_reply_says_so(harness: Harness, page: Page) -> None:
    before = new_returns(harness.store)
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, RETURN)
        await page.get_by_test_id("reject").click()
        await expect(answer(page, 1)).to_contain_text("declined by web. Nothing was changed.")
        await expect(page.get_by_test_id("approve")).to_have_count(0)
    assert new_returns(harness.store) == before


async def test_files_chosen_dropped_or_pasted_go_with_the_message_and_show_after_a_reload(
    harness: Harness, page: Page
) -> None:
    """Files chosen with the button, an image dropped on the page and one pasted show
    as chips (an image as a thumbnail; each can be removed), go with the message, and the
    turn answers from the text file; a reload shows the message with its files as the
    server keeps them: the image as a thumbnail the browser draws, the text file as a link."""
    hours = b"Our returns desk is open until 6pm on weekdays."
    png = one_pixel_png()
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await page.get_by_test_id("files").set_input_files(
            [
                {"name": "hours.txt", "mimeType": "text/plain", "buffer": hours},
                {"name": "extra.txt", "mimeType": "text/plain", "buffer": b"left out"},
            ]
        )
        chips = page.get_by_test_id("chosen").get_by_test_id("file")
        await expect(chips).to_have_count(2)
        await chips.filter(has_text="extra.txt").get_by_role("button").click()  # removed
        await expect(chips).to_have_count(1)
        # An image dropped on the page, as a browser hands one over.
        dropped = await page.evaluate_handle(
            """bytes => { const t = new DataTransfer();
                t.items.add(new File([new Uint8Array(bytes)], "shelf.png", {type: "image/png"}));
                return t; }""",
            list(png),
        )
        await page.dispatch_event("body", "drop", {"dataTransfer": dropped})
        await expect(chips).to_have_count(2)
        await expect(chips.filter(has_text="shelf.png").locator("img")).to_have_count(1)
        # A screenshot pasted into the message box, then removed again.
        await page.get_by_test_id("message").evaluate(
            """(box, bytes) => { const t = new DataTransfer();
                t.items.add(new File([new Uint8Array(bytes)], "pasted.png", {type: "image/png"}));
                box.dispatchEvent(new ClipboardEvent("paste", {clipboardData: t})); }""",
            list(png),
        )
        await expect(chips).to_have_count(3)
        await chips.filter(has_text="pasted.png").get_by_role("button").click()
        await expect(chips).to_have_count(2)

        await say(page, "Until when is the returns desk open?")
        await expect(chips).to_have_count(0)  # they went with the message
        await expect(answer(page, 1)).to_have_text(
            f"From hours.txt: {hours.decode()} I cannot see images, so I have not read "
            "shelf.png; I read text and PDF files.",
            timeout=30_000,
        )
        sent = page.locator("section.turn .bubble.you").get_by_test_id("file")
        await expect(sent).to_have_text(["hours.txt", "shelf.png"])

        await page.reload()
        await expect(answer(page, 1)).to_be_visible()
        await expect(sent).to_have_text(["hours.txt", "shelf.png"])
        # Drawn from the server's copy (the sender's own is gone with the reload).
        thumbnail = sent.filter(has_text="shelf.png").locator("img")
        await expect(thumbnail).to_have_js_property("naturalWidth", 1)
        link = sent.filter(has_text="hours.txt").get_by_role("link")
        href = await link.evaluate("a => a.href")
        assert href.endswith("/files/0"), href
        saved = await page.request.get(href)
        assert await saved.body() == hours


def one_pixel_png() -> bytes:
    """A PNG a browser draws: one white pixel."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\xff\xff")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


async def test_a_support_lead_approves_a_customers_call_from_the_queue(
    harness: Harness, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a login (a gateway adds each request's bearer token), a support lead's page
    lists the customer's call that waits for a lead, its arguments as text; one click
    approves it, the queue empties, and the customer's turn goes on and writes once."""
    secret = "a-shared-secret-of-at-least-32-bytes"
    monkeypatch.setenv("AGENT_WEB_JWT_SECRET", secret)
    claims = {"sub": "lee", "roles": ["support-lead"], "exp": time.time() + 300}
    lead = {"Authorization": f"Bearer {jwt.encode(claims, secret, algorithm='HS256')}"}
    before = new_returns(harness.store)
    approvals = ApprovalPolicy(approvers={"start_return": "role:support-lead"})
    async with (
        harness.worker(approvals=approvals) as task_queue,
        web_chat(harness.client, task_queue) as url,
    ):
        agents = AgentClient(harness.client, task_queue=task_queue)
        # The reason the model passes on is the customer's text: markup in it stays text.
        marked = RETURN.replace("damaged", "damaged <img src=x onerror=\"document.title='x'\">")
        turn = await agents.start(marked, principal=Principal(user="demo"))
        context = await browser.new_context(extra_http_headers=lead)
        page = await context.new_page()
        await page.goto(url)
        queued = page.get_by_test_id("queued")
        await expect(queued).to_have_count(1, timeout=30_000)
        await expect(queued.locator(".tool")).to_have_text("start_return")
        await expect(queued.locator(".args")).to_contain_text("damaged <img src=x onerror=")
        await expect(queued.locator("img")).to_have_count(0)
        await expect(queued.locator("strong")).to_have_text("demo")
        await queued.get_by_test_id("queue-approve").click()
        await expect(page.get_by_test_id("queue")).to_be_hidden()
        await expect(page.locator("[data-testid=notice].error")).to_have_count(0)
        result = await turn.result()
        await context.close()
    assert "decision start_return: approved by lee" in shown_steps(result)
    (created,) = [r for r in new_returns(harness.store) if r not in before]
    assert created in result.answer


async def test_problems_show_as_a_line_in_the_chat(harness: Harness, page: Page) -> None:
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(f"{url}#chat-demo-00000000")  # no such conversation
        await expect(page.get_by_test_id("notice")).to_contain_text(
            "no conversation chat-demo-00000000"
        )
        await say(page, "Has order 123456 shipped?")  # the next message starts one
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        assert "#chat-demo-" in page.url and "00000000" not in page.url

        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            turn_id = await page.locator("section.turn").first.get_attribute("data-turn")
            decided = await http.post(
                f"/api/turns/{turn_id}/decisions", json={"call_id": "call_1", "approved": True}
            )
            form = await http.post("/api/chats", content="text=hi")
            foreign = await http.post(
                "/api/chats", json={"text": "hi"}, headers={"Origin": "http://evil.example"}
            )
            other = await http.get("/api/chats/chat-bob-12345678/events")
            rebound = await http.get("/", headers={"Host": "evil.example"})

    assert decided.status_code == 409 and "no call awaits approval" in decided.json()["error"]
    assert form.status_code == 415
    assert foreign.status_code == 403
    # Another customer's conversation reads as one that does not exist (never a 404 of its
    # own, which would tell that it does).
    assert other.status_code == 200 and "event: missing" in other.text, other.text
    assert "no conversation chat-bob-12345678 (it ended long ago, or never began)" in other.text
    assert rebound.status_code == 400


# Every text the status line and the chat's notices show, from the page's start.
SHOWN = """
document.addEventListener("DOMContentLoaded", () => {
  window.shown = [];
  const note = (node) => window.shown.push(node.textContent);
  const status = document.getElementById("status");
  new MutationObserver(() => note(status)).observe(status, {
    childList: true, characterData: true, subtree: true,
  });
  new MutationObserver((changes) => {
    for (const c of changes) {
      for (const n of c.addedNodes) if (n.dataset?.testid === "notice") note(n);
    }
  }).observe(document.getElementById("log"), { childList: true, subtree: true });
});
"""


async def test_reopening_a_conversation_never_says_the_server_cannot_be_reached(
    harness: Harness, page: Page
) -> None:
    """A conversation's URL loaded again and again: the page shows the conversation,
    who it chats as and the agent's title, and never a line saying the server cannot
    be reached. Half the loads hold the page's `/api/session` until the conversation
    has shown (its first turn takes the greeting away): the order a reload of an
    ended conversation often took, where the page failed on the missing greeting."""
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, "Has order 123456 shipped?")
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        await page.add_init_script(SHOWN)
        hold = {"session": False}

        async def session(route: Route) -> None:
            if hold["session"]:
                await answer(page, 1).wait_for()
            await route.continue_()

        await page.route("**/api/session", session)
        for n in range(8):
            hold["session"] = n % 2 == 1
            await page.reload()
            await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
            await expect(page.locator("#who")).to_have_text("as customer demo")
            await expect(page.locator("#title")).to_have_text("Assistant")
            await expect(page).to_have_title("Assistant")
            shown: list[str] = await page.evaluate("window.shown")
            assert not [t for t in shown if "cannot be reached" in t], (n, shown)
            await expect(page.locator("[data-testid=notice]")).to_have_count(0)


async def test_a_value_put_to_consent_shows_its_invisible_characters_written_out(
    harness: Harness, page: Page
) -> None:
    """A call awaiting consent whose values hide characters (a right-to-left override
    that makes `ACC-\\u202e987` read "ACC-789", a zero-width space, a no-break space):
    the card writes each out as its escape, marked, and keeps nothing hidden."""
    from durable_agent.model import Reply
    from durable_agent.scripted import ScriptedModel
    from durable_agent.types import ToolCall

    reason = "refund to ACC-\u202e987 for 123\u200b456\u00a0now \u2067x\u2069"
    call = ToolCall(
        id="c1", name="start_return", arguments={"order_id": "123456", "reason": reason}
    )
    model = ScriptedModel(plans=[Reply(calls=[call])], decisions=[Reply(text="Not done.")])
    chat = ConversationInput(customer_id="demo", model="scripted")
    async with (
        harness.worker(model) as task_queue,
        web_chat(harness.client, task_queue, chat) as url,
    ):
        await page.goto(url)
        await say(page, RETURN)
        card = page.locator("[data-kind=approval] .consent")
        shown = card.locator("dd").nth(1)
        await expect(shown).to_have_text(
            r"refund to ACC-\u202e987 for 123\u200b456\u00a0now \u2067x\u2069"
        )
        await expect(shown.locator("mark.hidden-char")).to_have_count(5)
        await expect(shown).to_have_attribute("dir", "ltr")
        text = await card.evaluate("node => node.textContent")
        hidden = [c for c in text if unicodedata.category(c) in ("Cf", "Cc", "Zl", "Zp")]
        assert not hidden and "\u00a0" not in text, text
        await page.get_by_test_id("reject").click()
        await expect(answer(page, 1)).to_have_text("Not done.")


# A worker that writes its answers slowly (a word every 0.25 s), so it can be killed
# while one is being written, even on a busy machine.
SLOW_WORKER = """
import functools, sys
import durable_agent.offline, durable_agent.stream
durable_agent.offline.write_out = functools.partial(durable_agent.stream.write_out, per_word_s=0.25)
from durable_agent.commands import worker
sys.argv = ["worker.py", "--task-queue", sys.argv[1]]
worker.main()
"""


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes started by the test (`start_worker`), killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def start_worker(
    env: WorkflowEnvironment, tmp_path: Path, task_queue: str
) -> subprocess.Popen[bytes]:
    """A slow worker process serving `task_queue`, once it says it is ready."""
    settings = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    settings.update(
        TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such-temporal.toml"),
        AGENT_SHOP_DB=str(tmp_path / "shop.db"),
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as out:  # a file, not a pipe nobody reads: it never fills up
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_WORKER, task_queue],
            cwd=ROOT,
            env=settings,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    while "worker ready" not in log.read_text():
        assert proc.poll() is None, f"the worker exited: {log.read_text()}"
        await asyncio.sleep(0.1)
    return proc


async def test_a_killed_worker_the_page_finishes_the_answer_without_doubled_text(
    env: WorkflowEnvironment, page: Page, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    task_queue = f"web-{uuid.uuid4().hex[:8]}"
    workers.append(await start_worker(env, tmp_path, task_queue))
    async with web_chat(env.client, task_queue) as url:
        await page.goto(url)
        await page.evaluate(RECORDER, "change")
        await say(page, "Has order 123456 shipped?")
        writing = page.get_by_test_id("answer")
        await expect(writing).to_have_text(re.compile("^Yes — order"), timeout=15_000)
        workers[0].kill()  # SIGKILL, while the answer is being written
        workers[0].wait()
        written = await writing.text_content()
        workers.append(await start_worker(env, tmp_path, task_queue))
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER, timeout=30_000)
        shown: list[str] = await page.evaluate("window.seen")
        turn_id = await page.locator("section.turn").first.get_attribute("data-turn")
        assert turn_id
        batches = [
            e async for _, e in turn_events(env.client, turn_id) if isinstance(e, TokensEvent)
        ]

    assert written and written != SHIPPED_ANSWER and SHIPPED_ANSWER.startswith(written)
    # The call was written twice (the second attempt on the new worker); after every
    # batch the page showed a beginning of the answer, never text twice.
    assert {b.attempt for b in batches} == {1, 2}
    assert all(SHIPPED_ANSWER.startswith(text) for text in shown), shown
    assert shown[-1] == SHIPPED_ANSWER


# --- the API alone --------------------------------------------------------------------


async def read_events(url: str, last_id: str | None = None) -> list[tuple[str, str, dict]]:
    """Every (id, event, data) of a conversation's stream, to its end."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events, fields = [], {}
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("GET", url, headers=headers) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith(("retry:", ":")):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif fields:
                events.append((fields.get("id", ""), fields["event"], json.loads(fields["data"])))
                fields = {}
    return events


async def test_a_reconnecting_reader_resumes_exactly_where_it_was(harness: Harness) -> None:
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = await http.post("/api/chats", json={"text": "Has order 123456 shipped?"})
            assert first.status_code == 201, first.text
            chat_id, turn_id = first.json()["chat_id"], first.json()["turn_id"]
            await harness.client.get_workflow_handle(turn_id).result()
            second = await http.post(f"/api/chats/{chat_id}/messages", json={"text": "Thanks!"})
            assert second.status_code == 202, second.text
            await harness.client.get_workflow_handle(second.json()["turn_id"]).result()
            await harness.client.get_workflow_handle(chat_id).signal("end")
        stream = f"{url}api/chats/{chat_id}/events"
        everything = await read_events(stream)
        kinds = [name for _, name, _ in everything]
        assert kinds[0] == "turn" and kinds[-1] == "ended"
        assert kinds.count("turn") == kinds.count("done") == kinds.count("answered") == 2
        ids = [i for i, _, _ in everything]
        assert len(set(ids)) == len(ids)
        # Any event as the last one read (each kind of place; one mid-answer): the
        # rest, exactly.
        places = {kinds.index("step"), kinds.index("tokens") + 1}
        places |= {k for k, name in enumerate(kinds[:-1]) if name in ("turn", "done", "answered")}
        for k in sorted(places):
            assert await read_events(stream, ids[k]) == everything[k + 1 :], ids[k]


async def test_the_web_chat_answers_from_an_mcp_servers_tool(harness: Harness, page: Page) -> None:
    """A real MCP server (mcp-server-time, over stdio) plugged into an agent: asked in
    the web chat, the turn calls its tool and answers from what it said."""
    from durable_agent.mcp import connected
    from durable_agent.model import Reply
    from durable_agent.scripted import ScriptedModel
    from durable_agent.types import ToolCall
    from tests.conftest import last_result
    from tests.test_mcp import TIME, agent_with

    paris = ToolCall(id="c1", name="time__get_current_time", arguments={"timezone": "Europe/Paris"})
    model = ScriptedModel(
        plans=[Reply(calls=[paris])],
        decisions=[lambda req: Reply(text="The time server says: " + last_result(req))],
    )
    chat = ConversationInput(customer_id="demo", model="scripted")
    async with (
        connected([agent_with(TIME)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
        web_chat(harness.client, task_queue, chat) as url,
    ):
        await page.goto(url)
        await say(page, "What time is it in Paris?")
        await expect(answer(page, 1)).to_contain_text("The time server says:", timeout=30_000)
        await expect(answer(page, 1)).to_contain_text("Europe/Paris")
        steps = await step_texts(page)
    assert any("time__get_current_time" in s for s in steps), steps


async def test_the_web_command_serves_an_agent_whose_definition_names_an_mcp_server(
    env: WorkflowEnvironment, page: Page, tmp_path: Path
) -> None:
    """`durable-agent web --agent mypkg.agents:desk` from a user's folder, the agent's
    definition naming a real MCP server: the command's own worker connects it, and the
    offline model answers the page's question from the server's tool."""
    from tests.test_mcp import TIME, command_environ, user_folder

    port = free_port()
    command = [str(Path(sys.executable).parent / "durable-agent"), "--task-queue"]
    web = subprocess.Popen(
        [*command, f"web-{uuid.uuid4().hex[:8]}", "web", "--agent", "mypkg.agents:desk"]
        + ["--port", str(port)],
        cwd=user_folder(tmp_path, TIME),
        env=command_environ(env, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert web.stdout is not None
        said = await asyncio.to_thread(web.stdout.readline)
        assert said.startswith("web chat for customer"), said + web.stdout.read()
        await page.goto(f"http://127.0.0.1:{port}/")
        await say(page, "What is the current time in Asia/Tokyo?")
        await expect(answer(page, 1)).to_contain_text('"timezone": "Asia/Tokyo"', timeout=60_000)
        steps = await step_texts(page)
    finally:
        web.terminate()
        await asyncio.to_thread(web.wait, 30)
    assert any("time__get_current_time" in s for s in steps), steps


async def test_a_typed_answer_reads_as_a_card_of_its_fields(harness: Harness, page: Page) -> None:
    class Slot(BaseModel):
        slot_id: str
        time: str
        doctor: str

    value = {"slot_id": "s-17", "time": "2026-12-01 09:30", "doctor": "<img src=x onerror=boom()>"}
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="o1", name=OUTPUT_TOOL, arguments=value)])]
    )
    typed = replace(harness.agent(), output_type=Slot, model="scripted")
    async with (
        harness.worker(model, agents=[typed]) as task_queue,
        web_chat(harness.client, task_queue) as url,
    ):
        await page.goto(url)
        await say(page, "Book me the first slot with a doctor")
        card = answer(page, 1).get_by_test_id("card")
        await expect(card.locator("dt")).to_have_text(["slot id", "time", "doctor"])
        await expect(card.locator("dd")).to_have_text(list(value.values()))  # as text
        await expect(page.locator("img")).to_have_count(0)
        await expect(answer(page, 1)).to_have_attribute("data-outcome", "answered")


async def test_a_fork_of_a_turn_shows_by_itself_with_its_parent_and_step(
    harness: Harness, page: Page
) -> None:
    """A fork is in no conversation: the page shows it by itself (`?turn=ID`), and the
    operator's view heads it with the turn and step it was forked from, the parent a
    link to its own page."""
    async with harness.worker() as task_queue, web_chat(harness.client, task_queue) as url:
        await page.goto(url)
        await say(page, "Has order 123456 shipped?")
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        parent = await page.locator("section.turn").first.get_attribute("data-turn")
        assert parent
        fork = await AgentClient(harness.client, task_queue=task_queue).rerun(parent, from_step=1)
        await fork.result()

        await page.goto(f"{url}?turn={fork.id}")
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        await expect(page.locator("section.turn .bubble.you")).to_have_text(
            "Has order 123456 shipped?"
        )
        await expect(page.get_by_test_id("message")).to_be_hidden()  # nothing to send
        origin = page.get_by_test_id("origin")
        await expect(origin).to_be_hidden()  # the operator's view only
        await page.locator("#show-checks").check()
        await expect(origin).to_have_text(f"fork of {parent} from step 1")
        await expect(page.locator("section.turn .meta")).to_contain_text(fork.id)
        recorded = page.locator("[data-testid=step][data-kind=recorded]")
        await expect(recorded).to_have_text(
            [
                "from the record order_status(order_id='123456'): read from the record of "
                f"{parent} (step 1)"
            ]
        )

        await origin.get_by_role("link").click()  # the parent, by itself
        await expect(page).to_have_url(f"{url}?turn={parent}")
        await expect(answer(page, 1)).to_have_text(SHIPPED_ANSWER)
        await expect(page.locator("section.turn .meta")).to_contain_text(parent)
        await expect(origin).to_have_count(0)

        await page.goto(f"{url}?turn=turn-someone-else-1")
        await expect(page.get_by_test_id("notice")).to_have_text(
            "no turn turn-someone-else-1 of customer demo"
        )


async def test_a_recalled_memory_shows_in_its_words_as_text(harness: Harness, page: Page) -> None:
    """A turn that recalled a memory (recorded `[memory mem_…]`) shows it in the words its
    customer told, markup and all printed as text."""
    fact = "My cat is called <b>Tom</b>"
    model = ScriptedModel(plans=[keeper_plan], decisions=[lambda _: Reply(text="done")])
    concierge = Agent(
        name="concierge",
        model="scripted",
        models={"scripted": lambda _: model},
        memory=MemorySettings(name=f"web-{uuid.uuid4().hex[:8]}", recall=0),
    )
    async with (
        harness.worker(agents=[concierge]) as task_queue,
        web_chat(harness.client, task_queue, agent=concierge) as url,
    ):
        await page.goto(url)
        await say(page, f"Please remember: {fact}")
        await expect(answer(page, 1)).to_have_text("done")
        await say(page, "Look up: cat")
        await expect(answer(page, 2)).to_have_text("done")
        recalled = page.locator("section.turn").nth(1).locator("[data-kind=observation] pre")
        await expect(recalled).to_contain_text(f"): {fact}")
        await expect(recalled).not_to_contain_text("[memory mem_")
        await expect(page.locator("#log b")).to_have_count(0)  # no markup made of it
