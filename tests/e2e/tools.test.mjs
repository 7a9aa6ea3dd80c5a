// tools.test.mjs — tool calls through the official openai client: a tools request's answer parsed into
// tool_calls, a stream's deltas adding up to the same call, a tool-call history rendered as
// transformers renders it and answered, tool_choice, and the malformed requests refused.
//
// The model is tests/e2e/tool_model.mjs's rigged checkpoint (Qwen3's chat template, a lookup table
// for weights): its answers are known, so what is checked is the server's parsing and rendering.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { SRC, postJSON, startServer } from './helpers.mjs';
import { WANT, WANT_GLM, makeToolModel } from './tool_model.mjs';

const MODEL = 'moeserve-tools';
const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                  required: ['city'] },
  },
}];
const ASK = [{ role: 'user', content: "What's the weather in Paris?" }];

describe('tool calls (a checkpoint rigged to write them)', () => {
  let srv, client, dir;
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-tools-'));
    srv = await startServer(['--max-context', '2048', '--max-tokens', '512'], makeToolModel(path.join(dir, MODEL)));
    client = srv.client();
  });
  after(async () => {
    const code = await srv.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
  });

  test('a tools request: message.tool_calls parsed, content and reasoning apart, finish_reason tool_calls', async () => {
    assert.match(srv.stderr(), /tool calls are read as qwen3's/);
    const r = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, n: 2 });
    for (const c of r.choices) {
      const m = c.message;
      assert.equal(c.finish_reason, 'tool_calls');
      assert.equal(m.content, WANT.content);
      assert.equal(m.reasoning_content, WANT.reasoning);
      assert.equal(m.tool_calls.length, 1);
      const call = m.tool_calls[0];
      assert.equal(call.type, 'function');
      assert.match(call.id, /^call_[0-9a-f]{24}\d\d$/);
      assert.equal(call.function.name, WANT.name);
      assert.equal(call.function.arguments, WANT.arguments); // the model's text, as written
      assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
    }
    assert.notEqual(r.choices[0].message.tool_calls[0].id, r.choices[1].message.tool_calls[0].id);
  });

  test('streamed: delta.tool_calls (id and name first, arguments in pieces) add up to the same call; n 3: each choice its own', async () => {
    for (const n of [1, 3]) {
      const stream = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, stream: true, n });
      const ch = Array.from({ length: n }, () => ({ calls: [], content: '', reasoning: '', finish: null, pieces: 0 }));
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        assert.equal(chunk.choices.length, 1);
        const s = ch[c.index];
        assert.equal(s.finish, null, 'nothing after a choice\'s finish_reason');
        s.content += c.delta.content ?? '';
        s.reasoning += c.delta.reasoning_content ?? '';
        for (const d of c.delta.tool_calls ?? []) {
          if (!s.calls[d.index]) {
            assert.ok(d.id && d.type === 'function' && d.function.name, 'the first delta names the call');
            s.calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
          } else {
            assert.equal(d.id, undefined);
          }
          s.calls[d.index].arguments += d.function.arguments ?? '';
          s.pieces++;
        }
        if (c.finish_reason) s.finish = c.finish_reason;
      }
      for (const s of ch) {
        assert.equal(s.finish, 'tool_calls');
        assert.equal(s.content, WANT.content);
        assert.equal(s.reasoning, WANT.reasoning);
        assert.equal(s.calls.length, 1);
        assert.equal(s.calls[0].name, WANT.name);
        assert.equal(s.calls[0].arguments, WANT.arguments);
        assert.ok(s.pieces >= 2, `the arguments came in ${s.pieces} delta(s)`);
      }
      assert.equal(new Set(ch.map((s) => s.calls[0].id)).size, n, 'every choice\'s call its own id');
    }
  });

  test('a history with tool calls and results renders as transformers renders it, and is answered', async () => {
    // transformers' rendering of a chat with tools and a tool-call history (Qwen3's template)
    const golden = fs.readFileSync(path.join(SRC, 'tests/golden/tokenizers/qwen3/chats.jsonl'), 'utf8').split('\n')
      .filter(Boolean).map((l) => JSON.parse(l)).find((c) => c.tools && c.add_generation_prompt &&
        c.messages.some((m) => m.tool_calls));
    assert.ok(golden, 'the golden chat with tool calls');
    // as an OpenAI client sends it: arguments as JSON text
    const messages = golden.messages.map((m) => (m.tool_calls ? {
      ...m, content: null,
      tool_calls: m.tool_calls.map((t) => ({ ...t, function: { ...t.function, arguments: JSON.stringify(t.function.arguments) } })),
    } : m));
    const served = await postJSON(`${srv.url}/tokenize`, { model: MODEL, messages, tools: golden.tools });
    const want = await postJSON(`${srv.url}/tokenize`, { model: MODEL, prompt: golden.rendered });
    assert.equal(served.status, 200, served.text);
    assert.deepEqual(served.json.tokens, want.json.tokens);
    // answered: without thinking the rigged model answers in text
    const r = await client.chat.completions.create({ model: MODEL, messages, tools: golden.tools,
      chat_template_kwargs: { enable_thinking: false } });
    assert.equal(r.choices[0].message.content, WANT.answer);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].message.tool_calls, undefined);
  });

  test('tool_choice: none shows no tools and parses nothing; auto; malformed requests refused', async () => {
    const none = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, tool_choice: 'none' });
    assert.equal(none.choices[0].message.tool_calls, undefined);
    assert.equal(none.choices[0].finish_reason, 'stop');
    assert.match(none.choices[0].message.content, /<tool_call>/); // the text as written
    const withTools = await postJSON(`${srv.url}/tokenize`, { model: MODEL, messages: ASK, tools: TOOLS });
    const noTools = await postJSON(`${srv.url}/tokenize`, { model: MODEL, messages: ASK, tools: TOOLS, tool_choice: 'none' });
    assert.ok(withTools.json.count > noTools.json.count + 50, 'tool_choice none renders no tools');
    const auto = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, tool_choice: 'auto' });
    assert.equal(auto.choices[0].message.tool_calls.length, 1);
    const single = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, parallel_tool_calls: false });
    assert.equal(single.choices[0].message.tool_calls.length, 1);
    const refused = [
      [{ tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
      [{ tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice'],
      [{ tool_choice: 'required', tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
        properties: { n: { type: 'integer', minimum: 3 } } } } }] }, 'tools'], // a keyword outside the subset
      [{ tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0].function.name'],
      [{ tools: [{ type: 'retrieval' }] }, 'tools[0]'],
      [{ parallel_tool_calls: 'no' }, 'parallel_tool_calls'],
      [{ messages: [...ASK, { role: 'assistant', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{oops' } }] }] },
        'messages[1].tool_calls[0].function.arguments'],
    ];
    for (const [extra, param] of refused)
      await assert.rejects(client.chat.completions.create({ model: MODEL, messages: ASK, tools: TOOLS, ...extra }),
        (e) => e.status === 400 && e.param === param, JSON.stringify(extra));
  });

  test('tool_choice required and named: the answer is constrained to one call whose arguments fit the schema', async () => {
    // The rigged model would think first; under the constraint every token it prefers is masked, so
    // the call is written by the grammar alone, sampled among equal logits (seeded, so that the
    // stream repeats it); enums keep it short. The checkpoint pads its vocabulary past the
    // tokenizer's ids, as Qwen3's does: those ids must be masked too, or one is drawn.
    const enumTool = (name, key, values) => ({ type: 'function', function: { name, parameters: {
      type: 'object', properties: { [key]: { type: 'string', enum: values } }, required: [key], additionalProperties: false } } });
    const tools = [enumTool('set_unit', 'unit', ['celsius', 'fahrenheit']), enumTool('set_mode', 'mode', ['fast', 'slow'])];
    const check = (m, names) => {
      assert.equal(m.tool_calls.length, 1);
      const call = m.tool_calls[0];
      assert.ok(names.includes(call.function.name), call.function.name);
      const tool = tools.find((t) => t.function.name === call.function.name).function.parameters;
      const args = JSON.parse(call.function.arguments);
      const key = Object.keys(tool.properties)[0];
      assert.deepEqual(Object.keys(args), [key]);
      assert.ok(tool.properties[key].enum.includes(args[key]), call.function.arguments);
      return call;
    };
    for (const [choice, names] of [['required', ['set_unit', 'set_mode']],
                                   [{ type: 'function', function: { name: 'set_unit' } }, ['set_unit']]]) {
      const r = await client.chat.completions.create({ model: MODEL, messages: ASK, tools, tool_choice: choice, max_tokens: 400,
        seed: 7 });
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
      assert.equal(r.choices[0].message.content, null);
      const whole = check(r.choices[0].message, names);
      // streamed: the same call
      const stream = await client.chat.completions.create({ model: MODEL, messages: ASK, tools, tool_choice: choice,
        max_tokens: 400, seed: 7, stream: true });
      let name = '', args = '', finish = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        for (const d of c.delta.tool_calls ?? []) { name += d.function.name ?? ''; args += d.function.arguments ?? ''; }
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(name, whole.function.name);
      assert.equal(args, whole.function.arguments);
    }
  });
});

describe('/v1/responses with function tools (the rigged checkpoint)', () => {
  let srv, client, dir;
  const RTOOLS = TOOLS.map((t) => ({ type: 'function', ...t.function })); // the Responses API's flat form
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-tools-resp-'));
    srv = await startServer(['--max-context', '2048'], makeToolModel(path.join(dir, MODEL)));
    client = srv.client();
  });
  after(async () => {
    const code = await srv.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
  });

  test('function_call output items, whole and as events; a function_call_output history renders as chat does', async () => {
    const r = await client.responses.create({ model: MODEL, input: ASK[0].content, tools: RTOOLS });
    assert.equal(r.status, 'completed');
    assert.equal(r.output_text, WANT.content);
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, WANT.name);
    assert.equal(calls[0].arguments, WANT.arguments);
    assert.match(calls[0].call_id, /^call_/);
    assert.equal(r.tool_choice, 'auto');
    assert.equal(r.tools[0].name, 'get_weather');
    // streamed: an item announced with its name, argument deltas, their done event, the same call in the end
    const stream = await client.responses.create({ model: MODEL, input: ASK[0].content, tools: RTOOLS, stream: true });
    let args = '', added = null, done = null, completed = null;
    for await (const ev of stream) {
      if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') added = ev.item;
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
      if (ev.type === 'response.completed') completed = ev.response;
    }
    assert.equal(added.name, WANT.name);
    assert.equal(args, WANT.arguments);
    assert.equal(done, WANT.arguments);
    const fc = completed.output.find((o) => o.type === 'function_call');
    assert.equal(fc.arguments, WANT.arguments);
    assert.equal(fc.call_id, added.call_id);
    // the call and its output sent back: the same prompt as chat's messages with tool_calls and a tool result
    const back = await client.responses.create({ model: MODEL, tools: RTOOLS, max_output_tokens: 4, input: [
      { role: 'user', content: ASK[0].content },
      { type: 'function_call', call_id: 'call_1', name: WANT.name, arguments: WANT.arguments },
      { type: 'function_call_output', call_id: 'call_1', output: '18 C' }] });
    const chat = await postJSON(`${srv.url}/tokenize`, { model: MODEL, tools: TOOLS, messages: [
      { role: 'user', content: ASK[0].content },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: WANT.name,
        arguments: WANT.arguments } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18 C' }] });
    assert.equal(back.usage.input_tokens, chat.json.count);
    await assert.rejects(client.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }),
      (e) => e.status === 400 && e.param === 'tools');
    await assert.rejects(client.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'function', name: 'a b' }] }),
      (e) => e.status === 400 && e.param === 'tools[0].name');
  });
});

describe('tool calls in GLM-4.5\'s format (the rigged checkpoint with GLM-4.5\'s template)', () => {
  let srv, client, dir;
  const GLM_TOOLS = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { type: 'string' }, days: { type: 'integer' } } } } }];
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-tools-glm-'));
    srv = await startServer(['--max-context', '2048'], makeToolModel(path.join(dir, MODEL), 'glm45'));
    client = srv.client();
  });
  after(async () => {
    const code = await srv.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
  });

  test('glm45 chosen from the vocabulary; <arg_key>/<arg_value> pairs become JSON arguments (types from the schema)', async () => {
    assert.match(srv.stderr(), /tool calls are read as glm45's/);
    const r = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: GLM_TOOLS });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.reasoning_content, WANT_GLM.reasoning);
    assert.equal(m.content, WANT_GLM.content);
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].function.name, WANT_GLM.name);
    assert.equal(m.tool_calls[0].function.arguments, WANT_GLM.arguments);
    // streamed: the same call, its arguments one pair at a time
    const stream = await client.chat.completions.create({ model: MODEL, messages: ASK, tools: GLM_TOOLS, stream: true });
    let name = '', args = '', content = '', pieces = 0;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? '';
      for (const d of c.delta.tool_calls ?? []) { name += d.function.name ?? ''; args += d.function.arguments ?? ''; pieces++; }
    }
    assert.equal(content, WANT_GLM.content);
    assert.equal(name, WANT_GLM.name);
    assert.equal(args, WANT_GLM.arguments);
    assert.ok(pieces >= 2, `${pieces} delta(s)`);
  });

  test('tool_choice required and named: one call in GLM-4.5\'s tags, raw enum strings and JSON booleans that fit the schema', async () => {
    // The rigged model thinks as it always does (the grammar lets a reasoning block come first);
    // then the text it would write is masked and, as for Qwen3 above, the call is written by the
    // grammar among equal logits, seeded; enums and a boolean keep it short.
    const tool = (name, key, values) => ({ type: 'function', function: { name, parameters: { type: 'object',
      properties: { [key]: { type: 'string', enum: values }, quiet: { type: 'boolean' } }, required: [key, 'quiet'],
      additionalProperties: false } } });
    const tools = [tool('set_unit', 'unit', ['celsius', 'fahrenheit']), tool('set_mode', 'mode', ['fast', 'slow'])];
    const check = (m, names) => {
      assert.equal(m.tool_calls.length, 1);
      const call = m.tool_calls[0];
      assert.ok(names.includes(call.function.name), call.function.name);
      const props = tools.find((t) => t.function.name === call.function.name).function.parameters.properties;
      const args = JSON.parse(call.function.arguments);
      const key = Object.keys(props)[0];
      assert.deepEqual(Object.keys(args), [key, 'quiet'], call.function.arguments);
      assert.ok(props[key].enum.includes(args[key]), call.function.arguments); // raw text read back as the string
      assert.equal(typeof args.quiet, 'boolean', call.function.arguments);
      return call;
    };
    for (const [choice, names] of [['required', ['set_unit', 'set_mode']],
                                   [{ type: 'function', function: { name: 'set_mode' } }, ['set_mode']]]) {
      const r = await client.chat.completions.create({ model: MODEL, messages: ASK, tools, tool_choice: choice, max_tokens: 400,
        seed: 7 });
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
      assert.equal(r.choices[0].message.content, null);
      assert.equal(r.choices[0].message.reasoning_content, WANT_GLM.reasoning);
      const whole = check(r.choices[0].message, names);
      const stream = await client.chat.completions.create({ model: MODEL, messages: ASK, tools, tool_choice: choice,
        max_tokens: 400, seed: 7, stream: true });
      let name = '', args = '', finish = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        for (const d of c.delta.tool_calls ?? []) { name += d.function.name ?? ''; args += d.function.arguments ?? ''; }
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(name, whole.function.name);
      assert.equal(args, whole.function.arguments);
    }
    // a parameters schema the tags cannot carry is refused, naming it
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: ASK, tool_choice: 'required', tools: [
      { type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {
        s: { type: 'string', pattern: '^a+$' } } } } }] }),
    (e) => e.status === 400 && e.param === 'tools' && /tools\[0\]\.function\.parameters\.properties\.s: 'pattern'/.test(e.message));
  });
});

describe('tools where the model has no call format (the shipped tiny model)', () => {
  test('refused with 400 naming tools; with --lenient not offered, not parsed, logged', async () => {
    const ask = { model: 'moeserve-tiny', messages: ASK, tools: TOOLS, max_tokens: 4 };
    const strict = await startServer(['--max-context', '512']);
    try {
      await assert.rejects(strict.client().chat.completions.create(ask),
        (e) => e.status === 400 && e.param === 'tools' && e.code === 'unsupported_parameter');
      const none = await strict.client().chat.completions.create({ ...ask, tool_choice: 'none' });
      assert.equal(none.choices[0].message.tool_calls, undefined);
    } finally {
      assert.equal(await strict.stop(), 0);
    }
    const lenient = await startServer(['--max-context', '512', '--lenient']);
    try {
      const r = await lenient.client().chat.completions.create(ask);
      assert.equal(r.choices[0].message.tool_calls, undefined);
      assert.match(lenient.stderr(), /ignored \(--lenient\): tools/);
    } finally {
      assert.equal(await lenient.stop(), 0);
    }
  });
});
