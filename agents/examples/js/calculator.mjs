// The `calculator` task in JavaScript: the same prompts, tool, questions and reward as
// `agents/tasks/calculator.py`. Python's `random.Random` is ported, so `evalTasks()` and
// `trainTasks(seed)` are the Python task's own questions.

import { createHash } from "node:crypto";

export const SYSTEM_PROMPT =
  "You are a careful assistant. Use the calculator tool, then reply with the final number only.";

export const TOOLS = [
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression.",
      parameters: {
        type: "object",
        properties: { expression: { type: "string", description: "for example 37 * 12 + 5" } },
        required: ["expression"],
      },
    },
  },
];

export const MAX_TURNS = 3;
const OPS = ["+", "-", "*"];

const N = 624;
const M = 397;

/** MT19937 seeded and drawn exactly as CPython's `random.Random` does (for the calls used here). */
export class PyRandom {
  constructor(seed) {
    this.mt = new Uint32Array(N);
    this.mti = N + 1;
    this.#initByArray(PyRandom.#key(seed));
  }

  static #key(seed) {
    let n;
    if (typeof seed === "string") {
      const bytes = Buffer.from(seed, "utf8");
      const all = Buffer.concat([bytes, createHash("sha512").update(bytes).digest()]);
      n = BigInt("0x" + all.toString("hex"));
    } else {
      n = BigInt(seed);
      if (n < 0n) n = -n;
    }
    const key = [];
    while (n > 0n) {
      key.push(Number(n & 0xffffffffn));
      n >>= 32n;
    }
    return key.length ? key : [0];
  }

  #initGenrand(s) {
    const mt = this.mt;
    mt[0] = s >>> 0;
    for (let i = 1; i < N; i++) {
      mt[i] = (Math.imul(1812433253, mt[i - 1] ^ (mt[i - 1] >>> 30)) + i) >>> 0;
    }
    this.mti = N;
  }

  #initByArray(key) {
    const mt = this.mt;
    this.#initGenrand(19650218);
    let i = 1;
    let j = 0;
    for (let k = Math.max(N, key.length); k; k--) {
      mt[i] = ((mt[i] ^ Math.imul(mt[i - 1] ^ (mt[i - 1] >>> 30), 1664525)) >>> 0) + key[j] + j;
      i++;
      j++;
      if (i >= N) {
        mt[0] = mt[N - 1];
        i = 1;
      }
      if (j >= key.length) j = 0;
    }
    for (let k = N - 1; k; k--) {
      mt[i] = ((mt[i] ^ Math.imul(mt[i - 1] ^ (mt[i - 1] >>> 30), 1566083941)) >>> 0) - i;
      i++;
      if (i >= N) {
        mt[0] = mt[N - 1];
        i = 1;
      }
    }
    mt[0] = 0x80000000;
  }

  /** One 32-bit output (CPython's genrand_uint32). */
  uint32() {
    const mt = this.mt;
    if (this.mti >= N) {
      // CPython's three loops over the table in one: the indices wrap around it.
      for (let kk = 0; kk < N; kk++) {
        const y = (mt[kk] & 0x80000000) | (mt[(kk + 1) % N] & 0x7fffffff);
        mt[kk] = mt[(kk + M) % N] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      this.mti = 0;
    }
    let y = mt[this.mti++];
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** Python's `_randbelow_with_getrandbits(n)` for 0 < n < 2**32. */
  randbelow(n) {
    const k = 32 - Math.clz32(n);
    let r = this.uint32() >>> (32 - k);
    while (r >= n) r = this.uint32() >>> (32 - k);
    return r;
  }

  /** `random.randint(a, b)`, both ends included. */
  randint(a, b) {
    return a + this.randbelow(b - a + 1);
  }

  /** `random.choice(seq)`. */
  choice(seq) {
    return seq[this.randbelow(seq.length)];
  }
}

const MAX_EXPRESSION_CHARS = 200;
const MAX_MAGNITUDE = 1e15;

export class ExpressionError extends Error {}

function checked(value) {
  if (!Number.isFinite(value) || Math.abs(value) > MAX_MAGNITUDE) {
    throw new ExpressionError(`result magnitude ${Math.abs(value).toPrecision(3)} above 1e+15`);
  }
  return value;
}

/** Evaluate integer arithmetic with + - * and parentheses ("7 * 4 + 8"), without `eval`. */
export function safeEval(expression) {
  if (typeof expression !== "string") {
    throw new ExpressionError(`expression must be a string, got ${typeof expression}`);
  }
  if (expression.length > MAX_EXPRESSION_CHARS) {
    throw new ExpressionError(`expression too long (${expression.length} > ${MAX_EXPRESSION_CHARS} chars)`);
  }
  const tokens = expression.match(/\d+|\S/g) ?? [];
  let pos = 0;
  const fail = (what) => {
    throw new ExpressionError(`not an arithmetic expression: ${JSON.stringify(expression)} (${what})`);
  };
  const expr = () => {
    let value = term();
    while (tokens[pos] === "+" || tokens[pos] === "-") {
      const op = tokens[pos++];
      const right = term();
      value = checked(op === "+" ? value + right : value - right);
    }
    return value;
  };
  const term = () => {
    let value = unary();
    while (tokens[pos] === "*") {
      pos++;
      value = checked(value * unary());
    }
    return value;
  };
  const unary = () => {
    if (tokens[pos] === "-" || tokens[pos] === "+") {
      const op = tokens[pos++];
      const value = unary();
      return op === "-" ? -value : value;
    }
    return atom();
  };
  const atom = () => {
    const tok = tokens[pos++];
    if (tok === undefined) fail("unexpected end");
    if (tok === "(") {
      const value = expr();
      if (tokens[pos++] !== ")") fail("missing )");
      return value;
    }
    if (!/^\d+$/.test(tok)) fail(`unexpected ${JSON.stringify(tok)}`);
    if (tok.length > 1 && tok[0] === "0") fail("leading zeros are not allowed");
    return checked(Number(tok));
  };
  const value = expr();
  if (pos !== tokens.length) fail(`unexpected ${JSON.stringify(tokens[pos])}`);
  return value === 0 ? 0 : value; // no "-0"
}

/** One question, e.g. "7 * 4 + 8": one-digit operands, an answer from 10 to 99. */
export function randomExpression(rng) {
  for (;;) {
    const o1 = rng.choice(OPS);
    const o2 = rng.choice(OPS);
    const expression = `${rng.randint(2, 9)} ${o1} ${rng.randint(2, 9)} ${o2} ${rng.randint(2, 9)}`;
    const value = safeEval(expression);
    if (value >= 10 && value <= 99) return expression;
  }
}

/** `calculator/<expression without spaces>`, as the Python task names it. */
export function taskId(expression, taskName = "calculator") {
  return `${taskName}/${expression.replaceAll(" ", "")}`;
}

/** The fixed held-out set: 64 distinct questions (the Python task's `eval_tasks()`). */
export function evalTasks() {
  const rng = new PyRandom("calculator-eval-v1");
  const seen = new Map();
  while (seen.size < 64) {
    const expression = randomExpression(rng);
    if (!seen.has(taskId(expression))) seen.set(taskId(expression), expression);
  }
  return [...seen.values()];
}

/** Endless seeded stream of training questions, skipping every held-out one (`train_tasks(seed)`). */
export function* trainTasks(seed) {
  const heldOut = new Set(evalTasks().map((e) => taskId(e)));
  const rng = new PyRandom(seed);
  for (;;) {
    const expression = randomExpression(rng);
    if (!heldOut.has(taskId(expression))) yield expression;
  }
}

function messageText(message) {
  const content = message?.content;
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((part) => (typeof part?.text === "string" ? part.text : "")).join("");
}

function callExpression(call) {
  const fn = call?.function ?? call; // tolerate flattened {name, arguments} calls
  if (fn?.name !== "calculator") return null;
  let args = fn.arguments;
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  const expression = args && typeof args === "object" ? args.expression : undefined;
  return typeof expression === "string" ? expression : null;
}

function runTool(expression) {
  if (expression === null) return 'error: call calculator with {"expression": "<arithmetic>"}';
  try {
    return String(safeEval(expression));
  } catch (e) {
    if (e instanceof ExpressionError) return `error: ${e.message}`;
    throw e;
  }
}

/** The final answer of an assistant message without tool calls: its last number, or null. */
export function parseAnswer(message) {
  const text = messageText(message).replace(/(?<=\d),(?=\d{3}\b)/g, "");
  const numbers = text.match(/-?\d+(?:\.\d+)?/g);
  return numbers ? Number(numbers[numbers.length - 1]) : null;
}

/** One episode of one question: `reset()`, then `step(assistantMessage)` until `done`. */
export class CalculatorEnv {
  constructor(expression, maxTurns = MAX_TURNS) {
    this.expression = expression;
    this.maxTurns = maxTurns;
    this.turns = 0;
    this.reward = 0;
    this.success = false;
    this.done = false;
  }

  reset() {
    return [
      { role: "system", content: SYSTEM_PROMPT },
      { role: "user", content: `What is ${this.expression}?` },
    ];
  }

  /** Answer one assistant message: `{messages, done}`, the tool messages to append. */
  step(reply) {
    if (this.done) throw new Error(`step() after the episode ended (${this.expression}, turn ${this.turns})`);
    this.turns++;
    const calls = reply.tool_calls ?? [];
    if (calls.length) {
      const messages = calls.map((call, i) => ({
        role: "tool",
        tool_call_id: call?.id || `call_${i}`,
        content: runTool(callExpression(call)),
      }));
      this.done = this.turns >= this.maxTurns;
      return { messages, done: this.done };
    }
    const answer = parseAnswer(reply);
    this.success = answer !== null && Math.abs(answer - safeEval(this.expression)) < 1e-6;
    this.reward = this.success ? 1 : 0;
    this.done = true;
    return { messages: [], done: true };
  }
}
