#!/usr/bin/env bash
# bench_glm5_slice.sh — issue 7's benchmark on the GPU machine: per-layer decode time of a
# GLM-5-width slice (make_synth_checkpoint --preset glm5-slice, NVFP4, random weights) at batch
# 1 and 64 against the bytes a layer must read, and from it the estimate for the whole 78-layer
# model on 8x H200 and 8x RTX PRO 6000 that NOTES.md ("GLM-5 estimate (issue 7)") describes.
#
#   tools/bench_glm5_slice.sh [BUILD_DIR]      (default: build; needs BUILD_DIR/moeserve built
#                                               with CUDA and BUILD_DIR/make_synth_checkpoint)
#
# Method: two slices of L1 and L2 layers (1 dense + MoE layers each) run the same bench:
#   moeserve bench --backend cuda --batch 1,64 --prompt-len 256 --decode 32 --decode-context 2048
# per-layer decode time = (ms/step(L2) - ms/step(L1)) / (L2 - L1), which cancels embedding,
# lm_head, sampling, the dense layer and per-step launch overheads. Bytes one MoE layer reads per
# step = the difference of the bench's weight bytes per step (attention + indexer + router +
# shared expert + the routed experts touched: 8 at batch 1, 256 (1 - (1 - 8/256)^64) = 222.4
# expected at batch 64) divided the same way, plus the latent KV rows and indexer keys this
# engine reads (its cache is f32) for the timed steps' context, per sequence.
#
# Disk: only the L2 slice is written (42.9 GB for 8 layers: 5.56 GB per MoE layer, 3.8 GB of
# embedding + lm_head); the L1 slice is a directory with its own config.json and a link to the
# same model.safetensors (the loader reads layers 0..L-1 only). The write is skipped when
# $SLICE_DIR/L$L2 holds a complete one. Time: if the L1 bench took so long that L2 would end
# past TIME_BUDGET seconds since the start, L2 is lowered (a shorter link directory; at least
# L1 + 2) and the JSON records the layers used.
# Output: a table on stdout; bench_L*.json/.log, info.json and glm5_slice.json (per-layer
# figures + the 8-GPU estimate) in $OUT when it is set (the device tool's folder), else in
# BUILD_DIR/bench_glm5/.
#
# Environment (defaults): L1 (4), L2 (8), BATCHES (1,64), PROMPT_LEN (256), DECODE_STEPS (32),
# DECODE_CONTEXT (2048), SLICE_DIR (/tmp/glm5-slice), BACKEND (cuda), KV_CACHE_DTYPE (unset: bf16;
# f32 for the reference cache), CONTEXT_FILL (unset: prefill; random: random cache rows, for
# 32768-token contexts without their prefill), SMEM_BUDGET (unset; e.g.
# 101376 plans an sm_120's tiles on the H200), TIME_BUDGET (220), STEP_TIMEOUT (200 s per step).
set -u
build=${1:-build}
build=$(cd "$build" && pwd) || exit 2
logs=${OUT:-$build/bench_glm5}
mkdir -p "$logs"
root=${SLICE_DIR:-/tmp/glm5-slice}
l1=${L1:-4}
l2=${L2:-8}
batches=${BATCHES:-1,64}
prompt_len=${PROMPT_LEN:-256}
steps=${DECODE_STEPS:-32}
context=${DECODE_CONTEXT:-2048}
backend=${BACKEND:-cuda}
budget=${TIME_BUDGET:-220}
step_timeout=${STEP_TIMEOUT:-200}
for bin in moeserve make_synth_checkpoint; do
    [ -x "$build/$bin" ] || { echo "bench_glm5_slice: $build/$bin is not built" >&2; exit 2; }
done
if ! [ "$l1" -ge 1 ] 2>/dev/null || ! [ "$l2" -gt "$l1" ] 2>/dev/null; then
    echo "bench_glm5_slice: need 1 <= L1 < L2 (got L1=$l1 L2=$l2)" >&2
    exit 2
fi
command -v python3 >/dev/null || { echo "bench_glm5_slice: python3 is needed for the analysis" >&2; exit 2; }
synth() { "$build/make_synth_checkpoint" --preset glm5-slice --format nvfp4 "$@"; }

t_all=$SECONDS
stamp() { echo "[$((SECONDS - t_all)) s] $*"; }
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv >"$logs/gpu.txt" 2>&1
    cat "$logs/gpu.txt"
fi

# 1. the L2 slice, written once; .complete is written last, so a cut-off write is never reused
long=$root/L$l2
want="glm5-slice nvfp4 layers=$l2 seed=1"
mkdir -p "$root"
if [ -f "$long/.complete" ] && [ "$(cat "$long/.complete")" = "$want" ]; then
    stamp "checkpoint: reusing $long ($want)"
else
    rm -rf "$long"
    mkdir -p "$long"
    need=$(synth --out "$long" --layers "$l2" --config-only) ||
        { echo "bench_glm5_slice: cannot plan the slice" >&2; exit 1; }
    avail=$(df -PB1 "$long" | awk 'NR == 2 {print $4}')
    if [ -n "$avail" ] && [ "$avail" -lt "$need" ]; then
        echo "bench_glm5_slice: $long: $((avail / 1000000000)) GB free, the $l2-layer slice needs" \
            "$((need / 1000000000)) GB (set SLICE_DIR to a larger disk, or a smaller L2)" >&2
        exit 1
    fi
    stamp "checkpoint: writing $long ($want, $((need / 1000000)) MB)"
    timeout "$step_timeout" "$build/make_synth_checkpoint" --out "$long" --preset glm5-slice --format nvfp4 \
        --layers "$l2" >"$logs/make_synth.log" 2>&1
    rc=$?
    tr '\r' '\n' <"$logs/make_synth.log" | tail -n 1
    [ $rc = 0 ] || { echo "bench_glm5_slice: make_synth_checkpoint failed with exit $rc" >&2; exit 1; }
    echo "$want" >"$long/.complete"
fi

# A shorter slice: its own config.json, the long slice's weights through a link.
slice_dir() {
    local d=$root/L$1
    [ "$1" = "$l2" ] && { echo "$long"; return 0; }
    rm -rf "$d" && mkdir -p "$d" && synth --out "$d" --layers "$1" --config-only >/dev/null &&
        ln -s "$long/model.safetensors" "$d/model.safetensors" && echo "$d"
}

# 2. the two benches (L1 first: its time bounds L2's)
bench_slice() { # $1 = layers; sets bench_s
    local dir t0=$SECONDS
    dir=$(slice_dir "$1") || { echo "bench_glm5_slice: cannot make the $1-layer slice" >&2; return 1; }
    stamp "moeserve bench --backend $backend, $1 layers ($dir)"
    timeout "$step_timeout" "$build/moeserve" bench --backend "$backend" --model "$dir" --batch "$batches" \
        --prompt-len "$prompt_len" --decode "$steps" --decode-context "$context" \
        ${SMEM_BUDGET:+--smem-budget "$SMEM_BUDGET"} ${KV_CACHE_DTYPE:+--kv-cache-dtype "$KV_CACHE_DTYPE"} \
        ${CONTEXT_FILL:+--context-fill "$CONTEXT_FILL"} --json \
        >"$logs/bench_L$1.json" 2>"$logs/bench_L$1.log"
    local rc=$?
    bench_s=$((SECONDS - t0))
    stamp "bench of $1 layers: exit $rc, $bench_s s"
    # exit 1 with JSON: one batch size failed, its row says why
    [ -s "$logs/bench_L$1.json" ] || { tail -n 5 "$logs/bench_L$1.log" >&2; return 1; }
}
bench_slice "$l1" || exit 1
left=$((budget - (SECONDS - t_all)))
w1=$((bench_s > 0 ? bench_s : 1))
if [ $((w1 * l2 / l1)) -gt "$left" ]; then
    # a bench's time grows at most in proportion to the layers (lm_head, start-up do not)
    fit=$((left * l1 / w1))
    if [ "$fit" -lt $((l1 + 2)) ]; then
        echo "bench_glm5_slice: the $l1-layer bench took ${w1} s; $left s are left of TIME_BUDGET=$budget," \
            "too few for $((l1 + 2)) layers" >&2
        exit 1
    fi
    stamp "L2 lowered from $l2 to $fit layers to stay within TIME_BUDGET=$budget s"
    l2_run=$fit
else
    l2_run=$l2
fi
bench_slice "$l2_run" || exit 1
"$build/moeserve" info --model "$root/L$l1" ${KV_CACHE_DTYPE:+--kv-cache-dtype "$KV_CACHE_DTYPE"} --json \
    >"$logs/info.json" 2>/dev/null # KV layout only

# 3. per-layer figures and the 8-GPU estimate
python3 - "$logs" "$l1" "$l2_run" "$steps" "$context" "$long/config.json" <<'PY' | tee "$logs/summary.txt"
import json, math, sys

logs, L1, L2, steps, ctx, cfg_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), sys.argv[6]
b1, b2 = (json.load(open(f"{logs}/bench_L{n}.json")) for n in (L1, L2))
info, cfg = json.load(open(f"{logs}/info.json")), json.load(open(cfg_path))
WARMUP = 2  # BENCH_WARMUP_STEPS: untimed steps after the prompt
H200_BW = 4.8e12  # datasheet HBM3e (spec/devices.md); efficiency below is against it

# ---- measured: one MoE layer
# row bytes as backend.h lays them out: fp8 = e4m3 codes + an f32 scale per 128 + bf16 rope;
# the indexer keys stay f32 under bf16 and f32, fp8 under fp8
dt, R_kv, R_rope, D_idx = info["kv_dtype"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["index_head_dim"]
if dt == "fp8":
    lat_b = R_kv + 4 * math.ceil(R_kv / 128) + 2 * R_rope
    idx_b = D_idx + 4 * math.ceil(D_idx / 128)
else:
    lat_b = info["kv_mla"]["latent_values_per_token_layer"] * {"f32": 4, "bf16": 2}[dt]
    idx_b = info["kv_mla"]["indexer_values_per_token_layer"] * 4
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
      f"{'% copy':>7} {'% 4.8 TB/s':>10}")
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
    eff = gbs * 1e9 / H200_BW if gbs else None
    rows.append({"batch": b, "ms_per_step_L1": a["ms_per_step"], "ms_per_step_L2": r["ms_per_step"],
                 "ms_per_layer": ms, "weight_bytes_per_layer": w, "kv_bytes_per_layer": kv,
                 "mb_per_layer": mb, "gb_s": gbs, "pct_of_copy": pc, "efficiency_vs_datasheet": eff})
    print(f"{b:>5} {a['ms_per_step']:>10.3f} {r['ms_per_step']:>10.3f} {ms:>9.4f} {mb:>9.1f} {f(gbs, '.0f'):>7} "
          f"{f(pc):>7} {f(eff and 100 * eff):>10}")
weights = ", ".join("%.1f" % (x["weight_bytes_per_layer"] / 1e6) for x in rows)
print(f"(MB/layer = weights ({weights} MB) + batch x {kv_seq / 1e6:.3f} MB of KV per sequence: "
      f"{info['kv_dtype']} latent {lat_b} B x min(T, {topk}) + indexer key {idx_b} B x T, T = {T:.1f})")

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
          f"{g_remote:.2f} other GPUs; efficiency = measured per-layer GB/s / 4.8 TB/s, same on both)")
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
json.dump({"device": b2.get("device"), "L1": L1, "L2": L2, "context": ctx, "steps": steps, "copy_gb_s": copy,
           "kv_bytes_per_seq_layer": kv_seq, "per_layer": rows,
           "glm5": {"parameters": params, "active_parameters": active, "nvfp4_bytes": total_bytes,
                    "moe_layer_bytes": attn_rep + attn_split + router + E * expert + shared,
                    "attention_bytes": attn_rep + attn_split, "expert_bytes": expert, "kv_bytes_per_token": kv_tok},
           "estimate": est, "estimate_both_modes": cand, "bench_L1": b1, "bench_L2": b2},
          open(f"{logs}/glm5_slice.json", "w"), indent=2)
PY
rc=${PIPESTATUS[0]}
stamp "done; logs in $logs"
exit "$rc"
