// storyforge studio, runs page: the runs and sweeps under the folder given at start.
// Plain JavaScript, no dependencies. Every text from a run (outputs, seeds, labels, names)
// goes into the page with textContent, never as HTML. Pages of answers come from the server;
// the page never holds a run whole. The view lives in the URL's hash, so back and forward work.
"use strict";

const PAGE = 50;
const COLUMNS = [
  ["id", "seed id"], ["sample", "sample"], ["attempt", "attempt"], ["passed", "passed"],
  ["labels", "labels"], ["judge", "judge"], ["cluster", "near-dup cluster"], ["chars", "chars"],
  ["sentences", "sentences"], ["finish_reason", "finish reason"], ["theme", "theme"], ["split", "split"],
];
const state = { run: null, info: null, seq: 0, watching: null };

function status(text, isError) {
  $("status").textContent = text;
  $("status").classList.toggle("error", Boolean(isError));
}

async function get(path, params) {
  const query = new URLSearchParams(params || {}).toString();
  const response = await fetch(query ? `${path}?${query}` : path);
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = { error: `${response.status} ${response.statusText}` };
  }
  if (!response.ok) throw new Error(data.error || `${response.status}`);
  return data;
}

function pct(rate) {
  return rate === null || rate === undefined ? "n/a" : `${(100 * rate).toFixed(1)}%`;
}

// -- the hash: what the page shows ----------------------------------------------------------

function readHash() {
  return Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
}

function go(params) {
  const clean = Object.fromEntries(Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined));
  location.hash = new URLSearchParams(clean).toString();
}

function show(which) {
  for (const id of ["placeholder", "run-view", "answer-view", "sweep-view"]) $(id).hidden = id !== which;
}

async function route() {
  const seq = ++state.seq;
  const h = readHash();
  document.body.dataset.ready = "false";
  document.body.dataset.hash = location.hash.slice(1);
  for (const item of document.querySelectorAll("#run-list li")) {
    item.classList.toggle("active", item.dataset.name === (h.sweep || h.run));
  }
  status("");
  try {
    if (h.sweep) await openSweep(h.sweep, seq);
    else if (h.run && h.row !== undefined) await openAnswer(h.run, h.row, seq);
    else if (h.run) await openRun(h, seq);
    else show("placeholder");
  } catch (err) {
    if (seq === state.seq) status(String(err.message || err), true);
  }
  if (seq === state.seq) document.body.dataset.ready = "true";
}

// -- the list of runs -----------------------------------------------------------------------

async function loadList() {
  const data = await get("/api/runs");
  $("runs-root").textContent = data.root ? `runs under: ${data.root}` : "no runs folder (start where outputs/ or multirun/ is, or with --runs DIR)";
  const items = data.entries.map((entry) => {
    const when = new Date(entry.modified * 1000).toISOString().replace("T", " ").slice(0, 16);
    const figures = entry.kind === "run" && entry.validated !== null ? `${entry.validated} answers, ${pct(entry.pass_rate)} passed` : entry.kind;
    const link = el("a", { href: "#" + new URLSearchParams({ [entry.kind]: entry.name }).toString() }, entry.name);
    const item = el("li", { "data-name": entry.name, "data-kind": entry.kind, class: entry.in_sweep ? "in-sweep" : "" },
      el("span", { class: `kind kind-${entry.kind}` }, entry.kind), link, el("div", { class: "muted" }, `${when} · ${figures}`));
    return item;
  });
  $("run-list").replaceChildren(...items);
}

// -- one run ----------------------------------------------------------------------------------

function bars(target, rows, scale) {
  // rows: [label, value, text]; a bar's length is value / scale (rates: scale 1; counts: the largest)
  const max = scale || Math.max(1e-9, ...rows.map((r) => r[1]));
  target.replaceChildren(...rows.map(([label, value, text]) => {
    const fill = el("div", { class: "fill" });
    fill.style.width = `${(100 * value) / max}%`;
    return el("div", { class: "bar", "data-label": label }, el("span", { class: "name", title: label }, label),
      el("div", { class: "track" }, fill), el("span", { class: "value" }, text));
  }));
}

function drawCharts(charts) {
  bars($("chart-labels"), Object.entries(charts.labels).map(([k, n]) => [k, n, String(n)]));
  bars($("chart-themes"), Object.entries(charts.by_theme).map(([k, r]) => [k, r.pass_rate || 0, `${pct(r.pass_rate)} of ${r.validated}`]), 1);
  bars($("chart-sentences"), Object.entries(charts.by_sentences).map(([k, r]) => [`${k} sentences`, r.pass_rate || 0, `${pct(r.pass_rate)} of ${r.validated}`]), 1);
  bars($("chart-ranges"), Object.entries(charts.by_sentence_range || {}).map(([k, r]) => [`${k} sentences`, r.pass_rate || 0, `${pct(r.pass_rate)} of ${r.validated}`]), 1);
  if (state.info && state.info.indexing) {
    $("chart-sentences").replaceChildren(el("p", { class: "muted" }, "drawn once the run is indexed"));
    $("chart-ranges").replaceChildren(el("p", { class: "muted" }, "drawn once the run is indexed"));
  }
}

function judgeLine(judge) {
  // The report's judge section in one line: verdicts, the rules failing verdicts cite, error kinds.
  const counts = (o) => Object.entries(o || {}).map(([k, n]) => `${k || "(none)"} ${n}`).join(", ");
  const v = judge.verdicts;
  let line = `Judge: ${v.pass + v.fail + v.error} judged answers: pass ${v.pass}, fail ${v.fail}, error ${v.error}`;
  if (Object.keys(judge.rules || {}).length) line += ` · rules cited: ${counts(judge.rules)}`;
  if (Object.keys(judge.errors || {}).length) line += ` · errors: ${counts(judge.errors)}`;
  return line;
}

function fillSelect(select, values, chosen) {
  const keep = [...select.options].filter((o) => o.value === "" || o.value === "none");
  select.replaceChildren(...keep, ...values.map((v) => el("option", { value: v }, v)));
  select.value = chosen || "";
}

async function openRun(h, seq) {
  if (state.run !== h.run) {
    state.info = await get("/api/run", { name: h.run });
    state.run = h.run;
  }
  if (seq !== state.seq) return;
  const info = state.info;
  show("run-view");
  document.body.dataset.indexing = String(Boolean(info.indexing));
  if (info.indexing && state.watching !== h.run) {
    state.watching = h.run;
    watchIndex(h.run);
  }
  $("run-title").textContent = info.name;
  $("run-figures").textContent = `${info.answers} answers, ${info.charts.passed} passed (${pct(info.charts.pass_rate)})` +
    (info.template ? ` · template ${info.template}` : "");
  drawCharts(info.charts);
  const judge = info.report && info.report.judge;
  $("run-judge").hidden = !judge;
  $("run-judge").textContent = judge ? judgeLine(judge) : "";
  fillSelect($("f-label"), info.facets.labels, h.label);
  $("f-passed").value = h.passed || "";
  fillSelect($("f-split"), info.facets.splits, h.split);
  fillSelect($("f-theme"), info.facets.themes, h.theme);
  const visible = COLUMNS.filter(([key]) =>
    !(key === "attempt" && !info.facets.has_attempt) && !(key === "judge" && !info.facets.has_judge) &&
    !(key === "cluster" && !info.facets.has_cluster));
  const sort = h.sort || "row";
  const desc = h.desc === "true";
  $("answers").tHead.rows[0].replaceChildren(...visible.map(([key, title]) => {
    const th = el("th", { "data-sort": key, tabIndex: 0, title: "sort" }, title + (sort === key ? (desc ? " ▼" : " ▲") : ""));
    th.addEventListener("click", () => go({ ...h, sort: key, desc: sort === key && !desc ? "true" : "", offset: "" }));
    return th;
  }));
  const offset = Number(h.offset || 0);
  const params = { name: h.run, sort, desc: desc ? "true" : "false", offset, limit: PAGE };
  for (const key of ["label", "passed", "split", "theme"]) if (h[key]) params[key] = h[key];
  const page = await get("/api/run/answers", params);
  if (seq !== state.seq) return;
  $("answers").tBodies[0].replaceChildren(...page.rows.map((row) => {
    const tr = el("tr", { "data-row": String(row.row), "data-passed": String(row.passed), tabIndex: 0 });
    for (const [key] of visible) {
      let value = row[key];
      if (key === "labels") value = el("span", {}, ...row.labels.map((l) => el("span", { class: "label" }, l)));
      else if (key === "passed") value = el("span", { class: row.passed ? "ok" : "bad" }, row.passed ? "pass" : "fail");
      tr.append(el("td", {}, value === null || value === undefined ? "" : value));
    }
    tr.addEventListener("click", () => go({ run: h.run, row: String(row.row), back: location.hash.slice(1) }));
    return tr;
  }));
  const last = Math.min(page.total, offset + page.rows.length);
  $("page-info").textContent = page.total ? `${offset + 1}–${last} of ${page.total}` : "no answers match";
  $("page-info").dataset.total = String(page.total);
  $("prev").disabled = offset <= 0;
  $("next").disabled = last >= page.total;
  $("prev").onclick = () => go({ ...h, offset: String(Math.max(0, offset - PAGE)) });
  $("next").onclick = () => go({ ...h, offset: String(offset + PAGE) });
}

function watchIndex(run, delay = 100) {
  // A large run's first open: the figures are the report's until the run's index is built;
  // then the charts (with the sentence chart) and the filter choices are drawn again.
  status(`indexing ${state.info.answers} answers: filters and sorting answer once it is done`);
  setTimeout(async () => {
    if (state.run !== run) {
      state.watching = null;
      return;
    }
    try {
      const info = await get("/api/run", { name: run });
      if (state.run !== run) return;
      state.info = info;
      if (info.indexing) return watchIndex(run, 400);
      const h = readHash();
      drawCharts(info.charts);
      fillSelect($("f-label"), info.facets.labels, h.label);
      fillSelect($("f-split"), info.facets.splits, h.split);
      fillSelect($("f-theme"), info.facets.themes, h.theme);
      document.body.dataset.indexing = "false";
      state.watching = null;
      status("");
    } catch (err) {
      state.watching = null;
      status(String(err.message || err), true);
    }
  }, delay);
}

function onFilter() {
  const h = readHash();
  go({ run: h.run, sort: h.sort, desc: h.desc, label: $("f-label").value, passed: $("f-passed").value,
    split: $("f-split").value, theme: $("f-theme").value });
}

// -- one answer --------------------------------------------------------------------------------

function drawText(target, segments) {
  // Each piece of the text as a span (text only); a sentence's first piece carries its number.
  let last = null;
  const nodes = [];
  for (const seg of segments) {
    if (seg.sentence !== null && seg.sentence !== last) nodes.push(el("sup", { class: "sentence-no" }, String(seg.sentence)));
    last = seg.sentence;
    const span = el("span", {}, seg.text);
    if (seg.sentence !== null) {
      span.classList.add("sentence", seg.sentence % 2 ? "odd" : "even");
      span.dataset.n = String(seg.sentence);
    }
    for (const mark of seg.marks) span.classList.add(`mark-${mark}`);
    nodes.push(span);
  }
  target.replaceChildren(...nodes);
}

function phraseList(target, rows, kind) {
  target.replaceChildren(...rows.map((r) => {
    const good = kind === "required" ? r.found : !r.found;
    const where = r.found ? (r.at.length ? `found at character ${r.at.join(", ")}` : "found") : "not in the text";
    return el("li", { class: good ? "ok" : "bad", "data-found": String(r.found), "data-phrase": r.phrase },
      el("span", { class: "phrase" }, r.phrase), " ", el("span", { class: "muted" }, where));
  }));
  if (!rows.length) target.replaceChildren(el("li", { class: "muted" }, "(none)"));
}

function drawMessages(target, messages) {
  target.replaceChildren(...(messages || []).map((m) =>
    el("div", { class: "msg", "data-role": m.role }, el("header", {}, el("strong", {}, m.role)), el("pre", {}, m.content))));
  if (!messages) target.replaceChildren(el("p", { class: "muted" }, "This seed is not in the run's prompts.jsonl."));
}

async function openAnswer(run, row, seq) {
  const data = await get("/api/run/answer", { name: run, row });
  if (seq !== state.seq) return;
  show("answer-view");
  const rec = data.record;
  $("answer-title").textContent = `${run} · ${rec.id} sample ${rec.sample}` + (rec.attempt !== undefined && rec.attempt !== null ? ` attempt ${rec.attempt}` : "");
  $("answer-verdict").replaceChildren(el("span", { class: rec.passed ? "ok" : "bad" }, rec.passed ? "passed" : "failed"),
    ...(data.labels || rec.labels || []).map((l) => el("span", { class: "label" }, l)),
    ...(data.checks.cut_off ? [el("span", { class: "bad cut-off", title: `finish_reason ${rec.finish_reason}` }, data.checks.cut_off)] : []));
  drawMessages($("answer-messages"), data.messages);
  const trace = data.trace;
  $("trace-note").textContent = trace.available ? (trace.matches ? "(the run's template renders this prompt again, identically)" :
    "(the run's template renders a different prompt now)") : `(${trace.why})`;
  $("answer-trace").tBodies[0].replaceChildren(...(trace.available ? trace.slots : []).map((s) =>
    el("tr", { "data-verdict": s.verdict }, el("td", {}, s.name), el("td", { class: `verdict verdict-${s.verdict}` }, s.verdict),
      el("td", {}, s.reason || s.status || ""), el("td", {}, s.tokens === undefined || s.tokens === null ? "" : String(s.tokens)))));
  const checks = data.checks;
  if (checks.text === null) {
    $("answer-text").replaceChildren(el("p", { class: "muted" }, rec.error ? `provider error: ${rec.error}` : "no text output"));
  } else {
    drawText($("answer-text"), checks.segments);
  }
  const bounds = checks.bounds ? ` (the seed asks for ${checks.bounds[0]} to ${checks.bounds[1]})` : "";
  $("sentence-count").textContent = `${checks.sentences} sentences by the specification's split${bounds}`;
  $("sentence-count").dataset.count = String(checks.sentences);
  phraseList($("required-list"), checks.required || [], "required");
  phraseList($("banned-list"), checks.banned || [], "banned");
  const chars = checks.chars || 0;
  const fill = $("length").querySelector(".fill");
  fill.style.width = `${Math.min(100, (100 * chars) / (checks.max_chars || 1))}%`;
  $("length").classList.toggle("over", chars > checks.max_chars);
  $("length-note").textContent = `${chars} of ${checks.max_chars} characters`;
  $("reasons").replaceChildren(...(rec.reasons || []).map((r) => el("li", {}, r)));
  $("reasons").previousElementSibling.hidden = !(rec.reasons || []).length;
  $("attempts-box").hidden = !data.attempts.length;
  const repair = data.repair || {};
  $("repair-note").textContent = !data.attempts.length ? "" : repair.why ? `(${repair.why})` :
    repair.source === "stored" ? "(each repair turn as the run stored it)" :
    repair.source === "rendered" ? "(each repair turn rendered again by the engine from the run's repair template and the failures of the attempt before)" : "";
  $("attempts").replaceChildren(...data.attempts.map((a) => el("div", { class: "attempt" + (String(a.row) === String(row) ? " current" : ""), "data-attempt": String(a.attempt) },
    el("h4", {}, `attempt ${a.attempt} · ${a.passed ? "passed" : "failed"}`),
    el("div", {}, ...(a.labels || []).map((l) => el("span", { class: "label" }, l))),
    typeof a.repair_turn === "string" ? el("div", { class: "repair-turn" }, el("h5", {}, "repair turn (user)"), el("pre", { class: "repair" }, a.repair_turn)) : null,
    el("pre", { class: "attempt-output" }, a.output === null || a.output === undefined ? "" : String(a.output)))));
  const dup = data.duplicate;
  $("duplicate-box").hidden = !dup;
  if (dup) {
    $("duplicate-box").querySelector(".side-by-side").hidden = Boolean(dup.is_kept);
    if (dup.is_kept) {
      $("duplicate-note").textContent = `this answer is the kept member of cluster ${dup.cluster ?? "?"}` +
        (dup.size ? ` (${dup.size} members)` : "");
    } else {
      $("duplicate-note").textContent = `cluster ${dup.cluster ?? "?"} · ${dup.shared} shared 5-word shingles` +
        (dup.similarity !== null && dup.similarity !== undefined ? ` · Jaccard ${Number(dup.similarity).toFixed(2)}` : "") +
        (dup.kept ? ` · kept: ${dup.kept.id} sample ${dup.kept.sample}` : "");
      drawText($("dup-mine"), dup.text);
      drawText($("dup-kept"), dup.kept_text);
    }
  }
  const back = readHash().back;
  $("back").onclick = () => { location.hash = back || new URLSearchParams({ run }).toString(); };
}

// -- sweeps ----------------------------------------------------------------------------------

function heatColor(rate) {
  // viridis-like ramp from dark purple (0) to yellow (1)
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.max(0, Math.min(1, rate)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const t = x - i;
  const c = stops[i].map((v, k) => Math.round(v + t * (stops[i + 1][k] - v)));
  return [`rgb(${c.join(",")})`, rate > 0.6 ? "#111" : "#fff"];
}

function metricOf(job, metric) {
  const value = job.diversity ? job.diversity[metric] : undefined;
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function drawHeatmap(data, xAxis, yAxis, metric) {
  // Pass rate (jobs sharing a cell pooled), or a diversity figure (the mean of their values);
  // every cell with a run opens it.
  const xs = xAxis ? data.axes[xAxis] : [""];
  const ys = yAxis ? data.axes[yAxis] : [""];
  const values = data.jobs.map((j) => metricOf(j, metric)).filter((v) => v !== null);
  const low = Math.min(...values), high = Math.max(...values);
  $("heatmap-caption").textContent = `${metric || "Pass rate"} (click a cell to open its run)`;
  $("heatmap").tHead.replaceChildren(el("tr", {}, el("th", {}, yAxis && xAxis ? `${yAxis} \\ ${xAxis}` : (xAxis || "")),
    ...xs.map((x) => el("th", {}, x))));
  $("heatmap").tBodies[0].replaceChildren(...ys.map((y) => {
    const tr = el("tr", {}, el("th", {}, y));
    for (const x of xs) {
      const jobs = data.jobs.filter((j) => (!xAxis || j.swept[xAxis] === x) && (!yAxis || j.swept[yAxis] === y));
      const td = el("td", { class: "cell" });
      let shade = null, text = null, note = null;
      if (metric) {
        const mine = jobs.map((j) => metricOf(j, metric)).filter((v) => v !== null);
        if (mine.length) {
          const mean = mine.reduce((a, b) => a + b, 0) / mine.length;
          shade = high > low ? (mean - low) / (high - low) : 0.5;
          text = mean.toFixed(3);
          note = `${mine.length} job${mine.length > 1 ? "s" : ""}`;
        }
      } else {
        let passed = 0, validated = 0;
        for (const j of jobs) { passed += j.passed || 0; validated += j.validated || 0; }
        if (validated) {
          shade = passed / validated;
          text = pct(shade);
          note = `n=${validated}`;
        }
      }
      if (shade !== null) {
        const [bg, fg] = heatColor(shade);
        td.style.background = bg;
        td.style.color = fg;
        td.append(el("strong", {}, text), el("br"), el("span", {}, note));
      } else {
        td.append(jobs.some((j) => j.status !== "ok") ? "failed" : "no data");
        td.classList.add("empty");
      }
      const target = jobs.find((j) => j.run);
      if (target) {
        td.dataset.job = target.job;
        td.tabIndex = 0;
        td.title = `open job ${target.job}` + (jobs.length > 1 ? ` (1 of ${jobs.length} jobs here)` : "");
        td.addEventListener("click", () => go({ run: target.run }));
      }
      tr.append(td);
    }
    return tr;
  }));
}

async function openSweep(name, seq) {
  const data = await get("/api/sweep", { name });
  if (seq !== state.seq) return;
  show("sweep-view");
  $("sweep-title").textContent = name;
  const c = data.counts || {};
  $("sweep-figures").textContent = `${data.jobs.length} jobs (${c.ok ?? "?"} ok, ${c.failed ?? 0} failed, ${c.missing ?? 0} missing)`;
  const axes = Object.keys(data.axes);
  fillSelect($("axis-x"), axes, axes[0]);
  fillSelect($("axis-y"), axes, axes[1] || axes[0]);
  $("axis-x").parentElement.hidden = axes.length < 2;
  $("axis-y").parentElement.hidden = axes.length < 2;
  const metrics = [];
  for (const job of data.jobs) {
    for (const [key, value] of Object.entries(job.diversity || {})) {
      if (typeof value === "number" && !metrics.includes(key)) metrics.push(key);
    }
  }
  const metricSelect = $("metric");
  metricSelect.replaceChildren(el("option", { value: "" }, "pass rate"), ...metrics.map((m) => el("option", { value: m }, m)));
  metricSelect.parentElement.hidden = !metrics.length;
  const redraw = () => drawHeatmap(data, $("axis-x").value || null, axes.length > 1 ? $("axis-y").value : null, metricSelect.value);
  $("axis-x").onchange = redraw;
  $("axis-y").onchange = redraw;
  metricSelect.onchange = redraw;
  redraw();
  $("sweep-plots").replaceChildren(...data.plots.map((plot) => el("figure", { class: "sweep-plot" },
    el("figcaption", {}, plot.title),
    el("img", { src: "/api/sweep/plot?" + new URLSearchParams({ name, file: plot.file }).toString(), alt: plot.title }))));
  $("jobs").tBodies[0].replaceChildren(...data.jobs.map((j) => el("tr", { "data-job": j.job },
    el("td", {}, j.run ? el("a", { href: "#" + new URLSearchParams({ run: j.run }).toString() }, j.job) : j.job),
    el("td", {}, Object.entries(j.swept).map(([k, v]) => `${k}=${v}`).join(" ")),
    el("td", {}, j.status + (j.error ? `: ${j.error}` : "")),
    el("td", {}, j.validated ?? ""), el("td", {}, pct(j.pass_rate)),
    el("td", {}, j.ci95 ? `${pct(j.ci95[0])} – ${pct(j.ci95[1])}` : ""))));
  const runs = data.jobs.filter((j) => j.run);
  for (const [id, pick] of [["cmp-a", 0], ["cmp-b", 1]]) {
    $(id).replaceChildren(...runs.map((j) => el("option", { value: j.run },
      `job ${j.job}: ${Object.entries(j.swept).map(([k, v]) => `${k}=${v}`).join(" ")}`)));
    if (runs[pick]) $(id).value = runs[pick].run;
  }
  $("compare-result").hidden = true;
  $("compare").onclick = () => compare();
}

async function compare() {
  document.body.dataset.ready = "false";
  try {
    const data = await get("/api/compare", { a: $("cmp-a").value, b: $("cmp-b").value });
    $("compare-result").hidden = false;
    $("compare-figures").textContent = `${data.shared} answers in both · passed in both ${data.pass_pass} · ` +
      `passed in A, failed in B ${data.pass_fail} · failed in A, passed in B ${data.fail_pass} · failed in both ${data.fail_fail}`;
    $("compare-figures").dataset.flips = String(data.pass_fail);
    bars($("compare-labels"), Object.entries(data.flip_labels).map(([k, n]) => [k, n, String(n)]));
    $("flips").tBodies[0].replaceChildren(...data.flips.map((f) => {
      const tr = el("tr", { "data-id": f.id, tabIndex: 0 }, el("td", {}, f.id), el("td", {}, String(f.sample)),
        el("td", {}, ...(f.labels || []).map((l) => el("span", { class: "label" }, l))), el("td", {}, (f.reasons || []).join("; ")));
      tr.addEventListener("click", () => go({ run: data.b, row: String(f.row_b), back: location.hash.slice(1) }));
      return tr;
    }));
    status("");
  } catch (err) {
    status(String(err.message || err), true);
  }
  document.body.dataset.ready = "true";
}

async function start() {
  for (const id of ["f-label", "f-passed", "f-split", "f-theme"]) $(id).addEventListener("change", onFilter);
  window.addEventListener("hashchange", route);
  // rows, sortable headers and grid cells open with Enter as with a click
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target.matches("tr[tabindex], th[tabindex], td.cell[tabindex]")) {
      event.target.click();
    }
  });
  try {
    await loadList();
  } catch (err) {
    status(String(err.message || err), true);
  }
  await route();
}

start();
