#!/usr/bin/env bash
# CPU ranks under mpirun (issue 26): `logits` with 2 and 4 ranks, the TP layout and the EP layout,
# equals the one-rank logits (<= 1e-5 relative) for qwen3_moe, glm4_moe and glm_moe_dsa fixtures
# (BF16 and NVFP4); a model that does not divide, a rank count that is not --tensor-parallel's and
# --tensor-parallel without mpirun are refused with messages that say so; `--synthetic tiny` (weights
# made by each rank) on 2 ranks equals one rank. A batch of several sequences on 2 and 4 ranks, by
# heads and with data-parallel attention, equals one rank; generate's text too; the plan's attention
# layout by batch size and its collectives (which are fused with the add + norm).
# Usage: ranks.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
mkdir -p "$work"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if ! command -v mpirun >/dev/null 2>&1; then
    echo "FAIL mpirun not found (make deps installs openmpi-bin)"
    exit 1
fi
# the CI and the dev machine run as root; Open MPI refuses that unless told
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# containers often forbid the cross-process memory attach (CMA) Open MPI's shared-memory transport
# tries first; copy through the shared segment instead
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The ASan build (make test-asan): Open MPI keeps memory in the components it unloads at
# MPI_Finalize, whose frames LeakSanitizer can no longer name (so no suppression matches them):
# leak checks off under mpirun only; ASan's other checks stay on, and the one-rank runs here, the
# unit tests and the other CLI tests check moeserve's own leaks.
MPIRUN=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun)
tokens=1,5,9,33,2,7,100,3,11,12,13,14,15,16,17,18,19,20,21
rel() { # max |a - b| / max |a| of two float32 files, or "size" when they differ in length
    python3 - "$1" "$2" <<'PY'
import struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
if len(a) != len(b) or not a:
    print("size"); sys.exit()
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
m = max(abs(v) for v in x)
print("%.3e" % (max(abs(p - q) for p, q in zip(x, y)) / m))
PY
}
for case in models/qwen3_basic:2,4 models/glm4_basic:2,4 dsa/dsa_basic:2,4 dsa/dsa_bias_mtp_long:2 \
    quant/qwen3_basic_nvfp4:2 quant/dsa_basic_nvfp4:2 models/qwen3_gqa6_bias_sharded:2; do
    m=$src/tests/golden/${case%%:*} name=$(basename "${case%%:*}")
    one=$work/$name.1.bin
    if ! "$bin" logits --model "$m" --tokens $tokens --out "$one" --kv-cache-dtype f32 >"$work/$name.1.log" 2>&1; then
        bad "$name: one rank failed: $(tail -1 "$work/$name.1.log")"
        continue
    fi
    for np in ${case##*:}; do
        np=${np//,/ }
        for n in $np; do
            for layout in tp ep; do
                flag=
                [ $layout = ep ] && flag=--expert-parallel
                out=$work/$name.$n.$layout.bin
                rm -f "$out"
                if ! timeout 120 "${MPIRUN[@]}" -np "$n" "$bin" logits --model "$m" --tokens $tokens --out "$out" \
                    --kv-cache-dtype f32 --tensor-parallel "$n" $flag >"$work/$name.$n.$layout.log" 2>&1; then
                    bad "$name: $n ranks ($layout) failed: $(grep -m1 -i error "$work/$name.$n.$layout.log")"
                    continue
                fi
                r=$(rel "$one" "$out")
                if [ "$r" != size ] && python3 -c "import sys; sys.exit(0 if float('$r') <= 1e-5 else 1)"; then
                    ok "$name: $n ranks ($layout) = one rank (rel $r)"
                else
                    bad "$name: $n ranks ($layout) differ from one rank (rel $r)"
                fi
            done
        done
    done
done
# a batch of several sequences (logits --seq-lens: 4 sequences of 5, 3, 7 and 4 tokens, positions from 0
# each) = one rank's: attention by heads, and data-parallel attention (each rank attends for its own
# sequences, the FFN over every rank's rows), with the TP and the EP experts; one sequence on 2
# data-parallel ranks (rank 1 attends for none: it only takes part in the FFN) = the one-rank run
lens=5,3,7,4
for case in models/qwen3_basic:2,4 models/glm4_basic:2,4 dsa/dsa_basic:2,4 dsa/dsa_bias_mtp_long:2,4 \
    quant/qwen3_basic_nvfp4:2 quant/dsa_basic_nvfp4:2; do
    m=$src/tests/golden/${case%%:*} name=$(basename "${case%%:*}")
    one=$work/$name.seqs.1.bin
    if ! "$bin" logits --model "$m" --tokens $tokens --seq-lens $lens --out "$one" --kv-cache-dtype f32 \
        >"$work/$name.seqs.1.log" 2>&1; then
        bad "$name: one rank, $lens: $(tail -1 "$work/$name.seqs.1.log")"
        continue
    fi
    for n in ${case##*:}; do
        n=${n//,/ }
        for k in $n; do
            for layout in heads.tp dp.tp dp.ep; do
                flags="--data-parallel-attention off"
                [ "${layout%%.*}" = dp ] && flags="--data-parallel-attention on"
                [ "${layout##*.}" = ep ] && flags="$flags --expert-parallel"
                [ "${layout%%.*}" = heads ] && [ "$k" = 4 ] && continue # by heads over 4: the cases above
                out=$work/$name.seqs.$k.$layout.bin
                rm -f "$out"
                if ! timeout 120 "${MPIRUN[@]}" -np "$k" "$bin" logits --model "$m" --tokens $tokens --seq-lens $lens \
                    --out "$out" --kv-cache-dtype f32 --tensor-parallel "$k" $flags >"$work/$name.seqs.$k.$layout.log" 2>&1; then
                    bad "$name: $k ranks ($layout), $lens failed: $(grep -m1 -i error "$work/$name.seqs.$k.$layout.log")"
                    continue
                fi
                r=$(rel "$one" "$out")
                if [ "$r" != size ] && python3 -c "import sys; sys.exit(0 if float('$r') <= 1e-5 else 1)"; then
                    ok "$name: $k ranks ($layout), sequences $lens = one rank (rel $r)"
                else
                    bad "$name: $k ranks ($layout), sequences $lens differ from one rank (rel $r)"
                fi
            done
        done
    done
done
for name in qwen3_basic dsa_basic; do
    m=$src/tests/golden/models/$name
    [ -d "$m" ] || m=$src/tests/golden/dsa/$name
    out=$work/$name.dp.one.bin
    if timeout 120 "${MPIRUN[@]}" -np 2 "$bin" logits --model "$m" --tokens $tokens --out "$out" --kv-cache-dtype f32 \
        --tensor-parallel 2 --data-parallel-attention on >"$work/$name.dp.one.log" 2>&1; then
        r=$(rel "$work/$name.1.bin" "$out")
        if [ "$r" != size ] && python3 -c "import sys; sys.exit(0 if float('$r') <= 1e-5 else 1)"; then
            ok "$name: one sequence on 2 data-parallel ranks (rank 1 idle in attention) = one rank (rel $r)"
        else
            bad "$name: one sequence on 2 data-parallel ranks differs from one rank (rel $r)"
        fi
    else
        bad "$name: one sequence on 2 data-parallel ranks failed: $(grep -m1 -i error "$work/$name.dp.one.log")"
    fi
done
# synthetic weights (bench --synthetic): each rank makes its share from the element's place in the whole
# tensor, so 2 ranks of `--synthetic tiny` are the one-rank model, TP and EP, NVFP4 and BF16
# (glm-tiny: MLA heads, the DSA indexer over 19 tokens with 8 kept, a dense and a MoE layer with a shared expert;
# an f32 latent cache, as for the fixtures: a bf16 one rounds the ranks' last-bit differences up to 3e-5)
for case in tiny:nvfp4 tiny:bf16 glm-tiny:nvfp4 glm-tiny:bf16; do
    p=${case%%:*} fmt=${case##*:} tag=$p.$fmt
    one=$work/synth.$tag.1.bin
    if ! "$bin" logits --synthetic $p --synthetic-format $fmt --tokens $tokens --out "$one" --kv-cache-dtype f32 \
        >"$work/synth.$tag.1.log" 2>&1; then
        bad "synthetic $p $fmt: one rank failed: $(tail -1 "$work/synth.$tag.1.log")"
        continue
    fi
    for layout in tp ep; do
        flag=
        [ $layout = ep ] && flag=--expert-parallel
        out=$work/synth.$tag.2.$layout.bin
        rm -f "$out"
        if ! timeout 120 "${MPIRUN[@]}" -np 2 "$bin" logits --synthetic $p --synthetic-format $fmt --tokens $tokens \
            --out "$out" --kv-cache-dtype f32 --tensor-parallel 2 $flag >"$work/synth.$tag.2.$layout.log" 2>&1; then
            bad "synthetic $p $fmt: 2 ranks ($layout) failed: $(grep -m1 -i error "$work/synth.$tag.2.$layout.log")"
            continue
        fi
        r=$(rel "$one" "$out")
        if [ "$r" != size ] && python3 -c "import sys; sys.exit(0 if float('$r') <= 1e-5 else 1)"; then
            ok "synthetic $p $fmt: 2 ranks ($layout) = one rank (rel $r)"
        else
            bad "synthetic $p $fmt: 2 ranks ($layout) differ from one rank (rel $r)"
        fi
    done
done
# refusals, each with its reason
expect() { # name, pattern, command...
    local name=$1 pat=$2
    shift 2
    if timeout 60 "$@" >"$work/refuse.log" 2>&1; then
        bad "$name: accepted"
    elif grep -q "$pat" "$work/refuse.log"; then
        ok "$name: refused ($(grep -m1 "$pat" "$work/refuse.log" | sed 's/^error: //'))"
    else
        bad "$name: refused without saying \"$pat\": $(tail -2 "$work/refuse.log")"
    fi
}
m=$src/tests/golden/models
expect "6 heads over 4 ranks" "6 attention heads do not divide over 4 ranks" \
    "${MPIRUN[@]}" -np 4 "$bin" logits --model "$m/qwen3_gqa6_bias_sharded" --tokens 1,2 --out "$work/x.bin" --tensor-parallel 4
expect "2 ranks, --tensor-parallel 4" "mpirun started 2 ranks but --tensor-parallel is 4" \
    "${MPIRUN[@]}" -np 2 "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --tensor-parallel 4
expect "--tensor-parallel 2 without mpirun" "start the ranks with mpirun -np 2" \
    "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --tensor-parallel 2
expect "--expert-parallel on one rank" "needs more than one rank" \
    "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --expert-parallel
expect "nvfp4 split off its scale blocks" "not on the 16 in-feature scale blocks of nvfp4" \
    "${MPIRUN[@]}" -np 4 "$bin" logits --model "$src/tests/golden/quant/qwen3_basic_nvfp4" --tokens 1,2 --out "$work/x.bin" \
    --tensor-parallel 4
expect "--synthetic with --model" "give one of them" \
    "$bin" logits --synthetic tiny --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin"
expect "--synthetic of no preset" "no such preset (have: tiny" \
    "$bin" bench --synthetic nosuch
expect "--synthetic-format fp4" "expected nvfp4 or bf16" \
    "$bin" bench --synthetic tiny --synthetic-format fp4
expect "--synthetic-layers without --synthetic" "need --synthetic PRESET" \
    "$bin" bench --synthetic-layers 2
# GPU ranks on a machine without the GPUs: refused at once, no rank left behind (a CUDA build counts
# the GPUs; under mpirun each rank's backend fails and the ranks agree on it)
expect "--backend cuda --tensor-parallel 2, no GPUs" "needs 2 GPUs\|not in this build\|CUDA devices usable" \
    "$bin" logits --backend cuda --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --tensor-parallel 2
expect "mpirun -np 2 --backend cuda, no GPUs" "CUDA devices usable\|not in this build\|not available" \
    "${MPIRUN[@]}" -np 2 "$bin" logits --backend cuda --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" \
    --tensor-parallel 2
sleep 0.5
if pgrep -f "moeserve logits --backend cuda" >/dev/null; then
    bad "GPU ranks left running after the refusals"
else
    ok "no GPU rank left running after the refusals"
fi
expect "--data-parallel-attention maybe" "data-parallel-attention: expected on, off or auto" \
    "${MPIRUN[@]}" -np 2 "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --tensor-parallel 2 \
    --data-parallel-attention maybe
expect "--data-parallel-attention on, one rank" "needs more than one rank" \
    "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --out "$work/x.bin" --data-parallel-attention on
expect "--seq-lens that do not sum to the tokens" "the lengths sum to 4, --tokens has 2" \
    "$bin" logits --model "$m/qwen3_basic" --tokens 1,2 --seq-lens 1,3 --out "$work/x.bin"
# generate: a prompt's prefill, then decode steps that read the rows each rank wrote (greedy): 2 ranks,
# by heads and data-parallel, print the one-rank text
g1=$("$bin" generate --prompt "In the beginning" -n 32 2>"$work/gen.1.log")
for dpa in off on; do
    g2=$("${MPIRUN[@]}" -np 2 "$bin" generate --prompt "In the beginning" -n 32 --tensor-parallel 2 \
        --data-parallel-attention $dpa 2>"$work/gen.$dpa.log")
    if [ -n "$g1" ] && [ "$g1" = "$g2" ]; then
        ok "generate 32 tokens, 2 ranks (data-parallel attention $dpa) = one rank's text"
    else
        bad "generate, 2 ranks (data-parallel attention $dpa): \"$g2\" vs \"$g1\" $(grep -m1 -i error "$work/gen.$dpa.log")"
    fi
done
# a rank killed mid-decode: the job ends within 30 s with a message naming it, no rank left waiting
t0=$(date +%s)
"${MPIRUN[@]}" -np 2 "$bin" generate --prompt "In the beginning" -n 20000 --max-context 20010 --allow-long-context \
    --tensor-parallel 2 >"$work/killed.out" 2>"$work/killed.log" &
job=$!
victim=
for _ in $(seq 50); do
    victim=$(pgrep -P "$job" -f "moeserve generate" | sort -n | tail -1)
    [ -n "$victim" ] && [ -s "$work/killed.out" ] && break
    sleep 0.2
done
if [ -n "$victim" ]; then
    kill -9 "$victim"
    ( sleep 30; kill -9 "$job" 2>/dev/null ) &
    guard=$!
    wait "$job"
    rc=$?
    kill "$guard" 2>/dev/null
    dt=$(($(date +%s) - t0))
    if [ "$rc" -ne 0 ] && [ "$dt" -lt 30 ] && grep -q "rank 1" "$work/killed.log"; then
        ok "a follower killed mid-decode: the job stopped in ${dt} s, rc $rc, naming rank 1"
    else
        bad "a follower killed mid-decode: rc $rc after ${dt} s: $(grep -v '^-*$' "$work/killed.log" | tail -3)"
    fi
else
    kill -9 "$job" 2>/dev/null
    bad "a follower killed mid-decode: no rank process to kill"
fi
# the all-reduce table every rank times (bench --allreduce): 256 B .. 16 MiB over MPI
j=$("${MPIRUN[@]}" -np 2 "$bin" bench --allreduce --tensor-parallel 2 --json 2>"$work/allreduce.log")
if echo "$j" | python3 -c "
import json, sys
d = json.load(sys.stdin); a = d['allreduce']
assert d['ranks'] == 2 and d['comm'] == 'mpi' and len(a) == 17, d
assert a[0]['bytes'] == 256 and a[-1]['bytes'] == 16 << 20 and all(x['us'] > 0 for x in a), a"; then
    ok "bench --allreduce over 2 ranks: 17 sizes, 256 B .. 16 MiB"
else
    bad "bench --allreduce over 2 ranks: $(echo "$j" | head -c 200) $(tail -2 "$work/allreduce.log")"
fi
# the layout the planner prints: the MLA model by heads with the latent replicated; NVFP4 experts too
# narrow for their scale blocks over 4 ranks go by expert, saying why
j=$("$bin" plan --profile h200 --model "$src/tests/golden/dsa/dsa_basic" --tensor-parallel 2 --max-seqs 1 --json 2>/dev/null)
if echo "$j" | python3 -c "
import json, sys
l = json.load(sys.stdin)['layout']; p = {x['part']: x for x in l['parts']}
assert l['ranks'] == 2 and not l['expert_parallel'] and not l['data_parallel_attention'], l
assert 'some rank would attend for none' in l['attention_why'], l
assert p['attention (MLA)']['split'] == 'by heads' and 'replicated' in p['attention (MLA)']['rank0'], p
assert p['routed experts']['split'].startswith('by width'), p
c = l['collectives'][0]
assert c['all_reduce_count'] == 6 and c['fused_add_rmsnorm_count'] == 5, c"; then
    ok "plan --tensor-parallel 2 --max-seqs 1: the MLA layout (heads split, latent replicated, experts by width; 5 of 6 all-reduces fused with add+norm)"
else
    bad "plan --tensor-parallel 2: layout of dsa_basic: $(echo "$j" | head -c 300)"
fi
# large batches: the rule picks data-parallel attention for the MLA model (64 sequences of 2048 tokens:
# the latent rows every rank reads by heads outweigh the replicated weights), with its collectives;
# 4 heads over 8 ranks too (data-parallel needs no head to divide); GQA with kv heads >= ranks: never
j=$("$bin" plan --profile h200 --model "$src/tests/golden/dsa/dsa_basic" --tensor-parallel 2 --max-seqs 64 --json 2>/dev/null)
if echo "$j" | python3 -c "
import json, sys
l = json.load(sys.stdin)['layout']; p = {x['part']: x for x in l['parts']}
assert l['data_parallel_attention'] and l['attention_why'].endswith(': data-parallel'), l
assert p['attention (MLA)']['split'] == 'data-parallel' and 'replicated' in p['attention (MLA)']['rank0'], p
c = l['collectives'][2]
assert c['all_reduce_count'] == 0 and c['all_gather_count'] == 4 and c['reduce_scatter_count'] == 3, c
assert c['rank_rows'] == 32, c"; then
    ok "plan --tensor-parallel 2 --max-seqs 64: data-parallel attention for the MLA model, saying why"
else
    bad "plan --tensor-parallel 2 --max-seqs 64: dsa_basic: $(echo "$j" | head -c 400)"
fi
j=$("$bin" plan --profile h200 --model "$src/tests/golden/dsa/dsa_basic" --tensor-parallel 8 --max-seqs 64 --json 2>/dev/null)
if echo "$j" | python3 -c "
import json, sys
l = json.load(sys.stdin)['layout']; assert l['ranks'] == 8 and l['data_parallel_attention'], l"; then
    ok "plan --tensor-parallel 8: 4 heads over 8 ranks, data-parallel attention"
else
    bad "plan --tensor-parallel 8: dsa_basic: $(echo "$j" | head -c 300)"
fi
j=$("$bin" plan --profile h200 --model "$src/tests/golden/models/glm4_basic" --tensor-parallel 2 --max-seqs 256 --json 2>/dev/null)
if echo "$j" | python3 -c "
import json, sys
l = json.load(sys.stdin)['layout']; assert not l['data_parallel_attention'], l
assert l['attention_why'].endswith(': by heads'), l"; then
    ok "plan --tensor-parallel 2 --max-seqs 256: GQA attention stays by heads"
else
    bad "plan --tensor-parallel 2 --max-seqs 256: glm4_basic: $(echo "$j" | head -c 300)"
fi
j=$("$bin" plan --profile h200 --model "$src/tests/golden/quant/qwen3_basic_nvfp4" --tensor-parallel 4 --json 2>/dev/null)
if echo "$j" | python3 -c "
import json, sys
l = json.load(sys.stdin)['layout']
assert l['expert_parallel'] and 'scale blocks' in l['experts_why'], l"; then
    ok "plan --tensor-parallel 4: NVFP4 experts of width 32 go by expert (8 in-features a rank: off the 16-blocks)"
else
    bad "plan --tensor-parallel 4: qwen3_basic_nvfp4 experts layout: $(echo "$j" | head -c 300)"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
