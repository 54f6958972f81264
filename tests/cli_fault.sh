#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 7's done-when checks through the CLI: injected read faults under `moepager run`.
#   read:eio:p=0.2        -> exit 0 with exactly the tokens of a clean run
#   read:eio:expert=1.1   -> non-zero exit within seconds, message names layer 1 expert 1
#   read:corrupt:expert=0.2 -> non-zero exit, the checksum mismatch named, no crash
set -u
moepager=$1
. "$(dirname "$0")/cli_lib.sh"

tokens() {
	python3 -c 'import json, sys; print(json.load(sys.stdin)["tokens"])'
}

"$moepager" gen --preset tiny --seed 7 --out "$T/tiny.mpk" >/dev/null || exit 1
run=("$moepager" run --model "$T/tiny.mpk" --tokens 12 --budget 2M --json)

clean=$("${run[@]}" 2>"$T/clean.err" | tokens) || { cat "$T/clean.err"; exit 1; }

for seed in 1 2 3; do
	out=$(MOEPAGER_FAULT_SEED=$seed MOEPAGER_FAULT='read:eio:p=0.2' timeout 60 "${run[@]}" \
	      2>"$T/eio.err" | tokens)
	check "read:eio:p=0.2 (seed $seed) gives the clean run's tokens" test "$out" = "$clean"
done

start=$(date +%s)
MOEPAGER_FAULT='read:eio:expert=1.1' timeout 60 "${run[@]}" >/dev/null 2>"$T/dead.err"
rc=$?
took=$(($(date +%s) - start))
check "read:eio:expert=1.1 exits non-zero (rc $rc), not by timeout" \
	test "$rc" -ne 0 -a "$rc" -ne 124
check "read:eio:expert=1.1 ends within 10 s (took ${took} s)" test "$took" -le 10
check "read:eio:expert=1.1 names layer 1 expert 1" grep -q "layer 1 expert 1" "$T/dead.err"

MOEPAGER_FAULT='read:corrupt:expert=0.2' timeout 60 "${run[@]}" >/dev/null 2>"$T/bad.err"
rc=$?
check "read:corrupt:expert=0.2 is refused (rc $rc, no crash or timeout)" test "$rc" -eq 1
check "read:corrupt:expert=0.2 names the checksum mismatch of layer 0 expert 2" \
	grep -q "layer 0 expert 2.*checksum mismatch" "$T/bad.err"

((fails)) && { echo "--- stderr of the failing runs:"; cat "$T"/*.err; }
exit $((fails > 0))
