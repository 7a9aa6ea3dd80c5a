#!/usr/bin/env python3
"""glm5_estimate.py — one MoE layer of the GLM-5 slice from two `moeserve bench --json` runs of L1
and L2 layers (ms a layer = the difference / (L2 - L1): embedding, lm_head, the dense layer and a
step's fixed costs cancel), its bytes against the copy bandwidth of the run, and from it the
estimate for the whole 78-layer model on 8x H200 and 8x RTX PRO 6000 (docs/lab/journal.md "GLM-5
estimate"): the per-layer efficiency against the measured device's datasheet bandwidth, applied
unchanged to the target GPUs. tools/bench_glm5_slice.sh runs it after its benches; any pair of
bench files does (tools/gpu_glm5_b1.sh's bench_NAME_L2_rR.json / _L4_).

    python3 tools/glm5_estimate.py --l1-json A.json --l2-json B.json --l1 2 --l2 4 --config config.json
        [--context 2048] [--steps 32] [--kv-dtype bf16] [--index-key-dtype f32] [--datasheet-tb-s 3.35]
        [--json-out F]

--config: the slice's config.json (`make_synth_checkpoint --preset glm5-slice --config-only`).
--datasheet-tb-s: the measured device's memory bandwidth; by default from its name in the bench
file (spec/devices.md: H200 4.8, H100 3.35, B200 8, RTX PRO 6000 1.8).
"""
import argparse, json, math, sys

ap = argparse.ArgumentParser(description="GLM-5 slice: per-MoE-layer figures and the 8-GPU estimate")
ap.add_argument("--l1-json", required=True)
ap.add_argument("--l2-json", required=True)
ap.add_argument("--l1", type=int, required=True)
ap.add_argument("--l2", type=int, required=True)
ap.add_argument("--config", required=True)
ap.add_argument("--context", type=int, default=2048, help="the bench's --decode-context")
ap.add_argument("--steps", type=int, default=32, help="the bench's --decode")
ap.add_argument("--kv-dtype", default="bf16", choices=["f32", "bf16", "fp8"])
ap.add_argument("--index-key-dtype", choices=["f32", "bf16", "fp8"],
                help="the DSA keys' type (default: the latent's; f32 for runs before the keys followed it)")
ap.add_argument("--datasheet-tb-s", type=float)
ap.add_argument("--json-out")
args = ap.parse_args()
if args.l2 <= args.l1:
    sys.exit("glm5_estimate: need --l1 < --l2")
b1, b2 = (json.load(open(p)) for p in (args.l1_json, args.l2_json))
cfg = json.load(open(args.config))
L1, L2, steps, ctx, dt = args.l1, args.l2, args.steps, args.context, args.kv_dtype
WARMUP = 2  # BENCH_WARMUP_STEPS: untimed steps after the prompt
DATASHEET = {"H200": 4.8, "H100": 3.35, "B200": 8.0, "RTX PRO 6000": 1.8}  # TB/s, spec/devices.md
dev = b2.get("device", "")
bw_tb = args.datasheet_tb_s or next((v for k, v in DATASHEET.items() if k in dev), None)
if bw_tb is None:
    sys.exit(f"glm5_estimate: no datasheet bandwidth for '{dev}': pass --datasheet-tb-s")
DEV_BW = bw_tb * 1e12

# ---- measured: one MoE layer
# row bytes as backend.h lays them out: fp8 = e4m3 codes + an f32 scale per 128 + bf16 rope;
# the indexer keys take the latent's type (kv_cache_index_dtype())
R_kv, R_rope, D_idx = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["index_head_dim"]
idt = args.index_key_dtype or dt
lat_b = R_kv + 4 * math.ceil(R_kv / 128) + 2 * R_rope if dt == "fp8" else (R_kv + R_rope) * {"f32": 4, "bf16": 2}[dt]
idx_b = D_idx + 4 * math.ceil(D_idx / 128) if idt == "fp8" else D_idx * {"f32": 4, "bf16": 2}[idt]
topk = cfg["index_topk"]
# keys a timed step sees, averaged over the steps: the prompt, the warm-up tokens, half the steps
T = ctx + WARMUP + (steps + 1) / 2
kv_seq = min(T, topk) * lat_b + T * idx_b  # attention reads the selected rows, the indexer every key
copy = b2.get("copy_gb_s")
f = lambda v, spec=".1f": "n/a" if v is None else format(v, spec)
rows = []
r1 = {r["batch"]: r for r in b1["decode"]}
print(f"\nGLM-5 slice on {b2['device']}: L1 = {L1}, L2 = {L2} layers (1 dense + MoE), context {ctx}, "
      f"{steps} timed steps; copy bandwidth {f(copy, '.0f')} GB/s (read+write)")
print(f"{'batch':>5} {'ms/step L1':>10} {'ms/step L2':>10} {'ms/layer':>9} {'MB/layer':>9} {'GB/s':>7} "
      f"{'% copy':>7} {'% ' + format(bw_tb, 'g') + ' TB/s':>10}")
for r in b2["decode"]:
    b, a = r["batch"], r1.get(r["batch"], {})
    if "ms_per_step" not in r or "ms_per_step" not in a:
        print(f"{b:>5} failed: {r.get('error') or a.get('error') or 'no row'}")
        continue
    ms = (r["ms_per_step"] - a["ms_per_step"]) / (L2 - L1)
    w = (r["weight_bytes_per_step"] - a["weight_bytes_per_step"]) / (L2 - L1)
    kv = b * kv_seq
    mb = (w + kv) / 1e6
    gbs = mb / ms if ms > 0 else None
    pc = 100 * gbs / copy if gbs and copy else None
    eff = gbs * 1e9 / DEV_BW if gbs else None
    rows.append({"batch": b, "ms_per_step_L1": a["ms_per_step"], "ms_per_step_L2": r["ms_per_step"],
                 "ms_per_layer": ms, "weight_bytes_per_layer": w, "kv_bytes_per_layer": kv,
                 "mb_per_layer": mb, "gb_s": gbs, "pct_of_copy": pc, "efficiency_vs_datasheet": eff})
    print(f"{b:>5} {a['ms_per_step']:>10.3f} {r['ms_per_step']:>10.3f} {ms:>9.4f} {mb:>9.1f} {f(gbs, '.0f'):>7} "
          f"{f(pc):>7} {f(eff and 100 * eff):>10}")
weights = ", ".join("%.1f" % (x["weight_bytes_per_layer"] / 1e6) for x in rows)
print(f"(MB/layer = weights ({weights} MB) + batch x {kv_seq / 1e6:.3f} MB of KV per sequence: "
      f"{dt} latent {lat_b} B x min(T, {topk}) + {idt} indexer key {idx_b} B x T, T = {T:.1f})")

# ---- estimate: the 78-layer model, 8 GPUs, experts split 8 ways (NOTES.md "GLM-5 estimate")
D, V, H = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
Rq, Rkv, dn, dr, dv = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], \
    cfg["v_head_dim"]
HI, DI, E, k, I = cfg["index_n_heads"], cfg["index_head_dim"], cfg["n_routed_experts"], \
    cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
FF, NS = cfg["intermediate_size"], cfg["n_shared_experts"]
LAYERS, DENSE = 78, 3  # spec C.1: num_hidden_layers, first_k_dense_replace
MOE = LAYERS - DENSE
fp4 = lambda r, c: r * c // 2 + r * c // 16 + 8  # E2M1 codes + E4M3 block scales + two f32 scalars
bf = lambda r, c: 2 * r * c
attn_rep = fp4(Rq, D) + fp4(Rkv + dr, D) + fp4(HI * DI, Rq) + fp4(DI, D) + bf(HI, D)  # not split by heads
attn_split = fp4(H * (dn + dr), Rq) + fp4(H * (dn + dv), Rkv) + fp4(D, H * dv)  # q_b, kv_b, o_proj
router, expert = bf(E, D), 2 * fp4(I, D) + fp4(D, I)
shared, dense, lm = NS * expert, 2 * fp4(FF, D) + fp4(D, FF), bf(V, D)
norms = LAYERS * (2 * D + Rq + Rkv + 2 * DI) + MOE * E + D
p_layer_attn = Rq * D + H * (dn + dr) * Rq + (Rkv + dr) * D + H * (dn + dv) * Rkv + D * H * dv + HI * DI * Rq + \
    DI * D + HI * D
params = LAYERS * p_layer_attn + DENSE * 3 * FF * D + MOE * (E + NS) * 3 * I * D + MOE * E * D + 2 * V * D + norms
active = LAYERS * p_layer_attn + DENSE * 3 * FF * D + MOE * ((k + NS) * 3 * I * D + E * D) + V * D
total_bytes = LAYERS * (attn_rep + attn_split) + MOE * (router + E * expert + shared) + DENSE * dense + 2 * lm
kv_tok = LAYERS * (Rkv + dr + DI) * 2  # bf16 latent + indexer key, every layer "full"
kv_seq16 = min(ctx, topk) * (Rkv + dr) * 2 + ctx * DI * 2  # bf16, per sequence per layer at the bench context
print(f"\nGLM-5 (78 layers, 3 dense): {params / 1e9:.2f} B parameters ({active / 1e9:.2f} B active per token), "
      f"{total_bytes / 1e9:.1f} GB in NVFP4 (embedding, lm_head, routers, indexer weights_proj BF16); MoE layer "
      f"{(attn_rep + attn_split + router + E * expert + shared) / 1e9:.3f} GB; KV (bf16 latent + indexer key) "
      f"{kv_tok} B/token")

N = 8
def comb(n, r):
    return math.comb(n, r)
def max_experts_one_gpu():  # E[max over GPUs of the top-k experts it holds], k of E, E/N per GPU
    g, tot = E // N, comb(E, k)
    e = 0.0
    for m in range(k):  # P(max > m) = 1 - #(every GPU <= m) / C(E, k)
        poly = [1]
        for _ in range(N):
            nxt = [0] * (len(poly) + m)
            for i, c in enumerate(poly):
                for j in range(m + 1):
                    if i + j <= k:
                        nxt[i + j] += c * comb(g, j)
            poly = nxt[:k + 1]
        e += 1 - (poly[k] if len(poly) > k else 0) / tot
    return e
emax1 = max_experts_one_gpu()
g_remote = (N - 1) * (1 - comb(E - E // N, k) / comb(E, k))  # other GPUs one token's experts land on
DEV = {  # spec/devices.md; interconnect per direction per GPU; latency per collective: assumptions
    "8x H200": {"bw": 4.8e12, "mem": 141e9, "link": "NVLink 4", "link_bw": 450e9, "lat": 10e-6},
    "8x RTX PRO 6000": {"bw": 1.8e12, "mem": 96e9, "link": "PCIe 5.0 x16", "link_bw": 64e9, "lat": 25e-6},
}
RESERVE = 4e9  # activations, workspaces, CUDA context per GPU
effs = {x["batch"]: x["efficiency_vs_datasheet"] for x in rows if x["efficiency_vs_datasheet"]}
est, cand = [], []
if effs:
    print(f"8-GPU estimate (E[max experts on one GPU] at batch 1 = {emax1:.2f}; a token's experts reach "
          f"{g_remote:.2f} other GPUs; efficiency = measured per-layer GB/s / "
          f"{bw_tb:g} TB/s ({dev}'s datasheet), the same on both)")
    print(f"{'system':16s} {'batch':>5} {'mode':>4} {'eff %':>6} {'weights/GPU GB':>14} {'MB/GPU/step':>11} "
          f"{'mem ms':>7} {'comm ms':>7} {'ms/step':>8} {'tok/s':>8} {'tok/s/seq':>9} {'KV tokens':>10}")
for name, sysd in DEV.items():
    for b, eff in sorted(effs.items()):
        best = None
        for mode in ("TP", "DP"):
            coll = lambda v: sysd["lat"] + v / sysd["link_bw"]
            if mode == "TP":  # heads, shared expert, dense MLP split; latent KV of every sequence on every GPU
                ex = emax1 if b == 1 else (E / N) * (1 - (1 - k / E) ** b)
                moe_b = attn_rep + attn_split / N + router + shared / N + ex * expert + b * kv_seq16
                dense_b = attn_rep + attn_split / N + dense / N + b * kv_seq16
                comm = LAYERS * 2 * coll(2 * (N - 1) / N * b * D * 2)  # two all-reduces per layer
                w_gpu = LAYERS * (attn_rep + attn_split / N) + MOE * (router + shared / N + E / N * expert) + \
                    DENSE * dense / N + 2 * lm / N
                kv_cap = (sysd["mem"] - w_gpu - RESERVE) / kv_tok  # replicated: the system holds this many
            else:  # attention replicated, each GPU its b/N sequences; dispatch + combine all-to-alls
                s = math.ceil(b / N)
                ex = (E / N) * (1 - (1 - k / E) ** b) if b > 1 else emax1
                moe_b = attn_rep + attn_split + router + shared + ex * expert + s * kv_seq16
                dense_b = attn_rep + attn_split + dense + s * kv_seq16
                comm = MOE * 2 * coll(s * g_remote * D * 2)
                w_gpu = LAYERS * (attn_rep + attn_split) + MOE * (router + shared + E / N * expert) + \
                    DENSE * dense + 2 * lm / N
                kv_cap = N * (sysd["mem"] - w_gpu - RESERVE) / kv_tok
            step_bytes = MOE * moe_b + DENSE * dense_b + lm / N
            t_mem = step_bytes / (sysd["bw"] * eff)
            t = t_mem + comm + coll(b * 4)  # + the vocab-parallel lm_head's argmax exchange
            row = {"system": name, "batch": b, "mode": mode, "efficiency": eff, "weights_per_gpu_gb": w_gpu / 1e9,
                   "mb_per_gpu_step": step_bytes / 1e6, "mem_ms": 1e3 * t_mem, "comm_ms": 1e3 * comm,
                   "ms_per_step": 1e3 * t, "tok_s": b / t, "tok_s_per_seq": 1 / t, "kv_tokens": kv_cap,
                   "fits": w_gpu + RESERVE < sysd["mem"]}
            cand.append(row)
            if row["fits"] and (best is None or t < best["ms_per_step"] / 1e3):
                best = row
        if best:
            est.append(best)
            x = best
            print(f"{name:16s} {b:>5} {x['mode']:>4} {100 * eff:>6.1f} {x['weights_per_gpu_gb']:>14.1f} "
                  f"{x['mb_per_gpu_step']:>11.0f} {x['mem_ms']:>7.2f} {x['comm_ms']:>7.2f} {x['ms_per_step']:>8.2f} "
                  f"{x['tok_s']:>8.0f} {x['tok_s_per_seq']:>9.1f} {x['kv_tokens']:>10.3g}")
print("(TP: attention heads / shared expert / dense MLP split 8 ways, 2 all-reduces per layer; DP: attention "
      "replicated, sequences split, dispatch + combine all-to-all per MoE layer; the faster one is shown.\n"
      " Collective latency 10 us NVLink / 25 us PCIe is an assumption: replace it by nccl-tests figures.)")
if args.json_out:
    json.dump({"device": b2.get("device"), "L1": L1, "L2": L2, "context": ctx, "steps": steps, "copy_gb_s": copy,
               "kv_bytes_per_seq_layer": kv_seq, "per_layer": rows,
               "glm5": {"parameters": params, "active_parameters": active, "nvfp4_bytes": total_bytes,
                        "moe_layer_bytes": attn_rep + attn_split + router + E * expert + shared,
                        "attention_bytes": attn_rep + attn_split, "expert_bytes": expert, "kv_bytes_per_token": kv_tok},
               "estimate": est, "estimate_both_modes": cand, "bench_L1": b1, "bench_L2": b2},
              open(args.json_out, "w"), indent=2)
