#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager bench-multi` on two generated tiny variants: one invocation runs
# the six setups (single, consolidated, mixed, split, timeshare, paged) at each rate and
# prints the JSON the docs describe (ttft_s, turnaround_s, throughput_rpm, the layer times
# by hits, the runs, the ratios); every request completes; the floor, the split and mixed
# batches never swap, the consolidated, paged and time-sharing setups do when both models are
# asked for; time-sharing reads experts again after the warm-up (a swap evicts every
# expert); runs of one rate each merge into the JSON of one run of both; --prefetch
# SETUP=POLICY sets one setup's prefetcher; bad command lines and runs that do not compare
# are refused with a message.
#
#   cli_bench_multi.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"

refused() { refused_by "$1" "$MOEPAGER" bench-multi "${@:2}"; }	# refused MESSAGE ARGS...
for s in 1 2; do
	"$MOEPAGER" gen --preset tiny --seed $s --name v$s --out "$T/v$s.mpk" --quiet || exit 1
done
"$MOEPAGER" consolidate "$T/v1.mpk" "$T/v2.mpk" --capacity 25% --out "$T/c.mpc" >/dev/null ||
	exit 1
M=(--model "$T/v1.mpk" --model "$T/v2.mpk" --consolidate "$T/c.mpc")
A=(--requests 3 --max-tokens 4 --repeat 1 --warmup 1 --budget 100% --io-rate 256M
	--tmpdir "$T")

"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates 20,40 --json >"$T/out.json" 2>"$T/err"
check "bench-multi runs every setup at every rate" test $? = 0
cat >"$T/check.py" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["results"]
assert [(r["setup"], r["rate"]) for r in rows] == [
    (s, r) for r in (20.0, 40.0)
    for s in ("single", "consolidated", "mixed", "split", "timeshare", "paged")], rows
for r in rows:
    assert r["offered_rpm"] == r["rate"] * 2 * 60
    assert r["arrival_rpm"] > 0
    lm = r["layer_ms"]      # the tiny preset: top-2, so buckets of 0, 1 and 2 hits
    assert [b["hits"] for b in lm["moe_by_hits"]] == [0, 1, 2], lm
    # One-token steps only: a run whose every step was batched may have none.
    assert sum(b["passes"] for b in lm["moe_by_hits"]) == lm["passes"], lm
    assert (lm["attention"] is None) == (lm["passes"] == 0), lm
    assert lm["attention"] is None or lm["attention"] > 0, lm
    for b in lm["moe_by_hits"]:
        assert (b["ms"] is None) == (b["passes"] == 0) and (b["ms"] is None or b["ms"] > 0)
    assert 0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p90"], r
    assert r["ttft_s"]["p50"] <= r["turnaround_s"]["p50"] <= r["turnaround_s"]["p90"], r
    assert r["throughput_rpm"] > 0 and isinstance(r["saturated"], bool)
    assert len(r["runs"]) == 1 and r["runs"][0]["completed"] == 6, r
    assert r["runs"][0]["failed"] == 0
assert sum(r["layer_ms"]["passes"] for r in rows) > 0, rows
by = {(r["setup"], r["rate"]): r for r in rows}
for rate in (20.0, 40.0):
    assert by[("single", rate)]["swaps"] == 0
    assert by[("split", rate)]["swaps"] == 0
    assert by[("mixed", rate)]["swaps"] == 0    # every model's dense weights in use
    for s in ("single", "consolidated", "mixed", "split", "timeshare", "paged"):
        assert by[(s, rate)]["grouped"] == 0, s     # FIFO without --group
# The warm-up alone asks for both models one after another: both swapping setups swap.
for s in ("consolidated", "timeshare", "paged"):
    assert by[(s, 20.0)]["swaps"] >= 1, s
# A time-sharing swap evicts every expert: the measured run reads them again.
assert by[("timeshare", 20.0)]["bytes_file"] > 0
assert [c["rate"] for c in d["compare"]] == [20.0, 40.0]
for c in d["compare"]:
    for k in ("consolidated_over_single", "consolidated_over_split", "mixed_over_single",
              "mixed_over_split", "consolidated_over_timeshare", "paged_over_single",
              "paged_over_split"):
        assert c[k] > 0, c
    assert isinstance(c["split_saturated"], bool)
assert d["owned_bytes"] > 0 and d["budget_bytes"] > d["owned_bytes"]
# Per row, the memory held outside the budget: paged keeps its owned experts inside it.
for r in rows:
    held = r["setup"] in ("consolidated", "mixed")
    assert r["owned_bytes"] == (d["owned_bytes"] if held else 0), r
assert d["group_ms"] == 0
assert d["io_rate"] == 256 << 20 and d["models"] == [sys.argv[2], sys.argv[3]]
EOF
check "the JSON holds each setup's TTFT, turnaround, throughput, runs and the ratios" \
	"$PY" "$T/check.py" "$T/out.json" "$T/v1.mpk" "$T/v2.mpk"

for r in 20 40; do
	"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates $r --json >"$T/r$r.json" 2>"$T/err" ||
		cat "$T/err"
done
"$MOEPAGER" bench-multi --merge "$T/r20.json" "$T/r40.json" >"$T/merged.json" 2>"$T/err"
check "runs of one rate each merge" test $? = 0
cat >"$T/merge.py" <<'EOF'
import json, sys
one, merged = (json.load(open(f)) for f in sys.argv[1:3])
assert merged["merged"] == 2
assert [(r["setup"], r["rate"]) for r in merged["results"]] == \
    [(r["setup"], r["rate"]) for r in one["results"]]
assert [c["rate"] for c in merged["compare"]] == [20.0, 40.0]
for c in merged["compare"]:
    row = {r["setup"]: r for r in merged["results"] if r["rate"] == c["rate"]}
    t = lambda s: row[s]["turnaround_s"]["p50"]
    assert abs(c["consolidated_over_single"] - t("consolidated") / t("single")) < 1e-9
    assert abs(c["paged_over_split"] - t("paged") / t("split")) < 1e-9
for k in ("models", "map", "budget_bytes", "io_rate", "requests", "max_tokens"):
    assert merged[k] == one[k], k
EOF
check "the merged JSON holds both rates' rows and their ratios, taken again" \
	"$PY" "$T/merge.py" "$T/out.json" "$T/merged.json"
"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates 20 --setups single --budget 90% \
	--json >"$T/b90.json" 2>/dev/null
check "runs of another budget do not merge" \
	refused "another budget_bytes" --merge "$T/r20.json" "$T/b90.json"
check "a rate twice does not merge" refused "is in an earlier file" --merge "$T/r20.json" \
	"$T/r20.json"
echo '{"results": 1}' >"$T/other.json"
check "a file that is no bench-multi output does not merge" \
	refused "not a bench-multi --json output" --merge "$T/r20.json" "$T/other.json"
check "a file that is no JSON does not merge" \
	refused "check.py: '\[' or '{' expected" --merge "$T/r20.json" "$T/check.py"
check "--merge wants files" refused "--merge wants" --merge

"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates 20 --setups single,split >"$T/out.txt" \
	2>"$T/err"
check "--setups runs only those, and the text report names the ratios" \
	grep -q "turnaround p50 consolidated/single" "$T/out.txt"
check "no time-sharing map is left behind" \
	test -z "$(find "$T" -name 'moepager-bench-multi-*')"

check "one model is refused" \
	refused "at least two --model" --model "$T/v1.mpk" --consolidate "$T/c.mpc"
check "no map is refused" refused "--consolidate MAP is required" \
	--model "$T/v1.mpk" --model "$T/v2.mpk"
check "an unknown setup is refused" refused "--setups wants" "${M[@]}" --setups single,mig
check "a zero I/O rate is refused" refused "--io-rate wants" "${M[@]}" --io-rate 0
check "a bad rate is refused" refused "--rates wants" "${M[@]}" --rates 1,x
check "a budget without room beyond the owned experts is refused" \
	refused "must hold the map's" "${M[@]}" --budget 25%
check "a budget without room beyond the owned experts is refused for mixed batches" \
	refused "must hold the map's" "${M[@]}" --budget 25% --setups single,mixed
"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --budget 25% --rates 20 --setups single,paged \
	--json >"$T/paged.json" 2>"$T/err"
check "that budget runs the setups that page the owned experts (single, paged)" \
	$PY -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert [r["setup"] for r in d["results"]] == ["single", "paged"], d["results"]
assert all(r["runs"][0]["completed"] == 6 for r in d["results"]), d["results"]' "$T/paged.json"
"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates 20 --setups single,consolidated \
	--prefetch nextlayer --prefetch single=none --json >"$T/pf.json" 2>"$T/err"
check "--prefetch SETUP=POLICY sets that setup's prefetcher, --prefetch POLICY the others'" \
	$PY -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["prefetch"] == "nextlayer" and d["prefetch_setups"] == {"single": "none"}, d
by = {r["setup"]: r for r in d["results"]}
assert by["single"]["prefetch"] == "none" and by["consolidated"]["prefetch"] == "nextlayer"
assert by["single"]["runs"][0]["diag"]["predicted"] == 0, by["single"]
assert by["consolidated"]["runs"][0]["diag"]["predicted"] > 0, by["consolidated"]' "$T/pf.json"
"$MOEPAGER" bench-multi "${M[@]}" "${A[@]}" --rates 40 --setups single \
	--prefetch single=nextlayer --json >"$T/pf40.json" 2>"$T/err"
check "runs with another setup's prefetcher do not merge" \
	refused "another prefetch_setups" --merge "$T/r20.json" "$T/pf40.json"
check "--prefetch of an unknown setup is refused" \
	refused "--prefetch wants POLICY or SETUP=POLICY" "${M[@]}" --prefetch mig=finemoe
check "models in another order than the map's are refused" \
	refused "v2" --model "$T/v2.mpk" --model "$T/v1.mpk" --consolidate "$T/c.mpc"

gen_refused() {	# gen_refused MESSAGE ARGS...: gen ARGS fails, saying MESSAGE
	local msg=$1
	shift
	"$MOEPAGER" gen "$@" >/dev/null 2>"$T/err" && return 1
	grep -q -- "$msg" "$T/err" || { cat "$T/err"; return 1; }
}
check "gen --spread without --variant is refused" \
	gen_refused "needs --variant" --preset tiny --spread 0.1 --out "$T/s.mpk" --quiet

[[ $fails == 0 ]] || { echo "$fails check(s) failed"; exit 1; }
