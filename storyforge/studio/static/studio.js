// storyforge studio page: edit a template, see issues, messages and the trace as you type.
// Plain JavaScript, no dependencies. Every text from the server is put in the page with
// textContent, never as HTML. Re-render is debounced; a stale answer is dropped.
"use strict";

const DEBOUNCE_MS = 250;
const state = { seq: 0, timer: null, task: null, revisions: [] };

function status(text, isError) {
  const line = $("status");
  line.textContent = text;
  line.classList.toggle("error", Boolean(isError));
}

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = { error: `${response.status} ${response.statusText}` };
  }
  return { ok: response.ok, status: response.status, data };
}

// -- editor --------------------------------------------------------------------------------

function lineCount(text) {
  return text.split("\n").length;
}

function drawGutter(issueLines) {
  const gutter = $("gutter");
  const count = lineCount($("template").value);
  const frag = document.createDocumentFragment();
  for (let i = 1; i <= count; i++) {
    const row = el("div", { "data-line": String(i) }, String(i));
    if (issueLines.has(i)) row.classList.add("err");
    frag.append(row);
  }
  gutter.replaceChildren(frag);
  gutter.scrollTop = $("template").scrollTop;
}

function goToLine(line, column) {
  const area = $("template");
  const lines = area.value.split("\n");
  let offset = 0;
  for (let i = 0; i < Math.min(line - 1, lines.length); i++) offset += lines[i].length + 1;
  offset += Math.max(0, (column || 1) - 1);
  area.focus();
  area.setSelectionRange(offset, offset);
  const lineHeight = parseFloat(getComputedStyle(area).lineHeight) || 18;
  area.scrollTop = Math.max(0, (line - 5) * lineHeight);
}

// -- rendering the answer -------------------------------------------------------------------

function showIssues(issues, notes) {
  const list = $("issues");
  const items = [];
  const lines = new Set();
  for (const issue of issues) {
    if (issue.where === "template" && issue.line) lines.add(issue.line);
    items.push(issueItem(issue, "issue"));
  }
  for (const note of notes || []) items.push(issueItem(note, "note"));
  list.replaceChildren(...items);
  const count = $("issue-count");
  count.textContent = String(issues.length);
  count.classList.toggle("bad", issues.length > 0);
  drawGutter(lines);
}

function issueItem(issue, kind) {
  const where = issue.where === "context" ? "context" : "template";
  const place = issue.line ? `${where} line ${issue.line}, column ${issue.column}` : where;
  const message = issue.hint ? issue.message.replace(issue.hint, "").trim() : issue.message;
  const item = el(
    "li",
    { class: kind, "data-line": String(issue.line || ""), "data-code": issue.code, "data-where": where },
    el("span", { class: "where" }, `${place} · ${issue.path} · ${issue.code}`),
    el("div", { class: "message" }, message),
    issue.hint ? el("span", { class: "hint" }, issue.hint) : null,
    issue.context ? el("pre", {}, issue.context) : null,
  );
  if (issue.line && where === "template") item.addEventListener("click", () => goToLine(issue.line, issue.column));
  return item;
}

function showMessages(messages, warnings, budget) {
  const bubbles = messages.map((m, index) =>
    el(
      "div",
      { class: "msg", "data-role": m.role, "data-index": String(index), "data-prefix": String(m.prefix) },
      el(
        "div",
        { class: "meta" },
        el("strong", {}, m.role),
        el("span", { class: "tokens" }, `${m.tokens} tokens`),
        m.prefix ? el("span", { class: "prefix", title: "the model continues this message" }, "prefill") : null,
      ),
      el("pre", {}, m.content),
    ),
  );
  $("messages").replaceChildren(...bubbles);
  $("warnings").replaceChildren(...(warnings || []).map((w) => el("li", {}, w)));
  if (budget) {
    const limit = budget.max_tokens === null ? "no limit" : `budget ${budget.max_tokens}`;
    $("totals").textContent = `${messages.length} messages · ${budget.emitted} tokens · ${limit}`;
  } else {
    $("totals").textContent = "";
  }
}

function verdictCell(verdict) {
  return el("td", { class: `verdict verdict-${verdict}` }, verdict);
}

function why(row) {
  if (row.verdict === "dropped" || row.verdict === "partial") {
    const n = row.dropped;
    return n ? `budget dropped ${n} message${n === 1 ? "" : "s"}` : row.reason || "over budget";
  }
  return row.reason ? row.reason.replaceAll("_", " ") : "";
}

function showTrace(slots, layout) {
  const slotRows = (slots || []).map((s) =>
    el(
      "tr",
      { "data-slot": s.name, "data-verdict": s.verdict },
      el("td", {}, s.name + (s.in_layout ? "" : " (not in layout)")),
      el("td", {}, String(s.priority)),
      verdictCell(s.verdict),
      el("td", {}, why(s)),
      el("td", {}, `${s.tokens} / ${s.max_tokens === null ? "—" : s.max_tokens}`),
    ),
  );
  $("slots").tBodies[0].replaceChildren(...slotRows);
  const layoutRows = (layout || []).map((item) =>
    el(
      "tr",
      { "data-path": item.path, "data-verdict": item.verdict },
      el("td", {}, item.path),
      el("td", {}, item.kind + (item.detail ? ` (${item.detail})` : "")),
      verdictCell(item.verdict),
      el("td", {}, item.reason ? item.reason.replaceAll("_", " ") : ""),
      el("td", {}, String(item.tokens)),
    ),
  );
  $("layout").tBodies[0].replaceChildren(...layoutRows);
}

// -- requests -------------------------------------------------------------------------------

function budgetValue() {
  const slider = $("budget");
  return Number(slider.value) >= Number(slider.max) ? null : Number(slider.value);
}

function scheduleRender() {
  clearTimeout(state.timer);
  state.timer = setTimeout(renderNow, DEBOUNCE_MS);
}

async function renderNow() {
  const seq = ++state.seq;
  const body = { template: $("template").value, context: $("context").value, budget: budgetValue() };
  let answer;
  try {
    answer = await api("POST", "/api/render", body);
  } catch (err) {
    if (seq === state.seq) status(`the studio server did not answer: ${err}`, true);
    return;
  }
  if (seq !== state.seq) return; // a newer edit is on its way
  const data = answer.data;
  if (!answer.ok) {
    status(data.error || `error ${answer.status}`, true);
    showIssues(data.issues || [], []);
    return;
  }
  showIssues(data.issues, data.notes);
  $("template-task").textContent = data.task ? `task ${data.task}` : "";
  if (data.task && data.task !== state.task) {
    state.task = data.task;
    loadContextList(data.task);
  }
  if (data.ok) {
    showMessages(data.messages, data.warnings, data.budget);
    showTrace(data.slots, data.layout);
    status(`rendered in ${data.elapsed_ms} ms`, false);
    $("right").classList.remove("stale");
    document.body.dataset.state = "rendered";
  } else {
    const n = data.issues.length;
    status(`${n} problem${n === 1 ? "" : "s"}: fix ${n === 1 ? "it" : "them"} to see the messages`, true);
    $("right").classList.add("stale"); // the last good render stays in view, dimmed
    document.body.dataset.state = "invalid";
  }
  document.body.dataset.seq = String(seq);
}

async function loadContextList(task) {
  const answer = await api("GET", `/api/contexts?task=${encodeURIComponent(task)}`);
  if (!answer.ok) return;
  const select = $("context-select");
  const options = [el("option", { value: "" }, "(empty)")];
  for (const ctx of answer.data) options.push(el("option", { value: ctx.name }, ctx.name));
  select.replaceChildren(...options);
  if (answer.data.length) {
    select.value = answer.data[0].name;
    await loadContext(select.value);
  }
}

async function loadContext(name) {
  if (!name) {
    $("context").value = "{}";
    scheduleRender();
    return;
  }
  const answer = await api("GET", `/api/contexts/${encodeURIComponent(name)}`);
  if (!answer.ok) {
    status(answer.data.error, true);
    return;
  }
  $("context").value = JSON.stringify(answer.data.context, null, 2);
  scheduleRender();
}

async function openExample(name) {
  if (!name) return;
  const answer = await api("GET", `/api/examples/${encodeURIComponent(name)}`);
  if (!answer.ok) {
    status(answer.data.error, true);
    return;
  }
  setTemplate(answer.data.text);
  status(`opened shipped template ${name}`, false);
}

function setTemplate(text) {
  $("template").value = text;
  $("template").scrollTop = 0;
  drawGutter(new Set());
  scheduleRender();
}

async function loadStored(selected) {
  const answer = await api("GET", "/api/templates");
  if (!answer.ok) return;
  const options = [el("option", { value: "" }, "(choose)")];
  for (const t of answer.data) options.push(el("option", { value: t.id }, `${t.id} (r${t.revision})`));
  $("stored-select").replaceChildren(...options);
  if (selected) {
    $("stored-select").value = selected;
    await loadRevisions(selected);
  }
}

async function loadRevisions(id) {
  const selects = [$("revision-select"), $("diff-a"), $("diff-b")];
  if (!id) {
    for (const s of selects) s.replaceChildren();
    return;
  }
  const answer = await api("GET", `/api/templates/${encodeURIComponent(id)}/revisions`);
  if (!answer.ok) {
    status(answer.data.error, true);
    return;
  }
  state.revisions = answer.data;
  for (const s of selects) {
    s.replaceChildren(...answer.data.map((r) => el("option", { value: String(r.revision) }, `revision ${r.revision}`)));
  }
  const last = answer.data.length - 1;
  $("revision-select").selectedIndex = last;
  $("diff-b").selectedIndex = last;
  $("diff-a").selectedIndex = Math.max(0, last - 1);
}

async function openRevision() {
  const id = $("stored-select").value;
  const rev = $("revision-select").value;
  if (!id || !rev) return;
  const answer = await api("GET", `/api/templates/${encodeURIComponent(id)}/revisions/${rev}`);
  if (!answer.ok) {
    status(answer.data.error, true);
    return;
  }
  setTemplate(answer.data.text);
  status(`opened ${id} revision ${rev}`, false);
}

async function save() {
  const answer = await api("POST", "/api/templates", { template: $("template").value });
  if (!answer.ok) {
    status(answer.data.error, true);
    if (answer.data.issues) showIssues(answer.data.issues, []);
    return;
  }
  const r = answer.data.record;
  status(`${answer.data.status}: ${r.id} revision ${r.revision} in the store`, false);
  await loadStored(r.id);
  document.body.dataset.saved = `${r.id}@${r.revision}`;
}

async function diff() {
  const id = $("stored-select").value;
  if (!id) {
    status("choose a stored template first", true);
    return;
  }
  const body = {
    id,
    a: Number($("diff-a").value),
    b: Number($("diff-b").value),
    context: $("context").value,
    budget: budgetValue(),
  };
  const answer = await api("POST", "/api/diff", body);
  const out = $("diff-output");
  if (!answer.ok) {
    out.textContent = answer.data.error;
    return;
  }
  const d = answer.data;
  if (d.same) {
    out.replaceChildren(`revisions ${d.a.revision} and ${d.b.revision} render the same prompt`);
    return;
  }
  out.replaceChildren(
    ...d.diff.map((line) => {
      const cls = line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
      return el("div", { class: cls }, line);
    }),
  );
}

// -- wiring ---------------------------------------------------------------------------------

function showBudget() {
  const value = budgetValue();
  $("budget-value").textContent = value === null ? "no limit" : `${value} tokens`;
}

async function start() {
  const info = await api("GET", "/api/info");
  if (info.ok) {
    $("store-url").textContent = `store ${info.data.store}`;
    $("estimator").textContent = info.data.estimator;
  }
  const examples = await api("GET", "/api/examples");
  if (examples.ok) {
    const options = [el("option", { value: "" }, "(choose)")];
    for (const ex of examples.data) {
      options.push(el("option", { value: ex.name }, ex.task ? `${ex.name} (${ex.task})` : ex.name));
    }
    $("example-select").replaceChildren(...options);
  }
  await loadStored(null);
  const area = $("template");
  area.addEventListener("input", () => {
    drawGutter(new Set());
    scheduleRender();
  });
  area.addEventListener("scroll", () => {
    $("gutter").scrollTop = area.scrollTop;
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Tab" && !event.shiftKey) { // two spaces, as YAML wants
      event.preventDefault();
      area.setRangeText("  ", area.selectionStart, area.selectionEnd, "end");
      scheduleRender();
    }
  });
  $("context").addEventListener("input", scheduleRender);
  $("budget").addEventListener("input", () => {
    showBudget();
    scheduleRender();
  });
  $("context-select").addEventListener("change", (e) => loadContext(e.target.value));
  $("example-select").addEventListener("change", (e) => openExample(e.target.value));
  $("stored-select").addEventListener("change", (e) => loadRevisions(e.target.value));
  $("open-revision").addEventListener("click", openRevision);
  $("save").addEventListener("click", save);
  $("diff").addEventListener("click", diff);
  showBudget();
  const first = examples.ok && examples.data.length ? examples.data.find((e) => e.name === "turn_writer") || examples.data[0] : null;
  if (first) {
    $("example-select").value = first.name;
    await openExample(first.name);
  } else {
    drawGutter(new Set());
  }
  document.body.dataset.ready = "true";
}

start();
