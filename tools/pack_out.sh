# pack_out.sh — sourced by the GPU-machine scripts: the device tool brings back at most 8 files from
# $OUT, so a script's logs leave as one archive.
#   pack_out DIR NAME   everything under DIR into DIR/NAME (.tgz), the rest removed
pack_out()
{
    local dir=$1 name=$2 tmp
    tmp=$(mktemp /tmp/pack_out.XXXXXX) || return 1
    (cd "$dir" && tar -czf "$tmp" --exclude="./$name" . && find . -mindepth 1 -maxdepth 1 ! -name "$name" -exec rm -rf {} + &&
        mv "$tmp" "$name")
}
