// Times the original StoryForge engine on the cases of bench/render_corpus.py (Node 20).
//
// Usage: node bench/render_oracle.mjs CASES.json WARM REPEAT [BATCH] > RESULTS.json
// The engine is imported from the file named by STORYFORGE_REFERENCE_ENGINE (an ES module
// exporting compileTemplate, render, DefaultBudgetManager and makeRegistry); without it this
// script prints "not measured: set STORYFORGE_REFERENCE_ENGINE" and exits 2.
//
// For each case: the nanoseconds of compileTemplate plus the first render (no budget) and the
// messages of that render, every case in one pass; then, case by case, WARM untimed renders
// and the median of REPEAT timed ones.
// With BATCH, also the best of seven timed batches of BATCH renders (nanoseconds per render),
// timed after every case has rendered, in seven rounds over all cases: each case's figure is
// its best once the engine has seen every case (a case timed alone, before the engine met the
// next ones, was up to 2.5x faster or slower from run to run).
// A case the engine refuses or fails to render is reported with its error instead.
// A case with a "sources" member (source name -> list of [args, value] pairs: the values a
// storyforge task's sources returned for those args) renders over a data-only registry that
// returns those recorded values; other cases use SOURCES_JS.
// bench/render_bench.py runs this script and the same cases through storyforge in one run.

import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const enginePath = process.env.STORYFORGE_REFERENCE_ENGINE;
if (!enginePath) {
  console.error("not measured: set STORYFORGE_REFERENCE_ENGINE");
  process.exit(2);
}
const engine = await import(pathToFileURL(enginePath).href);
const { compileTemplate, render, DefaultBudgetManager, makeRegistry } = engine;

const [casesPath, warmText, repeatText, batchText] = process.argv.slice(2);
const warm = Number(warmText ?? 10);
const repeat = Number(repeatText ?? 15);
const batch = batchText === undefined ? 0 : Number(batchText);
const cases = JSON.parse(readFileSync(casesPath, "utf8"));

// The same data-only sources as REGISTRY in tests/support/template_strategies.py.
const SOURCES_JS = {
  xs: (ref, ctx) => ctx.xs,
  objs: () => [
    { name: "n", text: "t".repeat(9) },
    { name: "m", text: "u" },
  ],
  text: () => "a text value",
  num: () => 3,
  none: () => null,
  bad: () => {
    throw new Error("source failed");
  },
};
const defaultRegistry = makeRegistry(SOURCES_JS);

// JSON text with object keys sorted (the key Python's json.dumps(sort_keys=True) writes).
const stable = (value) => {
  if (Array.isArray(value)) return `[${value.map(stable).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${stable(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
};

// A registry answering each source with the value recorded for the same args.
const recordedRegistry = (sources) => {
  const handlers = {};
  for (const [name, pairs] of Object.entries(sources)) {
    const table = new Map(pairs.map(([args, value]) => [stable(args), value]));
    handlers[name] = (ref) => table.get(stable(ref.args ?? null));
  }
  return makeRegistry(handlers);
};

// A failing source makes the engine call console.warn; count instead of printing, so that
// writing to the terminal is not part of what is timed.
let warnings = 0;
console.warn = () => {
  warnings += 1;
};

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

const results = [];
const timed = []; // the cases that rendered, timed in batches once all have
// Compile + first render of every case in one pass (each case timed on its own), then the
// warm and repeated renders: so that what the first render meets is what a pass over many
// templates leaves, not the hot renders of the case before.
for (const { template, ctx, sources } of cases) {
  const registry = sources === undefined ? defaultRegistry : recordedRegistry(sources);
  const t0 = process.hrtime.bigint();
  let compiled;
  try {
    compiled = compileTemplate(template);
  } catch (error) {
    results.push({ ok: false, stage: "compile", error: String(error?.message ?? error).slice(0, 300) });
    continue;
  }
  let messages;
  try {
    messages = render(compiled, ctx, new DefaultBudgetManager({}), registry);
  } catch (error) {
    results.push({ ok: false, stage: "render", error: String(error?.message ?? error).slice(0, 300) });
    continue;
  }
  const first = Number(process.hrtime.bigint() - t0);
  timed.push({ index: results.length, compiled, ctx, registry });
  results.push({
    ok: true,
    first_ns: first,
    repeat_ns: null,
    best_ns: null,
    messages: messages.map((m) => ({ role: m.role, content: m.content, prefix: m.prefix === true })),
  });
}
for (const { index, compiled, ctx, registry } of timed) {
  for (let i = 0; i < warm; i += 1) render(compiled, ctx, new DefaultBudgetManager({}), registry);
  const times = [];
  for (let i = 0; i < repeat; i += 1) {
    const s = process.hrtime.bigint();
    render(compiled, ctx, new DefaultBudgetManager({}), registry);
    times.push(Number(process.hrtime.bigint() - s));
  }
  results[index].repeat_ns = median(times);
}
for (let round = 0; batch > 0 && round < 7; round += 1) {
  for (const { index, compiled, ctx, registry } of timed) {
    const s = process.hrtime.bigint();
    for (let i = 0; i < batch; i += 1) render(compiled, ctx, new DefaultBudgetManager({}), registry);
    const spent = Number(process.hrtime.bigint() - s) / batch;
    const best = results[index].best_ns;
    results[index].best_ns = best === null ? spent : Math.min(best, spent);
  }
}
process.stdout.write(JSON.stringify({ node: process.version, warnings, results }));
