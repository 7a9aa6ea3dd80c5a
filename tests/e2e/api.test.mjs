// api.test.mjs — the OpenAI API contract, through the official openai client where a client would
// use it (chat streamed and not, completions, model list, log-probabilities, stop) and through raw
// HTTP for every class of bad request (status + OpenAI error body), the body size limit and the API key.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import { BIN, MODEL, MODEL_DIR, metrics, postJSON, sleep, startServer } from './helpers.mjs';

describe('openai client against moeserve serve', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer(['--max-context', '256', '--max-seqs', '32', '--max-tokens', '256']);
    client = srv.client();
  });
  after(async () => {
    const code = await srv.stop();
    assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
  });

  test('GET / is the chat page: self-contained HTML that talks to this server', async () => {
    const r = await fetch(srv.url + '/');
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    const html = await r.text();
    assert.ok(html.includes('/v1/chat/completions') && html.includes('/v1/models') && html.includes('reasoning_content'));
    assert.ok(!/(src|href)=["']https?:/.test(html), 'no outside resource');
  });

  test('/v1/responses through the openai client: a response object, its stream of typed events, refusals', async () => {
    const req = { model: MODEL, instructions: 'You are the KJV.', input: 'In the beginning', max_output_tokens: 8, temperature: 0 };
    const r = await client.responses.create(req);
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(r.status));
    const msg = r.output.find((o) => o.type === 'message');
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.equal(r.output_text, msg.content[0].text);
    assert.ok(r.usage.input_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens);
    const types = [], seqs = [];
    let deltas = '', done = null;
    const stream = await client.responses.create({ ...req, input: [{ role: 'user', content: [{ type: 'input_text', text: 'In the beginning' }] }], stream: true });
    for await (const ev of stream) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === 'response.output_text.delta') deltas += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
    }
    assert.equal(types[0], 'response.created');
    assert.ok(types.includes('response.output_item.added') && types.includes('response.output_text.done'));
    assert.ok(done, types.join(','));
    assert.deepEqual(seqs, seqs.map((_, i) => i));
    assert.equal(done.output.find((o) => o.type === 'message').content[0].text, deltas);
    await assert.rejects(client.responses.create({ ...req, tools: [{ type: 'web_search' }] }),
      (e) => e.status === 400 && e.param === 'tools' && e.code === 'unsupported_parameter');
    await assert.rejects(client.responses.create({ ...req, previous_response_id: 'resp_1' }),
      (e) => e.status === 400 && e.param === 'previous_response_id');
  });

  test('echo + logprobs + max_tokens 0 scores the prompt (lm-eval loglikelihood) as the logits command computes it', async () => {
    const prompt = 'In the beginning God created';
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 0, echo: true, logprobs: 1, temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.text, prompt);
    assert.equal(r.usage.completion_tokens, 0);
    const lp = c.logprobs.token_logprobs;
    assert.equal(lp[0], null);
    assert.equal(c.logprobs.top_logprobs[0], null);
    const ids = (await postJSON(srv.url + '/tokenize', { model: MODEL, prompt })).json.tokens;
    assert.equal(lp.length, ids.length);
    const out = path.join(os.tmpdir(), `echo_logits_${process.pid}.bin`);
    execFileSync(BIN, ['logits', '--model', MODEL_DIR, '--tokens', ids.join(','), '--out', out], { stdio: 'ignore' });
    const raw = fs.readFileSync(out);
    fs.unlinkSync(out);
    const x = new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4), V = x.length / ids.length;
    for (let i = 1; i < ids.length; i++) {
      const row = x.subarray((i - 1) * V, i * V);
      const mx = Math.max(...row);
      let sum = 0;
      for (const v of row) sum += Math.exp(v - mx);
      const want = row[ids[i]] - mx - Math.log(sum);
      assert.ok(Math.abs(want - lp[i]) < 1e-4, `token ${i}: ${lp[i]} vs the logits' ${want}`);
    }
    const g = await client.completions.create({ model: MODEL, prompt, max_tokens: 3, echo: true, logprobs: 2, temperature: 0 });
    assert.ok(g.choices[0].text.startsWith(prompt) && g.usage.completion_tokens === 3);
    assert.deepEqual(g.choices[0].logprobs.token_logprobs.slice(0, ids.length), lp);
    assert.equal(g.choices[0].logprobs.tokens.length, ids.length + 3);
    await assert.rejects(client.completions.create({ model: MODEL, prompt, max_tokens: 0 }), (e) => e.status === 400 && e.param === 'max_tokens');
    await assert.rejects(client.completions.create({ model: MODEL, prompt, echo: true, stream: true }), (e) => e.status === 400 && e.param === 'echo');
  });

  // prompt_logprobs against `moeserve logits` of the same ids: each position's token with its log p
  // (within 1e-4) and rank, and the k likeliest with theirs.
  function checkPromptLogprobs(pl, ids, K) {
    const out = path.join(os.tmpdir(), `prompt_logits_${process.pid}.bin`);
    execFileSync(BIN, ['logits', '--model', MODEL_DIR, '--tokens', ids.join(','), '--out', out], { stdio: 'ignore' });
    const raw = fs.readFileSync(out);
    fs.unlinkSync(out);
    const x = new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4), V = x.length / ids.length;
    assert.equal(pl.length, ids.length);
    assert.equal(pl[0], null);
    for (let i = 1; i < ids.length; i++) {
      const row = Array.from(x.subarray((i - 1) * V, i * V));
      const mx = Math.max(...row);
      let sum = 0;
      for (const v of row) sum += Math.exp(v - mx);
      const lsm = (id) => row[id] - mx - Math.log(sum);
      const own = pl[i][String(ids[i])];
      assert.ok(own, `position ${i}: the prompt token ${ids[i]} is there`);
      assert.ok(Math.abs(own.logprob - lsm(ids[i])) < 1e-4, `position ${i}: ${own.logprob} vs ${lsm(ids[i])}`);
      assert.equal(own.rank, 1 + row.filter((v) => v > row[ids[i]]).length);
      const order = row.map((v, id) => [v, id]).sort((a, b) => b[0] - a[0]).slice(0, K);
      for (let j = 0; j < K; j++) {
        const e = pl[i][String(order[j][1])];
        assert.ok(e, `position ${i}: the ${j + 1}-th likeliest (${order[j][1]})`);
        assert.ok(Math.abs(e.logprob - lsm(order[j][1])) < 1e-4);
        if (order[j][1] !== ids[i]) assert.equal(e.rank, j + 1);
      }
      assert.equal(Object.keys(pl[i]).length, order.some((o) => o[1] === ids[i]) ? K : K + 1);
    }
  }

  test('prompt_logprobs (vLLM\'s): each prompt token\'s log p, rank and the likeliest k, as the logits command computes them', async () => {
    const prompt = 'And the earth was without form';
    const ids = (await postJSON(srv.url + '/tokenize', { model: MODEL, prompt })).json.tokens;
    const K = 3;
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 2, temperature: 0, prompt_logprobs: K });
    const pl = r.choices[0].prompt_logprobs;
    checkPromptLogprobs(pl, ids, K);
    assert.equal(pl[1][String(ids[1])].decoded_token,
      (await postJSON(srv.url + '/detokenize', { model: MODEL, tokens: [ids[1]] })).json.prompt);
    // beside echo + logprobs 1: the echoed prompt's numbers are the same, one alternative each
    const both = await client.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, echo: true,
      logprobs: 1, prompt_logprobs: K });
    const lp = both.choices[0].logprobs;
    for (let i = 1; i < ids.length; i++) {
      assert.equal(lp.token_logprobs[i], both.choices[0].prompt_logprobs[i][String(ids[i])].logprob);
      assert.equal(Object.keys(lp.top_logprobs[i]).length, 1);
    }
    const zero = await client.completions.create({ model: MODEL, prompt, max_tokens: 1, prompt_logprobs: 0 });
    assert.deepEqual(Object.keys(zero.choices[0].prompt_logprobs[2]), [String(ids[2])]);
    const plain = await client.completions.create({ model: MODEL, prompt, max_tokens: 1 });
    assert.equal(plain.choices[0].prompt_logprobs, undefined);
    // chat: the response's prompt_logprobs (vLLM's place), over the template's ids, once for n 2
    const messages = [{ role: 'user', content: 'In the beginning' }];
    const chatIds = (await postJSON(srv.url + '/tokenize', { model: MODEL, messages })).json.tokens;
    const c = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 2, n: 2, prompt_logprobs: 2 });
    checkPromptLogprobs(c.prompt_logprobs, chatIds, 2);
    assert.equal(c.choices[0].prompt_logprobs, undefined);
    await assert.rejects(client.completions.create({ model: MODEL, prompt, prompt_logprobs: 1, stream: true }),
      (e) => e.status === 400 && e.param === 'prompt_logprobs');
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages, prompt_logprobs: 21 }),
      (e) => e.status === 400 && e.param === 'prompt_logprobs');
  });

  test('several prompts and n choices: one answer, choices in order, each the single answer, usage summed', async () => {
    const prompts = ['In the beginning', 'And God said'];
    const one = [];
    for (const prompt of prompts)
      one.push(await client.completions.create({ model: MODEL, prompt, max_tokens: 4, temperature: 0 }));
    const r = await client.completions.create({ model: MODEL, prompt: prompts, max_tokens: 4, temperature: 0, n: 2 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    for (let i = 0; i < 4; i++) assert.equal(r.choices[i].text, one[Math.floor(i / 2)].choices[0].text);
    assert.equal(r.usage.prompt_tokens, one[0].usage.prompt_tokens + one[1].usage.prompt_tokens);
    assert.equal(r.usage.completion_tokens, 16);
    const c = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], n: 3,
      max_tokens: 5, min_tokens: 5, temperature: 1, seed: 3 });
    assert.equal(c.choices.length, 3);
    assert.ok(new Set(c.choices.map((x) => x.message.content)).size > 1, 'the choices of a seed differ');
    const again = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], n: 3,
      max_tokens: 5, min_tokens: 5, temperature: 1, seed: 3 });
    assert.deepEqual(again.choices.map((x) => x.message.content), c.choices.map((x) => x.message.content));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'x', n: 17 }), (e) => e.status === 400 && e.param === 'n');
  });

  // Reads a stream's chunks through the openai client: each choice's text (or content), role and
  // finish_reason by index, the usage chunks, the ids.
  async function collectChoices(stream, chat) {
    const text = {}, finish = {}, roles = {}, ids = new Set(), usage = [];
    for await (const chunk of stream) {
      ids.add(chunk.id);
      if (chunk.usage) usage.push(chunk.usage);
      assert.ok(chunk.usage ? chunk.choices.length === 0 : chunk.choices.length === 1, 'one choice a chunk');
      for (const c of chunk.choices) {
        assert.equal(finish[c.index], undefined, `choice ${c.index}: a chunk after its finish_reason`);
        text[c.index] = (text[c.index] ?? '') + ((chat ? c.delta.content : c.text) ?? '');
        if (chat && c.delta.role) roles[c.index] = (roles[c.index] ?? 0) + 1;
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    return { text, finish, roles, ids, usage };
  }

  test('n choices and several prompts streamed: one chunk a choice, each choice its finish_reason, usage once', async () => {
    const chat = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], n: 3, max_tokens: 6, min_tokens: 6,
      temperature: 1, seed: 7 };
    const whole = await client.chat.completions.create(chat);
    const s = await collectChoices(await client.chat.completions.create({ ...chat, stream: true,
      stream_options: { include_usage: true } }), true);
    assert.deepEqual([0, 1, 2].map((i) => s.text[i]), whole.choices.map((c) => c.message.content));
    assert.deepEqual(s.finish, { 0: 'length', 1: 'length', 2: 'length' });
    assert.deepEqual(s.roles, { 0: 1, 1: 1, 2: 1 });
    assert.equal(s.ids.size, 1, 'every chunk carries the one id');
    assert.equal(s.usage.length, 1);
    assert.deepEqual(s.usage[0], whole.usage); // the prompt's tokens once
    assert.equal(s.usage[0].completion_tokens, 18);

    const prompts = ['In the beginning', 'And God said'];
    const comp = { model: MODEL, prompt: prompts, max_tokens: 5, temperature: 0, n: 2 };
    const w = await client.completions.create(comp);
    const c = await collectChoices(await client.completions.create({ ...comp, stream: true,
      stream_options: { include_usage: true } }), false);
    assert.deepEqual([0, 1, 2, 3].map((i) => c.text[i]), w.choices.map((x) => x.text));
    assert.equal(Object.keys(c.finish).length, 4);
    assert.deepEqual(c.usage, [w.usage]);
    const plain = await collectChoices(await client.completions.create({ ...comp, n: 1, stream: true }), false);
    assert.deepEqual(plain.text, { 0: w.choices[0].text, 1: w.choices[2].text });
    assert.equal(plain.usage.length, 0, 'no usage without include_usage');

    // raw: [DONE] once, last, after the usage chunk
    const res = await fetch(`${srv.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...comp, stream: true, stream_options: { include_usage: true } }) });
    assert.equal(res.status, 200);
    const events = (await res.text()).split('\n\n').filter((x) => x).map((x) => x.replace(/^data: /, ''));
    assert.equal(events.filter((x) => x === '[DONE]').length, 1);
    assert.equal(events.at(-1), '[DONE]');
    assert.ok(JSON.parse(events.at(-2)).usage);
    assert.equal(events.slice(0, -2).filter((x) => JSON.parse(x).usage).length, 0);
  });

  test('models.list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids, [MODEL]);
  });

  test('chat, not streamed', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'system', content: 'You are the KJV.' }, { role: 'user', content: 'In the beginning' }],
      max_tokens: 12,
      temperature: 0,
      ignore_eos: true,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(r.choices[0].message.content.length > 0);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 12);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  });

  test('chat, streamed, with usage; same text as not streamed', async () => {
    const req = {
      model: MODEL,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'And Moses said' }] }],
      max_completion_tokens: 10,
      temperature: 0,
      ignore_eos: true,
    };
    const whole = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish = null;
    let usage = null;
    let role = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        role ??= c.delta.role;
        text += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(finish, 'length');
    assert.equal(text, whole.choices[0].message.content);
    assert.deepEqual(usage, whole.usage);
  });

  test('`created` is the request\'s time, not the server\'s start', async () => {
    const req = { model: MODEL, prompt: 'And', max_tokens: 1, temperature: 0 };
    const a = await client.completions.create(req);
    await sleep(1100);
    const b = await client.completions.create(req);
    assert.ok(b.created > a.created, `${a.created} then ${b.created}`);
    assert.ok(Math.abs(b.created - Date.now() / 1000) < 5);
  });

  test('sampling parameters: logit_bias steers, stop_token_ids ends, min_tokens holds off the end, ranges refused', async () => {
    const X = 100;
    const det = await postJSON(srv.url + '/detokenize', { model: MODEL, tokens: [X] });
    const base = { model: MODEL, prompt: 'In the beginning', max_tokens: 3, temperature: 0 };
    const a = await client.completions.create({ ...base, logit_bias: { [X]: 100 } });
    assert.equal(a.usage.completion_tokens, 3);
    assert.equal(a.choices[0].text, det.json.prompt.repeat(3));
    const b = await client.completions.create({ ...base, logit_bias: { [X]: 100 }, stop_token_ids: [X] });
    assert.equal(b.usage.completion_tokens, 0);
    assert.equal(b.choices[0].finish_reason, 'stop');
    assert.equal(b.choices[0].text, '');
    // the shipped model ends a chat at once (its likeliest token after the template is the end)
    const chat = { model: MODEL, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 6, temperature: 0 };
    const c0 = await client.chat.completions.create(chat);
    const c1 = await client.chat.completions.create({ ...chat, min_tokens: 4 });
    assert.ok(c1.usage.completion_tokens >= 4, `min_tokens 4: ${c1.usage.completion_tokens} (without: ${c0.usage.completion_tokens})`);
    const d = await client.completions.create({ ...base, max_tokens: 8, frequency_penalty: 2, presence_penalty: 2,
      repetition_penalty: 1.3, min_p: 0.1, seed: 3, temperature: 0.7 });
    assert.equal(d.choices.length, 1);
    for (const [extra, param] of [[{ frequency_penalty: 5 }, 'frequency_penalty'], [{ min_p: 2 }, 'min_p'],
      [{ logit_bias: { 999999: 1 } }, 'logit_bias'], [{ min_tokens: 9 }, 'min_tokens']])
      await assert.rejects(client.completions.create({ ...base, ...extra }), (e) => e.status === 400 && e.param === param);
  });

  test('what the server does not implement is refused, not ignored (tools, response_format, echo)', async () => {
    const base = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 };
    const cases = [
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }, 'tools'],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'integer', minimum: 1 } } } }, 'response_format'],
      [{ echo: true }, 'echo'], // chat has no echo
    ];
    for (const [extra, param] of cases)
      await assert.rejects(client.chat.completions.create({ ...base, ...extra }),
        (e) => e.status === 400 && e.param === param && e.code === 'unsupported_parameter');
    // the no-op values pass
    const r = await client.chat.completions.create({ ...base, frequency_penalty: 0, tools: [], tool_choice: 'none' });
    assert.equal(r.choices.length, 1);
  });

  test('completions, streamed and not, identical greedy text', async () => {
    const req = { model: MODEL, prompt: 'And God said, Let there be', max_tokens: 16, temperature: 0, ignore_eos: true };
    const whole = await client.completions.create(req);
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.usage.completion_tokens, 16);
    let text = '';
    let n = 0;
    for await (const chunk of await client.completions.create({ ...req, stream: true })) {
      text += chunk.choices[0]?.text ?? '';
      n++;
    }
    assert.ok(n >= 16);
    assert.equal(text, whole.choices[0].text);
  });

  test('a greedy request gives the same text alone and with 31 others beside it', async () => {
    const req = { model: MODEL, prompt: 'Blessed are the meek: for they', max_tokens: 24, temperature: 0, ignore_eos: true };
    const alone = (await client.completions.create(req)).choices[0].text;
    const others = [];
    for (let i = 0; i < 31; i++) {
      const o = {
        model: MODEL,
        prompt: `${'And it came to pass '.repeat(1 + (i % 7))}number ${i}`,
        max_tokens: 8 + (i % 17),
        temperature: i % 2 ? 0.9 : 0,
        seed: i,
        ignore_eos: true,
      };
      others.push(i % 3 ? client.completions.create(o) : client.completions.create({ ...o, stream: true }).then(async (s) => {
        for await (const chunk of s) void chunk;
      }));
    }
    const mine = client.completions.create(req);
    const [res] = await Promise.all([mine, ...others]);
    assert.equal(res.choices[0].text, alone);
  });

  test('the model\'s generation_config.json sets what a request leaves out (moeserve-tiny: do_sample false)', async () => {
    const req = { model: MODEL, prompt: 'And the LORD said', max_tokens: 10, ignore_eos: true };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    const greedy = await client.completions.create({ ...req, temperature: 0 });
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.equal(a.choices[0].text, greedy.choices[0].text);
  });

  test('seeded sampling repeats', async () => {
    const req = { model: MODEL, prompt: 'The LORD is my shepherd', max_tokens: 12, temperature: 1, top_p: 0.9, top_k: 50, seed: 42 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    assert.equal(a.choices[0].text, b.choices[0].text);
  });

  test('log-probabilities (completions and chat)', async () => {
    const c = await client.completions.create({ model: MODEL, prompt: 'And the earth', max_tokens: 5, temperature: 0, logprobs: 3, ignore_eos: true });
    const lp = c.choices[0].logprobs;
    assert.equal(lp.tokens.length, 5);
    assert.equal(lp.token_logprobs.length, 5);
    assert.equal(lp.top_logprobs.length, 5);
    assert.equal(lp.tokens.join(''), c.choices[0].text);
    for (let i = 0; i < 5; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const best = Math.max(...Object.values(lp.top_logprobs[i]));
      assert.equal(lp.token_logprobs[i], best); // greedy: the chosen token is the most likely
    }
    const ch = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2, ignore_eos: true,
    });
    const content = ch.choices[0].logprobs.content;
    assert.equal(content.length, 4);
    for (const t of content) {
      assert.equal(t.top_logprobs.length, 2);
      assert.equal(t.logprob, t.top_logprobs[0].logprob);
      assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
    }
  });

  test('stop strings end the text before them', async () => {
    const req = { model: MODEL, prompt: 'And God said', max_tokens: 30, temperature: 0, ignore_eos: true };
    const full = (await client.completions.create(req)).choices[0].text;
    const stop = full.slice(12, 16);
    const cut = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ ...req, stop: [stop, 'zzzz-never'] });
    assert.equal(r.choices[0].text, cut);
    assert.equal(r.choices[0].finish_reason, 'stop');
    let text = '';
    let finish = null;
    for await (const chunk of await client.completions.create({ ...req, stop, stream: true })) {
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, cut);
    assert.equal(finish, 'stop');
  });

  test('a stop string ends generation on the server, not only the text (the reader cancels it)', async () => {
    const req = { model: MODEL, prompt: 'And God said', max_tokens: 200, temperature: 0, ignore_eos: true };
    const full = (await client.completions.create({ ...req, max_tokens: 30 })).choices[0].text;
    const stop = full.slice(12, 16);
    const before = (await metrics(srv.url)).moeserve_generation_tokens_total;
    for (const stream of [false, true]) {
      const r = await client.completions.create({ ...req, stop, stream });
      if (stream) for await (const chunk of r); // eslint-disable-line no-unused-vars
    }
    await sleep(200); // the generations' ends reach the metrics as their connections close
    const spent = (await metrics(srv.url)).moeserve_generation_tokens_total - before;
    // both stop within the first 30 tokens (+ a step or two in flight), far from the 200 asked for
    assert.ok(spent <= 2 * 36, `${spent} tokens generated for two stopped requests`);
  });

  test('completions without max_tokens generate OpenAI\'s default of 16 tokens', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'And God said', temperature: 0, ignore_eos: true });
    assert.equal(r.usage.completion_tokens, 16);
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  test('/tokenize is the CLI\'s tokenizer (and chat the template\'s ids); /detokenize inverts it', async () => {
    const text = 'In the beginning God created the heaven and the earth.';
    const cli = JSON.parse(execFileSync(BIN, ['tokenize', '--model', MODEL_DIR, '--special', '--text', text]).toString());
    let r = await postJSON(`${srv.url}/tokenize`, { model: MODEL, prompt: text });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json.tokens, cli);
    assert.equal(r.json.count, cli.length);
    assert.equal(r.json.max_model_len, 256);
    r = await postJSON(`${srv.url}/detokenize`, { model: MODEL, tokens: cli });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.prompt, text);
    const chat = await postJSON(`${srv.url}/tokenize`, { model: MODEL, messages: [{ role: 'user', content: text }] });
    assert.equal(chat.status, 200, chat.text);
    assert.ok(chat.json.count > cli.length, 'the template adds its own tokens');
    const whole = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: text }], max_tokens: 1, temperature: 0,
    });
    assert.equal(whole.usage.prompt_tokens, chat.json.count);
    for (const [path, body, field] of [
      ['/tokenize', { model: 'nope', prompt: 'x' }, 'model'],
      ['/detokenize', { tokens: [1, -3] }, 'tokens'],
      ['/detokenize', { tokens: [1e9] }, 'tokens'],
      ['/detokenize', { tokens: 'abc' }, 'tokens'],
    ]) {
      r = await postJSON(`${srv.url}${path}`, body);
      assert.ok(r.status === 400 || r.status === 404, `${path} ${JSON.stringify(body)}: ${r.status}`);
      assert.equal(r.json.error.param, field);
    }
    assert.equal((await fetch(`${srv.url}/tokenize`)).status, 405);
  });

  test('/version, GET /v1/models/{id}, HEAD, OPTIONS', async () => {
    let r = await fetch(`${srv.url}/version`);
    assert.equal(r.status, 200);
    assert.match((await r.json()).version, /^\d+\.\d+\.\d+$/);
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    await assert.rejects(client.models.retrieve('other'), (e) => e.status === 404);
    r = await fetch(`${srv.url}/health`, { method: 'HEAD' });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), '');
    r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'OPTIONS' });
    assert.equal(r.status, 204);
    assert.match(r.headers.get('allow'), /POST/);
    assert.equal(r.headers.get('access-control-allow-origin'), null, 'no CORS unless --allowed-origins');
  });

  test('the client raises the server\'s errors', async () => {
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 5, n: 17 }),
      (e) => e.status === 400 && e.error?.param === 'n',
    );
    await assert.rejects(
      client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
      (e) => e.status === 404 && e.code === 'model_not_found',
    );
  });

  test('every malformed request class gets a 4xx with an OpenAI error body', async () => {
    const u = srv.url;
    const chat = `${u}/v1/chat/completions`;
    const comp = `${u}/v1/completions`;
    const msg = [{ role: 'user', content: 'hi' }];
    const long = 'And it came to pass '.repeat(100); // > 256 tokens
    const cases = [
      [comp, '{"model": "moeserve-tiny", "prompt": ', 400, null, 'malformed JSON'],
      [comp, '[1, 2, 3]', 400, null, 'not an object'],
      [comp, { prompt: 'x' }, 400, 'model', 'model missing'],
      [comp, { model: 7, prompt: 'x' }, 400, 'model', 'model not a string'],
      [comp, { model: MODEL }, 400, 'prompt', 'prompt missing'],
      [comp, { model: MODEL, prompt: { a: 1 } }, 400, 'prompt', 'prompt wrong type'],
      [comp, { model: MODEL, prompt: [1, -2] }, 400, 'prompt', 'negative token id'],
      [comp, { model: MODEL, prompt: [999999] }, 400, 'prompt', 'token id outside the vocabulary'],
      [comp, { model: MODEL, prompt: ['a', 5] }, 400, 'prompt', 'a prompt list of a text and a number'],
      [comp, { model: MODEL, prompt: 'x', max_tokens: 'ten' }, 400, 'max_tokens', 'max_tokens wrong type'],
      [comp, { model: MODEL, prompt: 'x', max_tokens: 1.5 }, 400, 'max_tokens', 'max_tokens not an integer'],
      [comp, { model: MODEL, prompt: 'x', max_tokens: 0 }, 400, 'max_tokens', 'max_tokens 0'],
      [comp, { model: MODEL, prompt: 'x', max_tokens: 100000 }, 400, 'max_tokens', 'max_tokens past the context'],
      [comp, { model: MODEL, prompt: long }, 400, 'prompt', 'prompt longer than the context'],
      [comp, { model: MODEL, prompt: 'x', temperature: 'hot' }, 400, 'temperature', 'temperature wrong type'],
      [comp, { model: MODEL, prompt: 'x', temperature: 3 }, 400, 'temperature', 'temperature out of range'],
      [comp, { model: MODEL, prompt: 'x', top_p: 0 }, 400, 'top_p', 'top_p out of range'],
      [comp, { model: MODEL, prompt: 'x', top_k: 'k' }, 400, 'top_k', 'top_k wrong type'],
      [comp, { model: MODEL, prompt: 'x', seed: 'abc' }, 400, 'seed', 'seed wrong type'],
      [comp, { model: MODEL, prompt: 'x', stop: 5 }, 400, 'stop', 'stop wrong type'],
      [comp, { model: MODEL, prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, 400, 'stop', 'too many stops'],
      [comp, { model: MODEL, prompt: 'x', stream: 'yes' }, 400, 'stream', 'stream wrong type'],
      [comp, { model: MODEL, prompt: 'x', stream_options: { include_usage: true } }, 400, 'stream_options', 'stream_options without stream'],
      [comp, { model: MODEL, prompt: 'x', n: 17 }, 400, 'n', 'n past 16'],
      [comp, { model: MODEL, prompt: 'x', logprobs: 9 }, 400, 'logprobs', 'logprobs out of range'],
      [chat, { model: MODEL }, 400, 'messages', 'messages missing'],
      [chat, { model: MODEL, messages: 'hi' }, 400, 'messages', 'messages wrong type'],
      [chat, { model: MODEL, messages: [] }, 400, 'messages', 'messages empty'],
      [chat, { model: MODEL, messages: [{ content: 'x' }] }, 400, 'messages[0].role', 'role missing'],
      [chat, { model: MODEL, messages: [{ role: 'user', content: 3 }] }, 400, 'messages[0].content', 'content wrong type'],
      [chat, { model: MODEL, messages: msg, top_logprobs: 2 }, 400, 'top_logprobs', 'top_logprobs without logprobs'],
      [chat, { model: MODEL, messages: msg, logprobs: true, top_logprobs: 21 }, 400, 'top_logprobs', 'top_logprobs out of range'],
      [chat, { model: MODEL, messages: msg, max_completion_tokens: -1 }, 400, 'max_completion_tokens', 'max_completion_tokens negative'],
      [chat, { model: MODEL, messages: [{ role: 'user', content: long }] }, 400, 'messages', 'chat prompt longer than the context'],
      [chat, { model: 'gpt-4', messages: msg }, 404, 'model', 'unknown model'],
    ];
    for (const [url, body, status, param, what] of cases) {
      const r = await postJSON(url, body);
      assert.equal(r.status, status, `${what}: status ${r.status} ${r.text}`);
      assert.ok(r.json?.error, `${what}: no error body: ${r.text}`);
      assert.equal(typeof r.json.error.message, 'string', what);
      assert.equal(typeof r.json.error.type, 'string', what);
      assert.ok('code' in r.json.error && 'param' in r.json.error, what);
      assert.equal(r.json.error.param, param, `${what}: param`);
    }
    // routes and methods
    let r = await fetch(`${u}/v1/nothing`);
    assert.equal(r.status, 404);
    assert.ok((await r.json()).error);
    r = await fetch(comp);
    assert.equal(r.status, 405);
    assert.ok((await r.json()).error);
    // unknown fields are tolerated
    const ok = await postJSON(comp, { model: MODEL, prompt: 'x', max_tokens: 2, frobnicate: { a: [1] }, user: 'me', presence_penalty: 0 });
    assert.equal(ok.status, 200, ok.text);
  });

  test('a body of more JSON values than the context can use is refused before it is parsed', async () => {
    const body = JSON.stringify({ model: MODEL, prompt: Array.from({ length: 800000 }, (_, i) => i % 200) });
    const before = (await metrics(srv.url)).process_resident_memory_bytes;
    // parsed (the bug), each of these took ~176 MB of nodes while it lived
    for (let round = 0; round < 2; round++) {
      const rs = await Promise.all(Array.from({ length: 32 }, () =>
        fetch(`${srv.url}/v1/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json' } })
          .then(async (r) => ({ status: r.status, json: await r.json() }))));
      for (const r of rs) {
        assert.equal(r.status, 400);
        assert.match(r.json.error.message, /JSON values/);
      }
    }
    const after = (await metrics(srv.url)).process_resident_memory_bytes;
    assert.ok(after - before < 128 * 2 ** 20, `RSS ${before / 2 ** 20} -> ${after / 2 ** 20} MiB`);
  });

  test('a 10 MB body is refused with 413', async () => {
    const big = JSON.stringify({ model: MODEL, prompt: 'a'.repeat(10 * 1024 * 1024) });
    const r = await postJSON(`${srv.url}/v1/completions`, big);
    assert.equal(r.status, 413);
    assert.equal(r.json.error.code, 'request_too_large');
    // the server is still fine
    assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  });
});

describe('--api-key', () => {
  test('Bearer key required on /v1/, not on /health and /metrics', async () => {
    const srv = await startServer(['--api-key', 's3cret', '--max-context', '128']);
    try {
      let r = await fetch(`${srv.url}/v1/models`);
      assert.equal(r.status, 401);
      assert.equal((await r.json()).error.code, 'invalid_api_key');
      r = await fetch(`${srv.url}/v1/models`, { headers: { authorization: 'Bearer wrong' } });
      assert.equal(r.status, 401);
      await assert.rejects(srv.client({ apiKey: 'nope' }).models.list(), (e) => e.status === 401);
      const models = await srv.client({ apiKey: 's3cret' }).models.list();
      assert.equal(models.data[0].id, MODEL);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
      assert.equal((await fetch(`${srv.url}/metrics`)).status, 200);
    } finally {
      await srv.stop();
    }
  });

  test('an unauthenticated body is refused from the headers, not read into memory', async () => {
    const srv = await startServer(['--api-key', 's3cret', '--max-context', '128']);
    try {
      const body = JSON.stringify({ model: MODEL, prompt: Array.from({ length: 800000 }, (_, i) => i % 200) });
      assert.ok(body.length > 2 ** 21, `${body.length} bytes`);
      const before = (await metrics(srv.url)).process_resident_memory_bytes;
      // 192 bodies of ~2.8 MB, 64 at a time: read into memory (the bug), 64 of them alone are 180 MB
      for (let round = 0; round < 3; round++) {
        const rs = await Promise.all(Array.from({ length: 64 }, () =>
          fetch(`${srv.url}/v1/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json' } })
            .then(async (r) => { await r.arrayBuffer(); return r.status; }, () => 'reset')));
        for (const s of rs) assert.ok(s === 401 || s === 'reset', `status ${s}`);
      }
      const after = (await metrics(srv.url)).process_resident_memory_bytes;
      assert.ok(after - before < 64 * 2 ** 20, `RSS ${before / 2 ** 20} -> ${after / 2 ** 20} MiB`);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
    } finally {
      await srv.stop();
    }
  });
});

describe('--allowed-origins (CORS)', () => {
  test('a listed origin gets the preflight and the answer; another does not; no key needed for a preflight', async () => {
    const srv = await startServer(['--allowed-origins', 'http://ok.test,http://also.test', '--api-key', 'k', '--max-context', '128']);
    try {
      let r = await fetch(`${srv.url}/v1/chat/completions`, {
        method: 'OPTIONS', headers: { origin: 'http://ok.test', 'access-control-request-method': 'POST' },
      });
      assert.equal(r.status, 204);
      assert.equal(r.headers.get('access-control-allow-origin'), 'http://ok.test');
      assert.match(r.headers.get('access-control-allow-headers'), /Authorization/);
      assert.match(r.headers.get('access-control-allow-methods'), /POST/);
      r = await fetch(`${srv.url}/v1/models`, { headers: { origin: 'http://also.test', authorization: 'Bearer k' } });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('access-control-allow-origin'), 'http://also.test');
      r = await fetch(`${srv.url}/v1/models`, { headers: { origin: 'http://evil.test', authorization: 'Bearer k' } });
      assert.equal(r.headers.get('access-control-allow-origin'), null);
      r = await fetch(`${srv.url}/tokenize`, { method: 'POST', body: '{"prompt":"x"}' });
      assert.equal(r.status, 401, 'the tokenizer routes are behind the key too');
    } finally {
      await srv.stop();
    }
  });
});

describe('bounded queue and deadlines', () => {
  test('a full queue answers 503 with Retry-After; a request past its deadline ends with finish_reason timeout', async () => {
    // 0.25 s: the tiny model decodes ~1500 tok/s on a 2-core EPYC, so 1000 tokens take ~0.7 s (1 s let a
    // streamed request finish on a fast machine)
    const srv = await startServer(['--max-context', '1024', '--max-seqs', '1', '--max-tokens', '64', '--max-queue', '1',
      '--request-timeout', '0.25']);
    try {
      const long = { model: MODEL, prompt: 'And', max_tokens: 1000, temperature: 0, ignore_eos: true };
      const all = await Promise.all(Array.from({ length: 6 }, () => postJSON(`${srv.url}/v1/completions`, long)));
      const busy = all.filter((r) => r.status === 503);
      assert.ok(busy.length >= 1, all.map((r) => r.status).join(','));
      for (const r of busy) {
        assert.equal(r.headers.get('retry-after'), '1');
        assert.equal(r.json.error.code, 'overloaded');
      }
      // 1000 tokens do not fit in 0.25 s: the deadline ends them with what they have, a 200 (the
      // SDKs retry a 408) and finish_reason "timeout"
      const late = all.filter((r) => r.status === 200);
      assert.ok(late.length >= 1, all.map((r) => r.status).join(','));
      for (const r of late) {
        assert.equal(r.json.choices[0].finish_reason, 'timeout');
        assert.ok(r.json.usage.completion_tokens < 1000);
      }
      // streamed: the text so far, then the timeout as the finish reason and [DONE]
      const stream = await srv.client().completions.create({ ...long, stream: true });
      let finish = null;
      let text = '';
      for await (const c of stream) {
        text += c.choices[0]?.text ?? '';
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, 'timeout');
      assert.ok(text.length > 0);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
    } finally {
      await srv.stop();
    }
  });
});

describe('SIGTERM', () => {
  test('new requests get 503, a running stream ends with an error event and [DONE] after the grace period', async () => {
    const srv = await startServer(['--max-context', '4096', '--allow-long-context', '--max-seqs', '2',
      '--max-tokens', '64', '--shutdown-grace', '1']);
    // ~3000 tokens at ~1500 tok/s: longer than the 1 s grace
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'And', max_tokens: 4000, temperature: 0, ignore_eos: true,
        stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    let text = new TextDecoder().decode((await reader.read()).value);
    srv.term();
    await sleep(200);
    const late = await postJSON(`${srv.url}/v1/completions`, { model: MODEL, prompt: 'And', max_tokens: 4 });
    assert.equal(late.status, 503);
    assert.equal(late.json.error.code, 'shutting_down');
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    assert.match(text, /"code":"shutting_down"/);
    assert.ok(text.trimEnd().endsWith('data: [DONE]'), text.slice(-200));
    assert.equal(await srv.stop(), 0);
  });
});

describe('several choices streamed to a client that leaves', () => {
  test('every choice is cancelled when the client goes', async () => {
    const srv = await startServer(['--max-context', '4096', '--allow-long-context', '--max-seqs', '4',
      '--max-tokens', '4000']);
    const ac = new AbortController();
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'And', max_tokens: 4000, temperature: 0, ignore_eos: true,
        stream: true, n: 3 }),
      signal: ac.signal,
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();
    ac.abort();
    let m;
    for (let i = 0; i < 100; i++) { // the choices end as the server sees the connection gone
      await sleep(50);
      m = await metrics(srv.url);
      if (m.moeserve_running_requests === 0) break;
    }
    assert.equal(m.moeserve_running_requests, 0);
    assert.ok(m.moeserve_generation_tokens_total < 3 * 4000, `${m.moeserve_generation_tokens_total} tokens`);
    assert.equal(srv.stderr().match(/client gone, cancelled/g)?.length, 3, srv.stderr());
    assert.equal(await srv.stop(), 0);
  });
});

describe('connection limits', () => {
  // idle sockets (opened, never a request) hold connections the way a client that locks others out does
  const idle = async (url, n) => {
    const { hostname, port } = new URL(url);
    return Promise.all(Array.from({ length: n }, () => new Promise((resolve, reject) => {
      const s = net.connect(Number(port), hostname, () => resolve(s));
      s.on('error', reject);
    })));
  };
  const status = async (url) => {
    const r = await fetch(url, { headers: { connection: 'close' } });
    return { status: r.status, retry: r.headers.get('retry-after'), json: await r.json() };
  };

  test('--idle-timeout closes a silent connection', async () => {
    const srv = await startServer(['--max-context', '128', '--idle-timeout', '1']);
    try {
      const [s] = await idle(srv.url, 1);
      const t0 = Date.now();
      const closed = await new Promise((resolve) => {
        const timer = setTimeout(() => resolve(false), 8000);
        s.on('close', () => { clearTimeout(timer); resolve(true); });
      });
      assert.ok(closed, 'the idle connection is still open after 8 s');
      assert.ok(Date.now() - t0 >= 900, `closed after ${Date.now() - t0} ms`);
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
    } finally {
      await srv.stop();
    }
  });

  test('past --max-connections-per-client and --max-connections: 503 with Retry-After, not a reset', async () => {
    const srv = await startServer(['--max-context', '128', '--max-connections', '6', '--max-connections-per-client',
      '3']);
    try {
      let socks = await idle(srv.url, 3);
      await sleep(100);
      let r = await status(`${srv.url}/health`);
      assert.equal(r.status, 503);
      assert.equal(r.retry, '1');
      assert.equal(r.json.error.code, 'too_many_connections');
      assert.match(r.json.error.message, /limit of 3 a client/);
      for (const s of socks) s.destroy();
      await sleep(200);
      assert.equal((await status(`${srv.url}/health`)).status, 200);
    } finally {
      await srv.stop();
    }
    const srv2 = await startServer(['--max-context', '128', '--max-connections', '3']);
    try {
      const socks = await idle(srv2.url, 3);
      await sleep(100);
      const r = await status(`${srv2.url}/health`);
      assert.equal(r.status, 503);
      assert.match(r.json.error.message, /server's limit of 3/);
      for (const s of socks) s.destroy();
    } finally {
      await srv2.stop();
    }
  });
});
