// helpers.mjs — starts `moeserve serve` on a free loopback port for the e2e tests, and small HTTP helpers.
//
// The server is started with --port 0 and prints "listening on http://127.0.0.1:PORT" on stdout;
// its stderr (one line per request) is kept and shown if a test fails. The openai client comes from
// tests/npm (pinned in package-lock.json, installed by `make npm-deps`).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SRC = process.env.MOESERVE_SRC ?? path.resolve(here, '../..');
export const BIN = process.env.MOESERVE_BIN ?? path.join(SRC, 'build/moeserve');
export const MODEL_DIR = path.join(SRC, 'models/moeserve-tiny');
export const MODEL = 'moeserve-tiny';

const require = createRequire(path.join(SRC, 'tests/npm/package.json'));
export const OpenAI = require('openai');

// MOESERVE_E2E_RANKS=N: the server as N CPU ranks under mpirun (--tensor-parallel N); mpirun
// forwards SIGTERM to the ranks, so stop() works the same. MOESERVE_E2E_RANK_ARGS: more options of
// the ranks (e.g. --data-parallel-attention on), split at spaces.
const RANKS = Number(process.env.MOESERVE_E2E_RANKS ?? 1);
const RANK_ARGS = (process.env.MOESERVE_E2E_RANK_ARGS ?? '').split(' ').filter(Boolean);

export async function startServer(extraArgs = [], modelDir = MODEL_DIR) {
  const args = ['serve', '--model', modelDir, '--port', '0', ...extraArgs];
  const [cmd, argv] = RANKS > 1
    ? ['mpirun', ['--oversubscribe', '-np', String(RANKS), BIN, ...args, '--tensor-parallel', String(RANKS),
                  ...RANK_ARGS]]
    : [BIN, args];
  const proc = spawn(cmd, argv, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, MOESERVE_LOG: process.env.MOESERVE_LOG ?? 'info',
           OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1',
           OMPI_MCA_btl_vader_single_copy_mechanism: 'none' },
  });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s:\n${stderr}`)), 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}:\n${stderr}`)); });
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  // under mpirun a SIGTERM to mpirun kills every rank; the server's own shutdown starts at rank 0
  const term = () => {
    const m = stderr.match(/rank 0 of \d+, pid (\d+)/);
    if (RANKS > 1 && m) process.kill(Number(m[1]), 'SIGTERM');
    else proc.kill('SIGTERM');
  };
  return {
    url,
    proc,
    term,
    stderr: () => stderr,
    client: (opts = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0, ...opts }),
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      term();
      const { code } = await exited;
      return code;
    },
    alive: () => proc.exitCode === null && proc.signalCode === null,
  };
}

export async function postJSON(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

// Prometheus text -> { name or name{labels}: value }
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
