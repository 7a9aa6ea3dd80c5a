// prefix.test.mjs — the prefix cache from the client's side: a chat with a ~1k-token system prompt,
// then another chat with the same system prompt and a different question. The second request's
// prompt blocks come from the cache (usage.prompt_tokens_details.cached_tokens), so its time to
// first token must be at least 3x lower. The figures are printed (NOTES.md quotes them).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { MODEL, MODEL_DIR, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--max-context', '2048', '--allow-long-context', '--max-seqs', '8', '--max-tokens', '512']);
});
after(async () => {
  assert.equal(await srv.stop(), 0, srv.stderr());
});

// Time from sending to the first streamed token, and the usage of a streamed chat.
async function ttft(client, system, question) {
  const t0 = performance.now();
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'system', content: system }, { role: 'user', content: question }],
    max_tokens: 4,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  });
  let first = null;
  let usage = null;
  for await (const chunk of stream) {
    if (first === null && chunk.choices[0]?.delta?.content) first = performance.now() - t0;
    if (chunk.usage) usage = chunk.usage;
  }
  return { ms: first, usage };
}

test('a repeated 1k-token system prompt: second TTFT at least 3x lower', async () => {
  const client = srv.client();
  // KJV verses from the model's validation text: about 1000 tokens
  const words = fs.readFileSync(path.join(MODEL_DIR, 'val.txt'), 'utf8').split(/\s+/);
  const system = words.slice(0, 760).join(' ');
  await ttft(client, 'warm up', 'Hello'); // pages the weights in, starts the threads
  const a = await ttft(client, system, 'What did Moses say?');
  const b = await ttft(client, system, 'Who was the king of Judah?');
  const c = await ttft(client, system, 'Where is Jerusalem?');
  const best = Math.min(b.ms, c.ms);
  console.log(`system prompt: ${a.usage.prompt_tokens} prompt tokens; TTFT first ${a.ms.toFixed(1)} ms, `
    + `repeated ${b.ms.toFixed(1)} / ${c.ms.toFixed(1)} ms (${b.usage.prompt_tokens_details.cached_tokens} cached): `
    + `${(a.ms / best).toFixed(1)}x lower`);
  assert.ok(a.usage.prompt_tokens >= 950 && a.usage.prompt_tokens <= 1200, `prompt of ${a.usage.prompt_tokens} tokens`);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 64);
  assert.ok(a.ms / best >= 3, `TTFT ${a.ms} ms then ${best} ms`);
});
