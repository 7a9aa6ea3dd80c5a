#!/bin/sh
# make_seeds.sh — writes small valid safetensors files into
# tests/fuzz/corpus_safetensors/ as seeds for fuzz_safetensors.
# Each is an 8-byte little-endian header length, the JSON header, then data.
set -eu
out="$(dirname "$0")/corpus_safetensors"
mkdir -p "$out"

# seed FILE HEADER DATA — DATA is a printf format of escapes (e.g. '\000\001').
seed() {
    len=$(printf '%s' "$2" | wc -c)
    {
        # u64 LE: headers here are < 64 KiB, so only the two low bytes are non-zero.
        printf "\\$(printf '%03o' $((len & 255)))\\$(printf '%03o' $((len >> 8 & 255)))"
        printf '\000\000\000\000\000\000'
        printf '%s' "$2"
        printf "$3"
    } > "$out/$1"
}

seed one_f32.safetensors \
    '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' \
    '\000\000\200\077\000\000\000\300'

seed mixed.safetensors \
    '{"__metadata__":{"format":"pt"},"a.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b.scale":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[8,11]},"c":{"dtype":"I64","shape":[],"data_offsets":[11,19]},"e":{"dtype":"U8","shape":[0,4],"data_offsets":[19,19]}}' \
    '\200\077\000\300\000\000\200\077\070\100\270\001\000\000\000\000\000\000\000'

seed padded_i32.safetensors \
    '{"x":{"dtype":"I32","shape":[1,1],"data_offsets":[0,4]}}      ' \
    '\001\002\003\004'
