// format.test.mjs — structured output (response_format, text.format) through the official openai
// client: json_schema answers parse and validate against their schema (a small validator for the
// keywords used here), json_object answers are objects, streamed deltas add up to the same text,
// n choices each validate, max_tokens still cuts, unsupported keywords are a 400 naming them.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, postJSON, startServer } from './helpers.mjs';

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer' },
    role: { enum: ['king', 'prophet', 'scribe'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
    alive: { type: ['boolean', 'null'] },
  },
  required: ['name', 'age', 'role', 'tags', 'alive'],
  additionalProperties: false,
};

// The keywords the schemas here use, as JSON Schema defines them.
function validate(v, s, path = '$') {
  const types = s.type === undefined ? null : [].concat(s.type);
  const typeOf = (x) => (x === null ? 'null' : Array.isArray(x) ? 'array' : Number.isInteger(x) ? 'integer' : typeof x);
  if (types && !types.some((t) => t === typeOf(v) || (t === 'number' && typeof v === 'number')))
    return `${path}: ${JSON.stringify(v)} is not ${types.join('|')}`;
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) return `${path}: not in enum`;
  if (typeof v === 'string') {
    const n = [...v].length;
    if (s.maxLength !== undefined && n > s.maxLength) return `${path}: longer than ${s.maxLength}`;
    if (s.minLength !== undefined && n < s.minLength) return `${path}: shorter than ${s.minLength}`;
  }
  if (Array.isArray(v)) {
    if (s.maxItems !== undefined && v.length > s.maxItems) return `${path}: more than ${s.maxItems} items`;
    if (s.minItems !== undefined && v.length < s.minItems) return `${path}: fewer than ${s.minItems} items`;
    for (let i = 0; i < v.length && s.items; i++) {
      const e = validate(v[i], s.items, `${path}[${i}]`);
      if (e) return e;
    }
  }
  if (typeOf(v) === 'object') {
    for (const k of s.required ?? []) if (!(k in v)) return `${path}: missing ${k}`;
    for (const [k, x] of Object.entries(v)) {
      if (!s.properties?.[k]) {
        if (s.additionalProperties === false) return `${path}: unexpected key ${k}`;
        continue;
      }
      const e = validate(x, s.properties[k], `${path}.${k}`);
      if (e) return e;
    }
  }
  return null;
}

function assertValid(text, schema) {
  let v;
  assert.doesNotThrow(() => { v = JSON.parse(text); }, `not JSON: ${JSON.stringify(text)}`);
  const e = validate(v, schema);
  assert.equal(e, null, `${e} in ${text}`);
  return v;
}

describe('structured output', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer(['--max-context', '1024', '--max-seqs', '8']);
    client = srv.client();
  });
  after(async () => {
    const code = await srv.stop();
    assert.equal(code, 0, `server exit code\n${srv.stderr()}`);
  });

  const chat = (extra) => ({
    model: MODEL, messages: [{ role: 'user', content: 'Tell me of a man of Israel.' }], max_tokens: 600,
    temperature: 1, ...extra,
  });
  const schemaFormat = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: PERSON } };

  test('json_schema: every seed gives JSON that validates, finish_reason stop', async () => {
    for (let seed = 1; seed <= 6; seed++) {
      const r = await client.chat.completions.create(chat({ seed, response_format: schemaFormat }));
      assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
      assertValid(r.choices[0].message.content, PERSON);
    }
  });

  test('json_schema streamed: the deltas add up to the text of the same seed unstreamed', async () => {
    const req = chat({ seed: 11, response_format: schemaFormat });
    const whole = await client.chat.completions.create(req);
    let text = '';
    let finish = null;
    for await (const c of await client.chat.completions.create({ ...req, stream: true })) {
      text += c.choices[0]?.delta?.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, whole.choices[0].message.content);
    assert.equal(finish, 'stop');
    assertValid(text, PERSON);
  });

  test('json_object: an object; completions and n = 2 too', async () => {
    const r = await client.chat.completions.create(chat({ seed: 5, max_tokens: 300, response_format: { type: 'json_object' } }));
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
    const c = await client.completions.create({ model: MODEL, prompt: 'And Moses said', max_tokens: 600, seed: 2, temperature: 1,
      response_format: schemaFormat });
    assertValid(c.choices[0].text, PERSON);
    const n2 = await client.chat.completions.create(chat({ seed: 3, n: 2, response_format: schemaFormat }));
    assert.equal(n2.choices.length, 2);
    for (const ch of n2.choices) assertValid(ch.message.content, PERSON);
  });

  test('greedy (temperature 0) is held to the schema too', async () => {
    const r = await client.chat.completions.create(chat({ temperature: 0, response_format: schemaFormat }));
    assertValid(r.choices[0].message.content, PERSON);
  });

  test('/v1/responses text.format json_schema', async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Who was king?', max_output_tokens: 600, temperature: 1,
      text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } } });
    assertValid(r.output_text, PERSON);
  });

  test('max_tokens still applies: cut short, finish_reason length', async () => {
    const r = await client.chat.completions.create(chat({ seed: 1, max_tokens: 3, response_format: schemaFormat }));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 3);
    assert.ok(r.choices[0].message.content.startsWith('{'));
  });

  test('unsupported or malformed: 400 naming response_format and the keyword', async () => {
    const bad = [
      [{ type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', minimum: 0 } } }, /'minimum' is not supported/],
      [{ type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', pattern: '(a)\\1' } } } } },
        /properties\.a: 'pattern' "\(a\)\\1": this escape is not supported/],
      [{ type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', format: 'ipv6' } } }, /'format' "ipv6"/],
      [{ type: 'json_schema', json_schema: { name: 'x' } }, /schema' must be a JSON Schema object/],
      [{ type: 'bogus' }, /"bogus" is not one of/],
    ];
    for (const [rf, msg] of bad)
      await assert.rejects(client.chat.completions.create(chat({ response_format: rf })),
        (e) => e.status === 400 && e.param === 'response_format' && msg.test(e.message));
    // raw HTTP: the error object's code
    const r = await postJSON(srv.url + '/v1/chat/completions', chat({ response_format: bad[0][0] }));
    assert.equal(r.status, 400);
    assert.equal(r.json.error.code, 'unsupported_parameter');
    // {"type": "text"} asks nothing
    const t = await client.chat.completions.create(chat({ max_tokens: 4, response_format: { type: 'text' } }));
    assert.equal(t.choices.length, 1);
  });
});
