#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager bench-adapters` on a tiny generated model with synthetic adapters:
# every setup reported, the JSON's fields and invariants (F_mem 1 for weave, padded rows
# held in full, replicas named and said to be copies, ratios against base, every request
# served), a budgeted run in which every setup lives in the budget, adapter rows paged and
# prefetched, and bad arguments refused with a message saying what is wrong. Structure
# only: no timing is asserted.
#
#   cli_bench_adapters.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"

# holds FILE PYTHON-EXPRESSION: the expression over the JSON object j is true.
holds() {
	[[ $("$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print(bool($2))" "$1") == True ]]
}
# refused DESCRIPTION PATTERN ARGS...: exits non-zero and says PATTERN on stderr.
refused() { check "$1" refused_by "$2" "$MOEPAGER" bench-adapters "${@:3}"; }

M=$T/tiny.mpk
A=$T/adapters
mkdir -p "$A" "$T/empty" "$T/alien"
"$MOEPAGER" gen --preset tiny --out "$M" --quiet &&
"$MOEPAGER" gen --preset tiny --seed 9 --out "$T/other.mpk" --quiet &&
"$MOEPAGER" adapter gen "$M" --out "$A/legal.mpa" --per-layer 1 --seed 1 >/dev/null &&
"$MOEPAGER" adapter gen "$M" --out "$A/code.mpa" --per-layer 2 --seed 2 >/dev/null &&
"$MOEPAGER" adapter gen "$T/other.mpk" --out "$T/alien/x.mpa" --per-layer 1 >/dev/null || exit 1

SMALL=(--requests 6 --alone 2 --rate 200 --max-tokens 4 --prompt-tokens 4 --max-batch 4
       --repeat 1 --threads 1)
"$MOEPAGER" bench-adapters --model "$M" --adapters "$A" --replicate 3 "${SMALL[@]}" --json \
	>"$T/all.json" 2>"$T/all.err"
check "the bench runs every setup by default" test $? -eq 0
cat "$T/all.err"
check "every setup is reported" holds "$T/all.json" \
	"sorted(j['setups']) == ['base', 'merged', 'padded', 'weave']"
check "three adapters from two files, the replica named and said to be a copy" holds "$T/all.json" \
	"j['n_adapters'] == 3 and j['files'] == 2 and j['replicas_are_copies'] and
	 [a['name'] for a in j['adapters']] == ['code', 'legal', 'code#2'] and
	 [a['replica'] for a in j['adapters']] == [False, False, True]"
check "every setup has latency, throughput, bytes per step and its bound" holds "$T/all.json" \
	"all(s['ttft_ms']['p50'] > 0 and s['ttft_ms']['p90'] >= s['ttft_ms']['p50'] and
	     s['tpot_ms']['p90'] >= s['tpot_ms']['p50'] > 0 and s['throughput_tok_s'] > 0 and
	     s['alone']['ttft_ms'] > 0 and s['bytes_per_step'] > 0 and s['bound_tpot_ms'] > 0 and
	     s['decode_bytes_per_step'] > 0 and s['membw_gbps'] > 0 and
	     s['tpot_bound_ratio'] > 0 and s['errors'] == 0 for s in j['setups'].values())"
check "each request's bound is its own steps' bytes at the run's bandwidth" holds "$T/all.json" \
	"all(abs(s['bound_tpot_ms'] - s['decode_bytes_per_step'] / s['membw_gbps'] / 1e6) <=
	     1e-6 * s['bound_tpot_ms'] and s['probe']['membw_gbps'] > 0
	     for k, s in j['setups'].items() if k != 'merged')"
check "weave holds only its adapters' experts: F_mem 1, less than padded" holds "$T/all.json" \
	"(lambda w: w['f_mem'] == 1 and w['held_bytes'] == w['adapter_bytes'] > 0 and
	  w['padded_bytes'] > w['held_bytes'])(j['setups']['weave'])"
check "padded holds E_max rows everywhere: held = padded_bytes, F_mem > 1" holds "$T/all.json" \
	"(lambda p, w: p['held_bytes'] == p['padded_bytes'] == w['padded_bytes'] and
	  p['f_mem'] > 1 and p['adapter_bytes'] == w['adapter_bytes'])(
	  j['setups']['padded'], j['setups']['weave'])"
check "weave, padded and base report rerouting as a share of a step; merged does not" \
	holds "$T/all.json" \
	"all(0 <= j['setups'][k]['reroute_share'] < 1 and j['setups'][k]['probe']['step_ms'] > 0
	     and j['setups'][k]['probe']['bytes_per_step'] > 0 for k in ('weave', 'padded', 'base'))
	 and 'reroute_share' not in j['setups']['merged']"
check "ratios are against base (base's own are 1)" holds "$T/all.json" \
	"all(v == 1 for v in j['setups']['base']['vs_base'].values()) and
	 all(j['setups'][k]['vs_base']['throughput'] > 0 for k in j['setups'])"
check "merged holds a whole model per adapter, weave the base and its adapters" \
	holds "$T/all.json" \
	"j['setups']['merged']['memory_bytes'] == 3 * j['setups']['base']['memory_bytes'] and
	 j['setups']['weave']['memory_bytes'] ==
	 j['setups']['base']['memory_bytes'] + j['setups']['weave']['held_bytes']"

# A budget that holds the base and the adapters: every setup lives in it.
"$MOEPAGER" bench-adapters --model "$M" --adapters "$A" "${SMALL[@]}" --setups weave,merged,base \
	--budget 10M --json >"$T/budget.json" 2>"$T/budget.err"
check "a budgeted run succeeds" test $? -eq 0
cat "$T/budget.err"
check "under --budget every setup holds the budget, weave's adapters inside it" \
	holds "$T/budget.json" \
	"j['budget_bytes'] == 10 << 20 and sorted(j['setups']) == ['base', 'merged', 'weave'] and
	 all(s['memory_bytes'] == j['budget_bytes'] and s['errors'] == 0
	     for s in j['setups'].values())"
# Adapter rows in the pager under a small budget, prefetched through each request's map
# and read at each request's admission.
"$MOEPAGER" bench-adapters --model "$M" --adapters "$A" "${SMALL[@]}" --setups weave,base \
	--budget 6M --paged-rows --prefetch nextlayer --warm-rows --json >"$T/rows.json" \
	2>"$T/rows.err"
check "a run with paged, prefetched adapter rows succeeds" test $? -eq 0
cat "$T/rows.err"
check "paged rows: weave lives in the whole budget and reports paging and row prefetches" \
	holds "$T/rows.json" \
	"j['paged_rows'] and j['row_prefetch'] and j['warm_rows'] and j['prefetch'] == 'nextlayer' and
	 j['setups']['weave']['memory_bytes'] == j['budget_bytes'] and
	 j['setups']['weave']['errors'] == 0 and
	 0 < j['setups']['weave']['paging']['hit_rate'] <= 1 and
	 j['setups']['weave']['paging']['prefetch_row_issued'] >= 0"
refused "--prefetch needs a budget" "--budget" --model "$M" --adapters "$A" --prefetch finemoe
refused "--no-row-prefetch needs paged rows and a prefetcher" "--paged-rows" --model "$M" \
	--adapters "$A" --budget 6M --no-row-prefetch
refused "--warm-rows needs paged rows" "--paged-rows" --model "$M" --adapters "$A" \
	--budget 6M --warm-rows
check "the text report names the setups" \
	sh -c "'$MOEPAGER' bench-adapters --model '$M' --adapters '$A' ${SMALL[*]} --setups weave \
	       | grep -q '^weave'"

refused "an unknown setup is refused" "--setups" --model "$M" --adapters "$A" --setups weave,fast
refused "--adapters is required" "--adapters DIR" --model "$M"
refused "a directory without adapters is refused" "no .mpa file" --model "$M" --adapters "$T/empty"
refused "an adapter for another base is refused, naming it" "x.mpa" --model "$M" \
	--adapters "$T/alien"
refused "a zero request count is refused" "--requests" --model "$M" --adapters "$A" --requests 0
refused "a budget below the adapters is refused" "budget" --model "$M" --adapters "$A" \
	--setups weave --budget 1M
refused "--e-max below an adapter's layer is refused" "--e-max 1" --model "$M" --adapters "$A" \
	--e-max 1

[[ $fails -eq 0 ]] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
