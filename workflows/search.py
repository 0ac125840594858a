"""Search attributes: how turns and conversations are found, in the Web UI and by
`client.py list` / `pending`.

    AgentCustomer      Keyword      who asked (set at start)
    AgentModel         Keyword      the model spec the worker used
    AgentStatus        Keyword      running | awaiting_approval | done
    AgentOutcome       Keyword      answered, step_limit, ... (when done)
    AgentTools         KeywordList  the tools that ran
    AgentConversation  Keyword      the conversation a turn belongs to
    AgentName          Keyword      the agent that answers (named at start if the caller
                                    named it; the worker's resolution when it ends)
    AgentFingerprint   Keyword      a hash of that agent's instructions and tool schemas
    AgentForkOf        Keyword      the turn a fork was made of (`client.py rerun`)
    AgentSchedule      Keyword      the schedule that started the turn (`durable_agent.schedules`)
    AgentTenant        Keyword      the tenant of who asked (`durable_agent.Principal`;
                                    `default` for a customer named alone); its user is
                                    AgentCustomer (the dev server takes at most ten
                                    Keyword attributes: this is the tenth)

A turn's memo holds one entry, `pending`: the calls awaiting a decision (a list of
`PendingApproval`), readable without a worker.

The client sets the first ones when it starts a workflow, and only when the
namespace has them registered; a workflow upserts the rest only if it was
started with them, so a server without them still runs every turn.
"""

from __future__ import annotations

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)

from durable_agent.principal import DEFAULT_TENANT, Principal

CUSTOMER = SearchAttributeKey.for_keyword("AgentCustomer")
MODEL = SearchAttributeKey.for_keyword("AgentModel")
STATUS = SearchAttributeKey.for_keyword("AgentStatus")
OUTCOME = SearchAttributeKey.for_keyword("AgentOutcome")
TOOLS = SearchAttributeKey.for_keyword_list("AgentTools")
CONVERSATION = SearchAttributeKey.for_keyword("AgentConversation")
AGENT = SearchAttributeKey.for_keyword("AgentName")
FINGERPRINT = SearchAttributeKey.for_keyword("AgentFingerprint")
FORK_OF = SearchAttributeKey.for_keyword("AgentForkOf")
SCHEDULE = SearchAttributeKey.for_keyword("AgentSchedule")
TENANT = SearchAttributeKey.for_keyword("AgentTenant")

PENDING_MEMO = "pending"
"""The memo entry of a turn's calls awaiting a decision (also the patch that added it)."""
QUESTIONS_MEMO = "questions"
"""The memo entry of an MCP server's questions awaiting a person's answer
(`durable_agent.elicitation`): `pending` lists them with no worker running."""

ALL: tuple[SearchAttributeKey, ...] = (
    CUSTOMER,
    MODEL,
    STATUS,
    OUTCOME,
    TOOLS,
    CONVERSATION,
    AGENT,
    FINGERPRINT,
    FORK_OF,
    SCHEDULE,
    TENANT,
)

RUNNING = "running"
AWAITING_APPROVAL = "awaiting_approval"
WAITING = "waiting"
"""On a `wait` or `wait_for_event` (`durable_agent.waits`), and no call awaits consent."""
DONE = "done"


def at_start(
    customer_id: str,
    model: str,
    conversation_id: str = "",
    agent: str | None = "",
    principal: Principal | None = None,
) -> TypedSearchAttributes:
    """What a turn or conversation is started with (`model` empty: the worker's default,
    filled in by the workflow once known; `agent` empty: the worker's first, named by
    the turn when it knows; None: no AgentName, for a parent started without one;
    `principal`: who asks, else the customer in the default tenant)."""
    tenant = principal.tenant if principal is not None else DEFAULT_TENANT
    pairs: list[SearchAttributePair] = [
        SearchAttributePair(CUSTOMER, customer_id),  # a principal's user
        SearchAttributePair(STATUS, RUNNING),
        SearchAttributePair(TENANT, tenant),
    ]
    if agent is not None:
        pairs.append(SearchAttributePair(AGENT, agent))
    if model:
        pairs.append(SearchAttributePair(MODEL, model))
    if conversation_id:
        pairs.append(SearchAttributePair(CONVERSATION, conversation_id))
    return TypedSearchAttributes(pairs)


def within(
    attributes: TypedSearchAttributes, started: TypedSearchAttributes
) -> TypedSearchAttributes:
    """`attributes` for a child of a workflow `started` with these: without the tenant
    when it had none, as its namespace may not have it (registered before it existed)."""
    if TENANT in started:
        return attributes
    kept = [p for p in attributes.search_attributes if p.key != TENANT]
    return TypedSearchAttributes(kept)


def dev_server_args() -> list[str]:
    """`temporal server start-dev` flags that register them on the dev server."""
    kinds = {CUSTOMER.indexed_value_type: "Keyword", TOOLS.indexed_value_type: "KeywordList"}
    args: list[str] = []
    for key in ALL:
        args += ["--search-attribute", f"{key.name}={kinds[key.indexed_value_type]}"]
    return args


def create_command(names: list[str] | None = None) -> str:
    """The `temporal` command that registers them on another server."""
    wanted = [k for k in ALL if names is None or k.name in names]
    parts = []
    for key in wanted:
        kind = "KeywordList" if key is TOOLS else "Keyword"
        parts.append(f"--name {key.name} --type {kind}")
    return "temporal operator search-attribute create " + " ".join(parts)
