#!/usr/bin/env node
// Example swarm client in JavaScript: plays the `calculator` task against a running swarm.
//
//   SWARMRL_CONNECT_FILE=runs/latest/connect.json node agents/examples/js/agent.mjs --episodes 16
//
// Each round plays one question `--num-repeat` times at once (one GRPO group); `--concurrency`
// rounds run at once, until `--episodes` are played or SIGTERM/SIGINT (then the groups in flight get
// `--drain-s` to finish, a second signal cuts that short, and it exits 0).

import { createHash, randomBytes } from "node:crypto";
import { setMaxListeners } from "node:events";
import { readFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { CalculatorEnv, TOOLS, taskId, trainTasks } from "./calculator.mjs";
import { SwarmClient, sleep } from "./swarm.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const env = process.env;

const USAGE = `usage: node agent.mjs [flags]

Connection (environment only, never flags): the JSON connect file named by SWARMRL_CONNECT_FILE
({"nats_url", "name", "seed", "inbox_prefix", "models", "tasks"}: this client's own NATS identity,
from \`swarmrl up\` or \`swarmrl credentials mint NAME\`); SWARMRL_NATS_URL overrides its servers.
`;

/** The flags: `help` is what `--help` prints after the flag and its default. */
const FLAGS = {
  model: { help: "model to call (default: $SWARMRL_ROLES' model, the file's first model, or policy)" },
  episodes: { default: "0", help: "stop after N episodes, rounded up to whole groups (0: until SIGTERM)" },
  "num-repeat": {
    help: "episodes per question = GRPO group size, as the trainer's (default: $SWARMRL_NUM_REPEAT, the file's tasks.<task>.num_repeat, or 8)",
  },
  concurrency: { default: "2", help: "groups played at once" },
  temperature: { default: "1.0", help: "sampling temperature" },
  "max-tokens": { default: "48", help: "max tokens per reply" },
  seed: { default: env.SWARMRL_CLIENT_SEED ?? "0", help: "seed of the question stream ($SWARMRL_CLIENT_SEED)" },
  task: { default: env.SWARMRL_TASK || "calculator", help: "task name recorded on episodes ($SWARMRL_TASK)" },
  "client-id": { help: "stable id of this process (default: the identity's name)" },
  "timeout-s": { default: "120", help: "per model call" },
  "drain-s": { default: "30", help: "on SIGTERM: seconds the groups in flight get to finish before they are aborted" },
};

function log(level, message) {
  process.stderr.write(`${new Date().toISOString()} ${level} js-agent ${message}\n`);
}

/** `$SWARMRL_CODE_VERSION`, else a content hash of this client's source files. */
function codeVersion() {
  if (env.SWARMRL_CODE_VERSION) return env.SWARMRL_CODE_VERSION;
  const hash = createHash("sha1");
  for (const file of ["agent.mjs", "swarm.mjs", "calculator.mjs"]) hash.update(readFileSync(join(HERE, file)));
  return `js-${hash.digest("hex").slice(0, 12)}`;
}

/** Servers, identity and the swarm's models and tasks from the connect file (and SWARMRL_NATS_URL). */
function connection() {
  if (!env.SWARMRL_CONNECT_FILE) throw new Error("SWARMRL_CONNECT_FILE is not set: say where the connect file is");
  const file = JSON.parse(readFileSync(env.SWARMRL_CONNECT_FILE, "utf8"));
  for (const key of ["nats_url", "name", "seed"]) {
    if (!file[key]) throw new Error(`${env.SWARMRL_CONNECT_FILE} has no "${key}": mint one with swarmrl credentials`);
  }
  const servers = (env.SWARMRL_NATS_URL ?? file.nats_url).split(",").map((u) => u.trim()).filter(Boolean);
  const inboxPrefix = file.inbox_prefix ?? `_INBOX.${file.name}`;
  return { servers, name: file.name, seed: file.seed, inboxPrefix, models: file.models ?? [], tasks: file.tasks ?? {} };
}

function wholeNumber(name, value) {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} must be a whole number >= 0, got ${value}`);
  return n;
}

function options(conn) {
  const flags = Object.fromEntries(Object.entries(FLAGS).map(([name, flag]) => [name, { type: "string", ...flag }]));
  const { values } = parseArgs({ options: { ...flags, help: { type: "boolean", short: "h" } } });
  const roles = env.SWARMRL_ROLES ? Object.values(JSON.parse(env.SWARMRL_ROLES)) : [];
  const numRepeat =
    values["num-repeat"] ?? env.SWARMRL_NUM_REPEAT ?? conn.tasks[values.task]?.num_repeat ?? "8";
  const o = {
    model: values.model ?? (roles.length === 1 ? roles[0] : conn.models[0] ?? "policy"),
    episodes: wholeNumber("episodes", values.episodes),
    numRepeat: wholeNumber("num-repeat", numRepeat),
    concurrency: wholeNumber("concurrency", values.concurrency),
    temperature: Number(values.temperature),
    maxTokens: wholeNumber("max-tokens", values["max-tokens"]),
    seed: wholeNumber("seed", values.seed),
    task: values.task,
    clientId: values["client-id"] ?? conn.name,
    timeoutMs: Number(values["timeout-s"]) * 1000,
    drainMs: Number(values["drain-s"]) * 1000,
  };
  if (o.numRepeat < 1 || o.concurrency < 1 || o.maxTokens < 1) {
    throw new Error(`--num-repeat, --concurrency and --max-tokens must be >= 1 (got ${JSON.stringify(o)})`);
  }
  return o;
}

/** One chat completion through the gateway's OpenAI-compatible endpoint; the assistant message. */
async function chat(ep, o, messages, signal) {
  const body = { model: o.model, messages, tools: TOOLS, temperature: o.temperature, max_tokens: o.maxTokens };
  const resp = await fetch(`${ep.baseUrl.replace(/\/+$/, "")}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${ep.token()}` },
    body: JSON.stringify(body),
    signal: AbortSignal.any([signal, AbortSignal.timeout(o.timeoutMs)]),
  });
  if (!resp.ok) {
    throw new Error(`chat completion failed: HTTP ${resp.status}: ${(await resp.text()).slice(0, 500)}`);
  }
  // The gateway's message is in OpenAI's format already: passed on as it is, as the Python runner does.
  const { content = null, tool_calls: calls } = (await resp.json()).choices[0].message;
  return calls?.length ? { role: "assistant", content, tool_calls: calls } : { role: "assistant", content };
}

/** Play one whole episode (begin ... end, or abort on any error) of `expression`. */
async function playEpisode(swarm, o, expression, groupKey, signal) {
  const ep = swarm.episode({ taskId: taskId(expression, o.task), models: [o.model], groupKey, task: { name: o.task } });
  await ep.begin({ signal }); // nothing to abort when this fails: the episode never began
  try {
    const game = new CalculatorEnv(expression);
    const messages = game.reset();
    for (;;) {
      signal.throwIfAborted();
      const reply = await chat(ep, o, messages, signal);
      messages.push(reply);
      const step = game.step(reply);
      messages.push(...step.messages);
      if (step.done) break;
    }
    await ep.reward(game.reward);
    await ep.end({ reward: game.reward, success: game.success ? 1 : 0, turns: game.turns });
    return game;
  } catch (e) {
    const reason = signal.aborted ? `client stopping: ${signal.reason?.message}` : `${e?.name}: ${e?.message}`;
    await ep.abort(reason).catch((err) => log("WARNING", `abort of ${ep.episodeId} failed: ${err.message}`));
    throw e;
  }
}

async function main() {
  if (process.argv.includes("--help") || process.argv.includes("-h")) {
    const lines = Object.entries(FLAGS).map(([name, f]) => `  --${name}  ${f.help}${f.default ? ` (default ${f.default})` : ""}`);
    process.stdout.write(`${USAGE}\n${lines.join("\n")}\n`);
    process.exit(0);
  }
  const conn = connection();
  const o = options(conn);
  const version = codeVersion();
  const stop = new AbortController(); // no new group starts
  const abortNow = new AbortController(); // episodes in flight are aborted
  // Every episode in flight listens to both signals: more than Node's default of 10 is no leak.
  setMaxListeners(0, stop.signal, abortNow.signal);
  for (const sig of ["SIGTERM", "SIGINT"]) {
    process.on(sig, () => {
      if (stop.signal.aborted) {
        abortNow.abort(new Error(`second ${sig}`));
        return;
      }
      log("INFO", `${sig}: no new groups; the groups in flight get ${o.drainMs / 1000}s to finish`);
      stop.abort(new Error(sig));
      setTimeout(() => abortNow.abort(new Error(`${sig}, drain of ${o.drainMs / 1000}s over`)), o.drainMs).unref();
    });
  }

  const swarm = await SwarmClient.connect({ ...conn, clientId: o.clientId, clientVersion: version });
  log(
    "INFO",
    `connected to ${conn.servers.join(",")} as ${o.clientId} version=${version} model=${o.model} ` +
      `task=${o.task} num_repeat=${o.numRepeat} concurrency=${o.concurrency} episodes=${o.episodes || "unlimited"}`,
  );
  const questions = trainTasks(o.seed);
  const maxGroups = o.episodes ? Math.ceil(o.episodes / o.numRepeat) : Infinity;
  const counts = { ok: 0, success: 0, failed: 0, stopped: 0 };
  const fates = new Map(); // "trained" or the drop reason -> groups (what the trainers told this client)
  const heard = [];
  let groups = 0;
  // In the group key: a restarted client never joins its predecessor's groups.
  const life = randomBytes(4).toString("hex");

  async function groupLoop() {
    while (!stop.signal.aborted && groups < maxGroups) {
      const expression = questions.next().value;
      groups++;
      const key = `${taskId(expression, o.task)}@${o.clientId}-${life}-${groups}`;
      const results = await Promise.allSettled(
        Array.from({ length: o.numRepeat }, () => playEpisode(swarm, o, expression, key, abortNow.signal)),
      );
      let failed = false;
      for (const r of results) {
        if (r.status === "fulfilled") {
          counts.ok++;
          counts.success += r.value.success ? 1 : 0;
        } else if (abortNow.signal.aborted) {
          counts.stopped++;
        } else {
          counts.failed++;
          failed = true;
          log("WARNING", `episode failed: ${r.reason?.stack ?? r.reason}`);
        }
      }
      if (results.some((r) => r.status === "fulfilled")) {
        heard.push(
          swarm.outcome(key, { timeoutMs: o.drainMs }).then(
            (out) => {
              const fate = out.outcome === "trained" ? "trained" : `dropped ${out.reason}`;
              fates.set(fate, (fates.get(fate) ?? 0) + 1);
              if (out.outcome === "dropped") log("INFO", `group ${key} dropped: ${out.reason}`);
            },
            () => {}, // not decided before the client stops: the ledger's `groups` has it
          ),
        );
      }
      if (failed) await sleep(1000, stop.signal).catch(() => {}); // back off while the swarm is not answering
    }
  }

  await Promise.all(Array.from({ length: o.concurrency }, groupLoop));
  await Promise.race([Promise.all(heard), sleep(2000)]); // outcomes still to come: a moment, not the drain again
  log(
    "INFO",
    `client stopping after ${groups} groups: ${counts.ok} episodes ended (${counts.success} solved), ` +
      `${counts.failed} failed, ${counts.stopped} aborted on stop; groups: ` +
      ([...fates].map(([fate, n]) => `${n} ${fate}`).join(", ") || "no outcome heard"),
  );
  await swarm.close();
  // Stopped by a signal: 0. Stopped by the count: 1 only if no episode at all could be played.
  return !stop.signal.aborted && counts.ok === 0 && counts.failed > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    log("ERROR", `${basename(process.argv[1])}: ${e?.stack ?? e}`);
    process.exit(1);
  },
);
