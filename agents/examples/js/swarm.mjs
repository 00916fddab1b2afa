// A minimal swarm client written from `schemas/README.md` alone: episode tokens by msgpack
// request/reply on `swarm.auth.token.<client>`, episode events as msgpack maps on JetStream
// `swarm.ep.<client>.<episode_id>.<kind>`. `<client>` is this client's NATS identity (an nkey user).

import { randomUUID } from "node:crypto";
import { EventEmitter, once } from "node:events";
import { setTimeout as delay } from "node:timers/promises";
import { decode, encode } from "@msgpack/msgpack";
import { ErrorCode, connect, nkeyAuthenticator } from "nats";

/** The client that owns an episode: its id up to the first `_`. */
export const ownerOf = (episodeId) => episodeId.split("_")[0];
const SCHEMA_VERSION = 1;
// Retried with backoff (re-publishing is safe: JetStream drops a repeated Nats-Msg-Id).
const TRANSIENT = new Set([ErrorCode.Timeout, ErrorCode.NoResponders, ErrorCode.Disconnect]);

export class SwarmError extends Error {}
SwarmError.prototype.name = "SwarmError";

/** Resolve after `ms`, or reject when `signal` is aborted first. */
export const sleep = (ms, signal) => delay(ms, undefined, { signal });

async function retrying(fn, retryS, signal) {
  const deadline = Date.now() + retryS * 1000;
  for (let wait = 100; ; wait = Math.min(2 * wait, 2000)) {
    try {
      return await fn();
    } catch (e) {
      if (!TRANSIENT.has(e?.code) || Date.now() + wait > deadline) throw e;
    }
    await sleep(wait, signal);
  }
}

/** One agent process's connection to the swarm. */
export class SwarmClient {
  /** `name`, `seed` (the secret: never log it) and `inboxPrefix` are the connect file's. */
  static async connect({ servers, name, seed, inboxPrefix, clientId, clientVersion, retryS = 30 }) {
    const nc = await connect({
      servers,
      authenticator: nkeyAuthenticator(new TextEncoder().encode(seed)),
      inboxPrefix,
      name: "swarmrl-js-agent",
      maxReconnectAttempts: -1,
      reconnectTimeWait: 500,
    });
    const client = new SwarmClient(nc, name, clientId, clientVersion, retryS);
    client.watchOutcomes();
    return client;
  }

  constructor(nc, name, clientId, clientVersion, retryS) {
    Object.assign(this, { nc, name, clientId, clientVersion, retryS });
    this.js = nc.jetstream(); // publishing only: agents may not touch the JetStream API
    this.outcomes = new Map(); // group key -> model -> GroupOutcome map (the newest 10,000 groups)
    this.outcomeEvents = new EventEmitter().setMaxListeners(0); // "outcome": one came in
  }

  /** Keep the `GroupOutcome`s trainers publish for this client's groups (subscribed at connect). */
  watchOutcomes() {
    const sub = this.nc.subscribe(`swarm.metrics.outcome.${this.name}.*`);
    (async () => {
      for await (const msg of sub) {
        const outcome = decode(msg.data);
        const byModel = this.outcomes.get(outcome.group_key) ?? new Map();
        byModel.set(outcome.model, outcome);
        this.outcomes.delete(outcome.group_key); // re-insert: the map keeps insertion order, newest last
        this.outcomes.set(outcome.group_key, byModel);
        if (this.outcomes.size > 10_000) this.outcomes.delete(this.outcomes.keys().next().value);
        this.outcomeEvents.emit("outcome");
      }
    })();
  }

  /** The outcome of group `groupKey` (for `model`, else the first to decide); rejects after `timeoutMs`. */
  async outcome(groupKey, { model = null, timeoutMs = 120_000 } = {}) {
    const timeout = AbortSignal.timeout(timeoutMs);
    for (;;) {
      const byModel = this.outcomes.get(groupKey);
      const found = byModel && (model ? byModel.get(model) : byModel.values().next().value);
      if (found) return found;
      try {
        await once(this.outcomeEvents, "outcome", { signal: timeout });
      } catch {
        throw new SwarmError(`no outcome of group ${groupKey} within ${timeoutMs / 1000}s`);
      }
    }
  }

  /** Publish one event map idempotently; resolves once JetStream stored it. */
  async publish(event) {
    const subject = `swarm.ep.${ownerOf(event.episode_id)}.${event.episode_id}.${event.kind}`;
    const msgID = `${event.episode_id}.${event.client_id}.${event.seq}`;
    const data = encode(event);
    await retrying(() => this.js.publish(subject, data, { msgID, timeout: 10_000 }), this.retryS);
  }

  /** Ask the gateway for episode tokens; waits out `retry_after_s` (admission control). */
  async requestTokens(request, signal) {
    for (;;) {
      const msg = await retrying(
        () => this.nc.request(`swarm.auth.token.${this.name}`, encode(request), { timeout: 10_000 }),
        this.retryS,
        signal,
      );
      const answer = decode(msg.data);
      if (answer.retry_after_s !== undefined) {
        await sleep(Number(answer.retry_after_s) * 1000, signal);
        continue;
      }
      if (answer.error !== undefined) {
        throw new SwarmError(`gateway refused a token for episode ${request.episode_id}: ${answer.error}`);
      }
      return { tokens: answer.tokens, baseUrl: answer.base_url };
    }
  }

  /** Create an episode (not yet begun). */
  episode({ taskId, models, groupKey = "", task = {}, agents = ["agent"], evalEpisode = false }) {
    return new Episode(this, { taskId, models, groupKey, task, agents, evalEpisode });
  }

  async close() {
    await this.nc.drain();
  }
}

/** One episode: `begin()`, model calls with `token()` / `baseUrl`, `reward()`, then `end()` or `abort()`. */
export class Episode {
  constructor(client, { taskId, models, groupKey, task, agents, evalEpisode }) {
    this.client = client;
    this.episodeId = `${client.name}_${randomUUID().replaceAll("-", "")}`;
    Object.assign(this, { taskId, models, groupKey, task, agents, evalEpisode });
    this.seq = 0;
    this.closed = false;
    this.tokens = {};
    this.baseUrl = "";
    this.heartbeat = null;
    this.queue = Promise.resolve(); // publishes one at a time, so seqs reach the stream in order
  }

  #publish(kind, fields, final = false) {
    const run = async () => {
      if (this.closed) throw new SwarmError(`episode ${this.episodeId} is already closed`);
      const event = {
        v: SCHEMA_VERSION,
        kind,
        episode_id: this.episodeId,
        seq: this.seq++, // taken even if the publish fails: a retry never reuses a msg id with other content
        ts: Date.now() / 1000,
        client_id: this.client.clientId,
        client_version: this.client.clientVersion,
        ...fields,
      };
      await this.client.publish(event);
      if (final) this.closed = true; // a failed end can still be followed by an abort
    };
    const done = this.queue.then(run);
    this.queue = done.catch(() => {});
    return done;
  }

  /** Get the episode's tokens from the gateway, then publish `begin`. */
  async begin({ signal, heartbeatS = 5 } = {}) {
    const { tokens, baseUrl } = await this.client.requestTokens(
      {
        v: 1, // a `TokenRequest` record (schemas/README.md, "Episode tokens")
        episode_id: this.episodeId,
        agents: this.agents,
        models: this.models,
        ttl_s: 3600,
        client_id: this.client.clientId,
        client_version: this.client.clientVersion,
        group_key: this.groupKey || this.taskId,
        eval: this.evalEpisode,
        ...(typeof this.task.name === "string" ? { task: this.task.name } : {}),
      },
      signal,
    );
    signal?.throwIfAborted(); // stopping: never begin an episode only to abort it
    this.tokens = tokens;
    this.baseUrl = baseUrl;
    await this.#publish("begin", {
      task_id: this.taskId,
      group_key: this.groupKey,
      task: this.task,
      models: this.models,
      agents: this.agents,
      eval: this.evalEpisode,
    });
    if (heartbeatS > 0) {
      this.heartbeat = setInterval(() => {
        // A missed heartbeat must never fail the episode.
        if (!this.closed) this.#publish("heartbeat", {}).catch(() => {});
      }, heartbeatS * 1000);
    }
  }

  /** The signed API token of `agent` (default: the first agent). */
  token(agent = this.agents[0]) {
    const token = this.tokens[agent];
    if (!token) throw new SwarmError(`no token for agent ${agent}; episode agents are ${this.agents}`);
    return token;
  }

  /** Record an environment step. */
  env(name, data = {}, agent = "") {
    return this.#publish("env", { agent, name, data });
  }

  /** Add a reward; an empty `agent` gives it to every agent of the episode. */
  reward(value, agent = "", name = "reward") {
    return this.#publish("reward", { value: Number(value), agent, name });
  }

  /** Finish the episode; its samples are built from what was published. */
  async end(metrics = {}) {
    this.#stopHeartbeat();
    const floats = Object.fromEntries(Object.entries(metrics).map(([k, v]) => [k, Number(v)]));
    await this.#publish("end", { metrics: floats }, true);
  }

  /** Give up on the episode (it yields no samples). */
  async abort(reason = "") {
    this.#stopHeartbeat();
    await this.#publish("abort", { reason: String(reason).slice(0, 2000) }, true);
  }

  #stopHeartbeat() {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = null;
  }
}
