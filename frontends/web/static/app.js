// The web chat's page. It reads its conversation as server-sent events (app.py,
// events.py): each turn's steps as they are recorded, its text as the model writes
// it, its outcome. A page (or a reload, or a second tab) reads the conversation
// from the start into an empty log, so nothing shows twice; EventSource resumes a
// dropped connection from its last event id by itself. Every text from the model,
// a tool or a person goes in with textContent, never as HTML; in a call put to a
// person for consent, characters that show nothing or reorder the text around them
// are written out (`visible`). With `?turn=ID` it shows that one turn of the
// customer's instead (a fork of a turn, which no conversation shows), headed in the
// operator's view by the turn and step it was forked from.
"use strict";

const log = document.getElementById("log");
const input = document.getElementById("message");
const statusLine = document.getElementById("status");
const turnsBox = el("div", { class: "turns" });
const pendingBox = el("div", { class: "pending" });
log.append(turnsBox, pendingBox);

const LABELS = {
  plan: "plans",
  continue: "continues",
  tool_call: "calls",
  observation: "result",
  approval: "asks you",
  decision: "decided",
  question: "a server asks you",
  sample: "a server asks the model",
  shield: "check",
  rejected: "invalid call",
  fallback: "switches model",
  recorded: "from the record",
  changed: "changed since",
  wait: "waits",
};

const chat = { id: null, source: null, turns: new Map() };
let sending = Promise.resolve();
let leaving = false; // the page is being left (a reload): its requests are cut, not failing

/** Characters that show nothing, or change how the text around them shows: format
 *  characters (bidirectional controls such as U+202E, zero-width ones such as U+200B),
 *  controls, line and paragraph separators, spaces other than the plain one, private
 *  use, lone surrogates, unassigned code points, and the Hangul fillers. */
const HIDDEN = /[\p{Cf}\p{Cc}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}\u115f\u1160\u3164\uffa0]|(?! )\p{Zs}/gu;

/** `text` as nodes a person can read as it is: each hidden character written out as
 *  its escape (`\u202e`), marked, with its code point as a tooltip. "ACC-\u202e987"
 *  shows as ACC-\u202e987, never as "ACC-789". */
function visible(text) {
  const nodes = [];
  let last = 0;
  for (const found of text.matchAll(HIDDEN)) {
    if (found.index > last) nodes.push(text.slice(last, found.index));
    const code = found[0].codePointAt(0);
    const hex = code.toString(16).toUpperCase().padStart(4, "0");
    const escape = code > 0xffff ? `\\u{${hex.toLowerCase()}}` : `\\u${hex.toLowerCase()}`;
    const title = `an invisible or reordering character, U+${hex}`;
    nodes.push(el("mark", { class: "hidden-char", title }, escape));
    last = found.index + found[0].length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

/** An element with its children; strings become text nodes. */
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

/** What the models of a turn are writing, one draft per model call. A call that
 *  fails and is retried writes again from the start: its later attempt replaces
 *  the draft, so no text shows twice (agent/stream.py: Drafts). */
class Drafts {
  constructor() {
    this.attempts = new Map();
    this.texts = new Map();
  }

  add(batch) {
    const seen = this.attempts.get(batch.call);
    if (seen !== undefined && batch.attempt < seen) return "stale";
    const change =
      seen === undefined ? "started" : batch.attempt > seen ? "restarted" : "continued";
    if (change !== "continued") {
      this.attempts.set(batch.call, batch.attempt);
      this.texts.set(batch.call, "");
    }
    this.texts.set(batch.call, this.texts.get(batch.call) + batch.text);
    return change;
  }

  text(call) {
    return this.texts.get(call) ?? "";
  }
}

/** One turn on the page: the question, its steps, its answer, its history link. */
class Turn {
  constructor(event) {
    this.id = event.turn_id;
    this.drafts = new Drafts();
    this.answered = false; // the turn recorded its answer
    this.outcome = null; // and ended so
    this.waiting = []; // approvals not decided yet: {call, actions}
    this.asking = new Map(); // questions not answered yet: id -> their form
    this.steps = el("ol", { class: "steps" });
    this.answer = null;
    this.meta = el("div", { class: "meta" }, this.id);
    if (event.origin) this.meta.append(" · ", originNode(event.origin));
    if (event.url) {
      const title = "this turn's workflow history in the Temporal Web UI";
      const link = el("a", { href: event.url, target: "_blank", rel: "noopener", title }, "history ↗");
      this.meta.append(" · ", link);
    }
    this.node = el(
      "section",
      { class: "turn", "data-turn": this.id },
      el("div", { class: "bubble you" }, event.question, filesNode(event.files ?? [], [], this.id)),
      this.steps,
      this.meta,
    );
  }

  step(step) {
    if (step.kind === "answer") return this.finish(step.text);
    if (step.kind === "limit") return; // its answer comes with `done`
    // Text a model wrote before asking for tools is part of this step's text.
    if (step.kind === "plan" || step.kind === "continue") this.dropDraft();
    if (step.kind === "decision") this.decided(step);
    if (step.kind === "question" && !step.calls.length) this.answered(step);
    this.steps.append(this.stepNode(step));
  }

  stepNode(step) {
    const node = el("li", {
      class: `step ${step.kind}`,
      "data-testid": "step",
      "data-kind": step.kind,
    });
    const label = el("span", { class: "kind" }, LABELS[step.kind] ?? step.kind);
    if (step.kind === "observation") {
      const summary = el("summary", {}, label, " ", el("span", { class: "gist" }, step.text));
      node.append(el("details", {}, summary, el("pre", {}, step.text)));
      if (step.observation && !step.observation.ok) node.classList.add("failed");
    } else if (step.kind === "approval" && step.calls.length) {
      node.append(label, " ", this.approvalNode(step));
    } else if (step.kind === "question" && step.calls.length) {
      node.append(label, " ", this.questionNode(step));
    } else {
      const code = ["plan", "continue", "tool_call", "rejected"].includes(step.kind);
      node.append(label, " ", el(code ? "code" : "span", { class: "text" }, step.text));
      // Routine checks that let everything through stay in small print.
      const routine = step.kind === "shield" && step.text.includes(": allowed by ");
      if (routine) node.classList.add("quiet");
    }
    return node;
  }

  approvalNode(step) {
    const call = step.calls[0];
    const why = step.text.split(" awaits approval: ")[1] ?? step.text;
    const args = argsNode(call.arguments);
    const button = (name, label) =>
      el("button", { type: "button", class: name, "data-testid": name }, label);
    const approve = button("approve", "Approve");
    const reject = button("reject", "Reject");
    const actions = el("div", { class: "actions" }, approve, reject);
    approve.addEventListener("click", () => this.decide(call, true, actions));
    reject.addEventListener("click", () => this.decide(call, false, actions));
    this.waiting.push({ call, actions });
    return el(
      "div",
      { class: "consent" },
      el("div", { class: "tool", dir: "ltr" }, ...visible(call.name)),
      args,
      el("p", { class: "why" }, ...visible(why)),
      actions,
    );
  }

  async decide(call, approved, actions) {
    for (const button of actions.querySelectorAll("button")) button.disabled = true;
    try {
      const path = `/api/turns/${encodeURIComponent(this.id)}/decisions`;
      await post(path, { call_id: call.id, approved });
    } catch (error) {
      notice(`Could not ${approved ? "approve" : "reject"} ${call.name}: ${error.message}`, "error");
      for (const button of actions.querySelectorAll("button")) button.disabled = false;
    }
  }

  /** An MCP server's question (`durable_agent.elicitation`): its message, then a form
   *  drawn from the schema it asked with (flat: text, number, yes/no, a choice), or
   *  its URL and the domain to check; answered as accept, decline or cancel. The
   *  question itself is read from the turn (the step names it). */
  questionNode(step) {
    const id = (step.text.match(/ asks \(([^)]*)\): /) ?? [])[1] ?? "";
    const box = el("form", { class: "consent question", "data-testid": "question" });
    box.append(el("p", { class: "why" }, ...visible(step.text)));
    if (!id) return box;
    this.asking.set(id, box);
    get(`/api/turns/${encodeURIComponent(this.id)}/questions`)
      .then(({ questions }) => {
        const question = questions.find((q) => q.id === id);
        if (question && this.asking.has(id)) this.fillQuestion(box, question);
      })
      .catch((error) => notice(`Could not read the question: ${error.message}`, "error"));
    return box;
  }

  fillQuestion(box, question) {
    box.replaceChildren(
      el("div", { class: "tool", dir: "ltr" }, ...visible(`${question.server}: ${question.tool}`)),
      el("p", { class: "why" }, ...visible(question.message)),
    );
    const fields = [];
    if (question.mode === "url") {
      box.append(
        el("p", {}, "Opens ", el("strong", { dir: "ltr" }, ...visible(question.domain)), ": "),
        el("a", { href: question.url, target: "_blank", rel: "noopener noreferrer" }, ...visible(question.url)),
      );
    } else {
      const schema = question.requested_schema ?? { properties: {} };
      const required = new Set(schema.required ?? []);
      for (const [name, prop] of Object.entries(schema.properties ?? {})) {
        const title = prop.title ?? name;
        let input;
        if (Array.isArray(prop.enum)) {
          input = el("select", { name });
          for (const option of prop.enum) input.append(el("option", { value: option }, String(option)));
        } else if (prop.type === "boolean") {
          input = el("input", { type: "checkbox", name });
          if (prop.default === true) input.checked = true;
        } else {
          const number = prop.type === "number" || prop.type === "integer";
          input = el("input", { type: number ? "number" : "text", name, dir: "ltr" });
          if (prop.type === "integer") input.step = "1";
          if (prop.default !== undefined) input.value = String(prop.default);
        }
        input.dataset.testid = `field-${name}`;
        fields.push({ name, prop, input, required: required.has(name) });
        const label = el("label", {}, ...visible(title), required.has(name) ? " *" : "", " ", input);
        if (prop.description) label.title = prop.description;
        box.append(el("div", { class: "field" }, label));
      }
    }
    const button = (name, label, type = "button") =>
      el("button", { type, class: name, "data-testid": name }, label);
    const accept = button("accept", question.mode === "url" ? "Done" : "Send", "submit");
    const decline = button("decline", "Decline");
    const cancel = button("cancel", "Not now");
    box.append(el("div", { class: "actions" }, accept, decline, cancel));
    box.addEventListener("submit", (event) => {
      event.preventDefault();
      this.reply(question, "accept", box, question.mode === "url" ? null : contentOf(fields));
    });
    decline.addEventListener("click", () => this.reply(question, "decline", box));
    cancel.addEventListener("click", () => this.reply(question, "cancel", box));
  }

  async reply(question, action, box, content = null) {
    const buttons = box.querySelectorAll("button");
    for (const button of buttons) button.disabled = true;
    try {
      const path = `/api/turns/${encodeURIComponent(this.id)}/answers`;
      await post(path, { question_id: question.id, action, content });
    } catch (error) {
      notice(`Could not answer ${question.server}: ${error.message}`, "error");
      for (const button of buttons) button.disabled = false;
    }
  }

  /** The step that says a question was answered (or timed out): its form goes. */
  answered(step) {
    for (const [id, box] of this.asking) {
      if (step.text.includes(`: ${id}: `)) {
        box.querySelector(".actions")?.remove();
        for (const input of box.querySelectorAll("input, select")) input.disabled = true;
        this.asking.delete(id);
      }
    }
  }

  /** A decision step carries its call (turns recorded before it did: its tool's name). */
  decided(step) {
    const call = step.calls?.[0];
    const index = this.waiting.findIndex((w) =>
      call ? w.call.id === call.id : step.text.startsWith(`${w.call.name}: `),
    );
    if (index >= 0) this.waiting.splice(index, 1)[0].actions.remove();
  }

  tokens(batch) {
    if (this.answered || this.drafts.add(batch) === "stale") return;
    const node = this.answerNode();
    node.textContent = this.drafts.text(batch.call);
    node.dataset.state = "writing";
  }

  /** The answer the turn recorded replaces whatever draft was showing. */
  finish(text, outcome) {
    const node = this.answerNode();
    node.textContent = text;
    node.dataset.state = "final";
    this.answered = true;
    if (outcome) {
      this.outcome = outcome;
      node.dataset.outcome = outcome;
      if (outcome !== "answered") node.classList.add("unanswered");
      for (const w of this.waiting.splice(0)) w.actions.remove();
      for (const box of this.asking.values()) box.querySelector(".actions")?.remove();
      this.asking.clear();
    }
  }

  done(event) {
    this.finish(event.answer, event.outcome);
    // A typed turn's value (an object, a list) reads as a card of its fields.
    if (event.output !== null && typeof event.output === "object") {
      this.answerNode().replaceChildren(valueCard(event.output));
      this.answerNode().classList.add("typed");
    }
  }

  answerNode() {
    if (!this.answer) {
      this.answer = el("div", { class: "bubble agent", "data-testid": "answer" });
      this.node.insertBefore(this.answer, this.meta);
    }
    return this.answer;
  }

  dropDraft() {
    if (this.answer && !this.answered) {
      this.answer.remove();
      this.answer = null;
    }
  }
}

/** A call's arguments as a person deciding reads them: each name and value whole,
 *  isolated, left to right, and every hidden character in them (keys of nested objects
 *  too) written out. */
function argsNode(args) {
  const node = el("dl", { class: "args" });
  for (const [name, value] of Object.entries(args)) {
    const shown = typeof value === "string" ? value : JSON.stringify(value);
    node.append(el("dt", { dir: "ltr" }, ...visible(name)), el("dd", { dir: "ltr" }, ...visible(shown)));
  }
  return node;
}

/** A form's fields as the answer's content: numbers as numbers, yes/no as booleans,
 *  an empty optional field left out (the server's schema says what it needs). */
function contentOf(fields) {
  const content = {};
  for (const { name, prop, input, required } of fields) {
    if (prop.type === "boolean") {
      content[name] = input.checked;
    } else if (input.value === "" && !required) {
      continue;
    } else if (prop.type === "number" || prop.type === "integer") {
      content[name] = input.value === "" ? null : Number(input.value);
    } else {
      content[name] = input.value;
    }
  }
  return content;
}

/** What a fork was made of, `fork of <parent> from step N`, its parent a link to the
 *  parent's own page (a replay: `replay of <parent>`). */
function originNode(origin) {
  const parent = el("a", { href: `?turn=${encodeURIComponent(origin.parent)}` }, origin.parent);
  const [before, ...after] = origin.line.split(origin.parent);
  const rest = after.join(origin.parent);
  return el("span", { class: "origin", "data-testid": "origin" }, before, parent, rest);
}

/** A value as a card: an object's fields as names and values, a list's items one
 *  under the other; every value goes in as text. */
function valueCard(value) {
  if (Array.isArray(value)) {
    return el("ol", { class: "card-list" }, ...value.map((v) => el("li", {}, valueCard(v))));
  }
  if (value === null || typeof value !== "object") {
    return el("span", {}, value === null ? "—" : String(value));
  }
  const card = el("dl", { class: "card", "data-testid": "card" });
  for (const [name, field] of Object.entries(value)) {
    card.append(el("dt", {}, name.replaceAll("_", " ")), el("dd", {}, valueCard(field)));
  }
  return card;
}

// --- the conversation's events ---------------------------------------------------

/** Read the events at `path` (a conversation's, or one turn's) into the page; returns
 *  `on`, to handle more of them. */
function read(path) {
  chat.source?.close();
  const source = new EventSource(path);
  chat.source = source;
  const on = (name, handle) =>
    source.addEventListener(name, (event) => {
      const stick = nearBottom();
      status("");
      handle(JSON.parse(event.data));
      if (stick) window.scrollTo(0, document.body.scrollHeight);
    });
  on("turn", startTurn);
  on("step", (e) => turnOf(e).step(e.step));
  on("tokens", (e) => turnOf(e).tokens(e));
  on("done", (e) => turnOf(e).done(e));
  on("answered", (e) => {
    // Normally `done` came first; a turn that ended without one (terminated) did not.
    const turn = turnOf(e);
    if (!turn.outcome) turn.finish(e.answer, e.outcome);
  });
  on("problem", (e) => notice(e.message, "error"));
  source.addEventListener("open", () => status(""));
  source.addEventListener("error", () => {
    if (leaving) return;
    status(source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting…");
  });
  return on;
}

function listen() {
  const on = read(`/api/chats/${encodeURIComponent(chat.id)}/events`);
  on("ended", () => {
    stop(); // the URL keeps naming it: a reload shows it again
    notice("This conversation has ended; your next message starts a new one.");
  });
  on("missing", (e) => {
    stop();
    history.replaceState(null, "", location.pathname); // forget the name in the URL
    notice(`${e.message}; your next message starts a new conversation.`, "error");
  });
}

/** One turn by itself, read to its end; nothing is sent from this page. */
function view(turnId) {
  document.body.classList.add("one-turn");
  const on = read(`/api/turns/${encodeURIComponent(turnId)}/events`);
  on("ended", stop);
  on("missing", (e) => {
    stop();
    notice(e.message, "error");
  });
}

/** Stop reading: the next message starts a new conversation. */
function stop() {
  chat.source?.close();
  chat.source = null;
  chat.id = null;
}

function startTurn(event) {
  document.querySelector(".hello")?.remove();
  const turn = new Turn(event);
  chat.turns.set(turn.id, turn);
  turnsBox.append(turn.node);
  // The message this turn answers no longer waits.
  const waiting = [...pendingBox.children].find((b) => b.dataset.text === event.question.trim());
  waiting?.remove();
}

function turnOf(event) {
  if (!chat.turns.has(event.turn_id)) startTurn({ turn_id: event.turn_id, question: "" });
  return chat.turns.get(event.turn_id);
}

// --- a lead's queue ------------------------------------------------------------------

// The calls of other people's turns that wait for this principal's decision (a support
// lead's: app.py /api/approvals), above the chat; their own turns' calls wait in the
// chat itself. Everything shown is text the model or the customer chose: each goes in
// as text nodes, hidden characters written out (`visible`).
const QUEUE_EVERY_MS = 5000;
const queue = document.getElementById("queue");
const queueCalls = document.getElementById("queue-calls");
let queueShown = ""; // what the queue shows, to redraw it only when it changes

async function refreshQueue(me) {
  let approvals;
  try {
    ({ approvals } = await get("/api/approvals"));
  } catch (error) {
    if (!leaving) status(`the queue cannot be read: ${error.message}`);
    return;
  }
  const others = approvals.filter((a) => a.asked_by !== me);
  const now = JSON.stringify(others);
  if (now === queueShown) return;
  queueShown = now;
  queueCalls.replaceChildren(...others.map((a) => queuedNode(a, me)));
  queue.hidden = others.length === 0;
}

function queuedNode(waiting, me) {
  const call = waiting.call;
  const button = (name, label) =>
    el("button", { type: "button", class: name, "data-testid": `queue-${name}` }, label);
  const approve = button("approve", "Approve");
  const reject = button("reject", "Reject");
  const actions = el("div", { class: "actions" }, approve, reject);
  const decide = async (approved) => {
    for (const b of actions.querySelectorAll("button")) b.disabled = true;
    try {
      const path = `/api/turns/${encodeURIComponent(waiting.turn_id)}/decisions`;
      await post(path, { call_id: call.id, approved });
    } catch (error) {
      notice(`Could not ${approved ? "approve" : "reject"} ${call.name}: ${error.message}`, "error");
      for (const b of actions.querySelectorAll("button")) b.disabled = false;
    }
    await refreshQueue(me);
  };
  approve.addEventListener("click", () => decide(true));
  reject.addEventListener("click", () => decide(false));
  const since = new Date(waiting.since);
  return el(
    "li",
    { class: "consent queued", "data-testid": "queued", "data-turn": waiting.turn_id },
    el("div", { class: "tool", dir: "ltr" }, ...visible(call.name)),
    argsNode(call.arguments), // whole: what is approved is all of it
    el(
      "p",
      { class: "meta" },
      "asked by ",
      el("strong", { dir: "ltr" }, ...visible(waiting.asked_by)),
      " in ",
      el("span", { dir: "ltr" }, ...visible(waiting.turn_id)),
      ", waiting since ",
      el("time", { datetime: waiting.since }, since.toLocaleString()),
    ),
    el("p", { class: "why" }, ...visible(waiting.why)),
    actions,
  );
}

function watchQueue(me) {
  refreshQueue(me);
  setInterval(() => document.hidden || refreshQueue(me), QUEUE_EVERY_MS);
}

// --- sending ---------------------------------------------------------------------

// A message's files: chosen with the button, dropped on the page or pasted into the
// message; sent with it as base64 in its JSON (app.py: _files), where the server and
// the worker check what each really is and whether the agent takes it.
const MAX_FILES = 20;
const chosenBox = document.getElementById("chosen");
const chosen = [];

function choose(files) {
  for (const file of files) {
    if (chosen.length >= MAX_FILES) {
      notice(`At most ${MAX_FILES} files a message: ${file.name} was left out.`, "error");
      continue;
    }
    chosen.push(file);
  }
  showChosen();
}

function showChosen() {
  chosenBox.replaceChildren(
    ...chosen.map((file, i) => {
      const remove = el("button", { type: "button", title: `remove ${file.name}` }, "×");
      remove.addEventListener("click", () => {
        chosen.splice(i, 1);
        showChosen();
      });
      return fileChip(file.name, file, remove);
    }),
  );
}

/** A file's name, with a thumbnail of the sender's own copy when it is an image. */
function fileChip(name, file = null, ...rest) {
  const chip = el("span", { class: "file", "data-testid": "file", title: name });
  if (file?.type.startsWith("image/")) {
    chip.append(el("img", { src: URL.createObjectURL(file), alt: "" }));
  }
  chip.append(name, ...rest);
  return chip;
}

// A name says what its file is: the server refused any whose bytes say otherwise.
const IMAGE_NAME = /\.(png|jpe?g|gif|webp)$/i;

/** A file of a turn's message as the server keeps it (app.py: attachment): an image as
 *  a thumbnail, any other file as a link that saves it. Served with no header to send:
 *  the page has no token of its own (one local user, or a gateway that adds it). */
function storedChip(name, turnId, n) {
  const src = `/api/turns/${encodeURIComponent(turnId)}/files/${n}`;
  const chip = el("span", { class: "file", "data-testid": "file", title: name });
  if (IMAGE_NAME.test(name)) {
    chip.append(el("img", { src, alt: "" }), name);
  } else {
    chip.append(el("a", { href: src, download: name, rel: "noopener" }, name));
  }
  return chip;
}

/** A message's files: the sender's own copies while it waits (`files`), the server's
 *  once its turn has started (`turnId`). */
function filesNode(names, files = [], turnId = null) {
  if (!names.length) return "";
  const chip = (name, i) => (turnId ? storedChip(name, turnId, i) : fileChip(name, files[i]));
  return el("div", { class: "files" }, ...names.map(chip));
}

/** The file's bytes as base64 (a data: URL's payload). */
function base64Of(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] ?? "");
    reader.onerror = () => reject(new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
}

function submit(event) {
  event.preventDefault();
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  grow();
  const files = chosen.splice(0);
  showChosen();
  document.querySelector(".hello")?.remove();
  const names = files.map((f) => f.name);
  const attributes = { class: "bubble you waiting", "data-text": text };
  const bubble = el("div", attributes, text, filesNode(names, files));
  pendingBox.append(bubble);
  window.scrollTo(0, document.body.scrollHeight);
  // One at a time, first come first served: the first message creates the conversation the
  // next ones go to.
  sending = sending.then(() => deliver(text, bubble, files));
}

async function deliver(text, bubble, files = []) {
  try {
    const message = { text };
    if (files.length) {
      message.files = await Promise.all(
        files.map(async (file) => ({ name: file.name, data: await base64Of(file) })),
      );
    }
    if (chat.id) {
      try {
        await post(`/api/chats/${encodeURIComponent(chat.id)}/messages`, message);
        return;
      } catch (error) {
        if (error.status !== 410) throw error;
        stop();
        notice("That conversation had ended; this message starts a new one.");
      }
    }
    const started = await post("/api/chats", message);
    chat.id = started.chat_id;
    history.replaceState(null, "", `${location.pathname}#${chat.id}`);
    listen();
  } catch (error) {
    bubble.remove();
    notice(`Not sent (${text}): ${error.message}`, "error");
  }
}

async function get(path) {
  let response;
  try {
    response = await fetch(path);
  } catch {
    throw Object.assign(new Error("the chat server cannot be reached"), { status: 0 });
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error ?? `${response.status} ${response.statusText}`);
  return data;
}

async function post(path, body) {
  let response;
  try {
    response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch {
    throw Object.assign(new Error("the chat server cannot be reached"), { status: 0 });
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = data.error ?? `${response.status} ${response.statusText}`;
    throw Object.assign(new Error(message), { status: response.status });
  }
  return data;
}

// --- the page --------------------------------------------------------------------

/** A line in the chat; the same error twice in a row shows once. */
function notice(text, kind = "info") {
  const last = turnsBox.lastElementChild;
  if (last?.classList.contains("notice") && last.textContent === text) return;
  const role = kind === "error" ? "alert" : null;
  turnsBox.append(el("p", { class: `notice ${kind}`, "data-testid": "notice", role }, text));
}

function status(text) {
  statusLine.textContent = text;
}

function nearBottom() {
  return window.innerHeight + window.scrollY >= document.body.scrollHeight - 160;
}

function grow() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight + 2, 200)}px`; // with its borders
}

/** The agent's own words: its title, what it helps with, questions to start from (the
 *  greeting only while it shows: the conversation's first turn takes it away). */
function introduce(agent) {
  document.title = agent.title;
  document.getElementById("title").textContent = agent.title;
  const hello = document.getElementById("hello");
  if (!hello) return;
  hello.replaceChildren(agent.description ? `Ask about ${agent.description}` : "Ask a question");
  if (agent.examples.length) {
    hello.append(", for example ");
    agent.examples.forEach((example, i) => {
      if (i) hello.append(i === agent.examples.length - 1 ? " or " : ", ");
      const hint = el("q", { class: "hint", tabindex: "0", title: "ask this" }, example);
      const ask = () => {
        input.value = example;
        grow();
        input.focus();
      };
      hint.addEventListener("click", ask);
      hint.addEventListener("keydown", (event) => event.key === "Enter" && ask());
      hello.append(hint);
    });
  }
  hello.append(".");
}

/** Who the page chats as, and with which agent. Only a request that got no answer
 *  says the server cannot be reached; an answer that is an error says what it says. */
async function whoAmI() {
  let response;
  try {
    response = await fetch("/api/session");
  } catch {
    if (!leaving) status("the chat server cannot be reached");
    return;
  }
  const session = await response.json().catch(() => ({}));
  if (!response.ok || !session.agent) {
    notice(session.error ?? `the chat server answered ${response.status}`, "error");
    return;
  }
  document.getElementById("who").textContent = `as customer ${session.customer_id}`;
  introduce(session.agent);
  // Only a role's holder decides other people's calls (the agent's approvers name roles).
  if (session.roles?.length) watchQueue(session.customer_id);
}

document.getElementById("composer").addEventListener("submit", submit);
document.getElementById("files").addEventListener("change", (event) => {
  choose(event.target.files);
  event.target.value = ""; // the same file may be chosen again
});
input.addEventListener("paste", (event) => {
  if (event.clipboardData?.files.length) {
    event.preventDefault();
    choose(event.clipboardData.files);
  }
});
window.addEventListener("dragover", (event) => {
  if (![...(event.dataTransfer?.types ?? [])].includes("Files")) return;
  event.preventDefault();
  document.body.classList.add("dropping");
});
window.addEventListener("dragleave", () => document.body.classList.remove("dropping"));
window.addEventListener("drop", (event) => {
  document.body.classList.remove("dropping");
  if (!event.dataTransfer?.files.length) return;
  event.preventDefault();
  choose(event.dataTransfer.files);
});
input.addEventListener("input", grow);
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    document.getElementById("composer").requestSubmit();
  }
});
const showChecks = document.getElementById("show-checks");
const applyChecks = () => document.body.classList.toggle("show-checks", showChecks.checked);
showChecks.addEventListener("change", applyChecks);
applyChecks(); // a reload keeps the box as it was
window.addEventListener("hashchange", () => location.reload());
window.addEventListener("pagehide", () => {
  leaving = true;
});
window.addEventListener("pageshow", (event) => {
  if (event.persisted) leaving = false; // back from the back-forward cache
});
window.addEventListener("unhandledrejection", (event) => {
  notice(String(event.reason?.message ?? event.reason), "error");
});

// A new conversation per page, unless the URL names one (#<chat id> or ?chat=<chat id>),
// or names one turn to show (?turn=<turn id>).
const named = new URLSearchParams(location.search);
chat.id = decodeURIComponent(location.hash.slice(1)) || named.get("chat");
if (named.get("turn")) view(named.get("turn"));
else if (chat.id) listen();
whoAmI();
grow();
input.focus();
