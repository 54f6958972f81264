#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager run --record-alternate`: every second repetition is recorded through BPF
# in the same process, and the JSON reports both speeds and what was recorded.
set -u
moepager=$1
# BPF needs root; only CI (which runs as root) must not skip.
if ((EUID != 0)) && [[ -z ${CI:-}${MOEPAGER_REQUIRE_BPF:-} ]]; then
	echo "skipped: recording through BPF needs root"
	exit 77
fi
. "$(dirname "$0")/cli_lib.sh"
"$moepager" gen --preset tiny --out "$T/tiny.mpk" >/dev/null || exit 1
"$moepager" run --model "$T/tiny.mpk" --tokens 8 --prompt-tokens 4 --repeat 4 \
	--record-alternate --json >"$T/out.json" || exit 1
python3 - "$T/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["record"]
layers = 4                                   # the tiny preset
# two recorded repetitions: per repetition one route per layer for each prompt
# token and each decode step, and one prefill record
want = 2 * ((4 + 8) * layers + 1)
errs = []
if r["source"] != "bpf":
    errs.append("source %r, not bpf" % r["source"])
if r["records"] != want:
    errs.append("records %d, want %d" % (r["records"], want))
if r["dropped"] != 0:
    errs.append("dropped %d" % r["dropped"])
if not (r["recorded_tokens_per_s"] > 0 and r["unrecorded_tokens_per_s"] > 0):
    errs.append("speeds missing: %r" % r)
print(r)
for e in errs:
    print("FAILED:", e)
sys.exit(1 if errs else 0)
PY
