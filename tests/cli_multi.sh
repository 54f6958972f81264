#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager serve --model A --model B --model C --consolidate MAP --budget B`
# on three generated tiny variants (prompts are token ids): with nothing shared (capacity
# 0) each model's greedy tokens equal that model served alone; with half the positions
# shared, requests of every model are served, owned positions are read from memory
# (no pager I/O for them), the budget holds, and alternating models swaps the dense
# weights (counted and timed in /metrics) unless --mixed-batches keeps every model's in use
# (the same tokens, no swap); bad command lines and a map of other models
# are refused with a message.
#
#   cli_multi.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/serve_lib.sh"

# complete MODEL OUT: a greedy completion of a fixed id prompt; its token ids go to OUT.
complete() {
	curl -s "$URL/v1/completions" -d "{\"model\": \"$1\", \"prompt\": [3, 17, 42, 5], \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}" >"$T/body"
	"$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['token_ids'])" "$T/body" >"$2" 2>/dev/null ||
		{ bad "$1: no completion: $(cat "$T/body")"; echo none >"$2"; }
}

metric() {	# metric NAME: its value in $T/metrics
	awk -v n="$1" 'index($0, n "{") == 1 { print $2 }' "$T/metrics"
}

for s in 1 2 3; do
	"$MOEPAGER" gen --preset tiny --seed $s --name v$s --out "$T/v$s.mpk" --quiet || exit 1
done
M=(--model "$T/v1.mpk" --model "$T/v2.mpk" --model "$T/v3.mpk")
"$MOEPAGER" consolidate "$T/v1.mpk" "$T/v2.mpk" "$T/v3.mpk" --capacity 0 --out "$T/c0.mpc" \
	>/dev/null || exit 1
"$MOEPAGER" consolidate "$T/v1.mpk" "$T/v2.mpk" "$T/v3.mpk" --capacity 50% --out "$T/c16.mpc" \
	>/dev/null || exit 1

# Each model alone.
for v in v1 v2 v3; do
	serve_start --model "$T/$v.mpk" || exit 1
	complete "$v" "$T/alone.$v"
	stop
done

# Capacity 0: nothing shared; every model gives its own tokens, requests of all in flight.
serve_start "${M[@]}" --consolidate "$T/c0.mpc" --budget 25% --max-batch 4 || exit 1
curl -s "$URL/v1/models" >"$T/models"
check "/v1/models lists the three variants" \
	test "$("$PY" -c "import json,sys; print(sorted(m['id'] for m in json.load(open(sys.argv[1]))['data']))" "$T/models")" = "['v1', 'v2', 'v3']"
for v in v1 v2 v3 v1 v2 v3; do
	complete "$v" "$T/c0.$v"
	check "capacity 0: $v gives its tokens alone" cmp -s "$T/c0.$v" "$T/alone.$v"
done
check "the alone runs differ between models (the comparison means something)" \
	test "$(cat "$T/alone.v1")" != "$(cat "$T/alone.v2")"
curl -s "$URL/metrics" >"$T/metrics"
check "alternating models swaps the dense weights (counted)" \
	"$PY" -c "import sys; sys.exit(not float(sys.argv[1]) >= 5)" "$(metric moepager_model_swaps_total)"
check "and times the swaps" \
	"$PY" -c "import sys; sys.exit(not float(sys.argv[1]) > 0)" "$(metric moepager_model_swap_seconds_total)"
check "capacity 0 owns nothing" test "$(metric moepager_multi_owned_positions)" = 0
check "the server stops cleanly" stop

# Mixed batches: every model's dense weights in use, the same tokens, no swap.
serve_start "${M[@]}" --consolidate "$T/c0.mpc" --budget 25% --max-batch 4 --mixed-batches ||
	exit 1
for v in v1 v2 v3 v1 v2 v3; do
	complete "$v" "$T/mixed.$v"
	check "mixed batches: $v gives its tokens alone" cmp -s "$T/mixed.$v" "$T/alone.$v"
done
curl -s "$URL/metrics" >"$T/metrics"
check "mixed batches never swap" test "$(metric moepager_model_swaps_total)" = 0
check "the mixed-batch server stops cleanly" stop

# Half the positions shared: served, owned reads without I/O, within the budget.
serve_start "${M[@]}" --consolidate "$T/c16.mpc" --budget 25% || exit 1
for v in v1 v2 v3; do
	complete "$v" "$T/c16.$v"
	check "capacity 16: $v is served" test "$(cat "$T/c16.$v")" != none
done
curl -s "$URL/metrics" >"$T/metrics"
check "16 positions are owned, held in memory" test "$(metric moepager_multi_owned_positions)" = 16
check "owned positions were read from memory" \
	"$PY" -c "import sys; sys.exit(not float(sys.argv[1]) > 0)" "$(metric moepager_multi_owned_reads_total)"
check "the pager stayed within its budget" \
	"$PY" -c "import sys; sys.exit(not float(sys.argv[1]) <= float(sys.argv[2]))" \
	"$(metric moepager_pager_resident_bytes)" "$(metric moepager_pager_budget_bytes)"
check "the consolidated server stops cleanly" stop

# Refusals.
refused() {	# refused MESSAGE ARGS...: serve ARGS fails, saying MESSAGE
	local msg=$1
	shift
	! "$MOEPAGER" serve --listen 127.0.0.1:0 "$@" >/dev/null 2>"$T/err" && grep -q "$msg" "$T/err"
}
check "several --model without --consolidate are refused" \
	refused "need --consolidate" "${M[@]}"
check "--mixed-batches without --consolidate is refused" \
	refused "needs --consolidate" --model "$T/v1.mpk" --mixed-batches
check "--consolidate without --budget is refused" \
	refused "needs --budget" "${M[@]}" --consolidate "$T/c0.mpc"
check "--group-ms with --mixed-batches is refused" \
	refused "group-ms needs --consolidate" "${M[@]}" --consolidate "$T/c0.mpc" --budget 25% \
	--mixed-batches --group-ms 50
if "$MOEPAGER" serve --model "$T/v2.mpk" --model "$T/v1.mpk" --model "$T/v3.mpk" \
	--consolidate "$T/c0.mpc" --budget 25% --listen 127.0.0.1:0 >/dev/null 2>"$T/err"; then
	bad "models in another order than the map's were served"
else
	check "models in another order than the map's are refused, naming one" grep -q "v2" "$T/err"
fi

[[ $fails == 0 ]] || { echo "$fails check(s) failed"; exit 1; }
echo "all multi-model serving checks passed"
