// promtool.check.mjs — /metrics of a server that has answered a few requests (chat and completions,
// streamed and not, one refused, one cancelled) passes `promtool check metrics` (Debian's prometheus
// package). promtool also lints names: the only finding allowed is the ':' in vLLM's names
// (vllm:num_requests_waiting, ...), kept because dashboards and autoscalers query them by that name;
// without them the text must be clean. Run by run.sh (ctest e2e_promtool), which skips it without
// promtool.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, test } from 'node:test';

import { MODEL, postJSON, sleep, startServer } from './helpers.mjs';

const PROMTOOL = process.env.MOESERVE_PROMTOOL ?? 'promtool';

function promtool(text) {
  const r = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(r.error, undefined, `running ${PROMTOOL}`);
  return { status: r.status, findings: (r.stdout + r.stderr).split('\n').filter(Boolean) };
}

let srv;
before(async () => { srv = await startServer(['--max-seqs', '4']); });
after(async () => {
  const code = await srv.stop();
  assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
});

test('promtool check metrics finds nothing but the vllm: names', async () => {
  const chat = `${srv.url}/v1/chat/completions`, cmpl = `${srv.url}/v1/completions`;
  const msgs = [{ role: 'user', content: 'And God said' }];
  assert.equal((await postJSON(chat, { model: MODEL, messages: msgs, max_tokens: 8, ignore_eos: true })).status, 200);
  assert.equal((await postJSON(chat, { model: MODEL, messages: msgs, max_tokens: 8, stream: true })).status, 200);
  assert.equal((await postJSON(cmpl, { model: MODEL, prompt: 'In the beginning', max_tokens: 8 })).status, 200);
  assert.equal((await postJSON(cmpl, { model: MODEL, prompt: 'x', max_tokens: -1 })).status, 400);
  // a streamed request dropped by its client: the cancelled series gets a count
  const ctl = new AbortController();
  const r = await fetch(cmpl, { method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: 'And', max_tokens: 900, ignore_eos: true, stream: true }) });
  await r.body.getReader().read();
  ctl.abort();
  await sleep(300);

  const text = await (await fetch(`${srv.url}/metrics`)).text();
  assert.match(text, /^vllm:time_to_first_token_seconds_count\{model_name="moeserve-tiny"\} [1-9]/m);
  assert.match(text, /^moeserve_generations_total\{reason="cancelled"\} [1-9]/m);

  const all = promtool(text);
  const other = all.findings.filter((l) => !/^vllm:[a-z0-9_]+ metric names should not contain ':'$/.test(l));
  assert.deepEqual(other, [], `promtool findings besides the vllm: names:\n${all.findings.join('\n')}`);
  assert.ok(all.findings.length > 0 && all.status !== 0, 'promtool reports the vllm: names (else this test is stale)');

  // the families without vLLM's names: clean, exit 0
  const ours = text.split('\n').filter((l) => !/^(# (HELP|TYPE) )?vllm:/.test(l)).join('\n');
  const clean = promtool(ours);
  assert.deepEqual(clean.findings, []);
  assert.equal(clean.status, 0);
});
