#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager batchbench` on a generated tiny model: the bandwidth probe is
# sampled before, inside (every --membw-every decode steps) and after each run, and the
# JSON counts those samples, keeps the median between their min and max, reports one
# sample a run on the calling thread alone and the probe buffer's huge-page share, and the
# bound ratio is tokens/s over the bound; beside it the compute roof: the step's
# multiply-adds (as many per sequence at every batch size: each routed expert and dense
# product over its rows) over the probe's multiply-add rate, the roof the slower of the
# two (never above the byte bound) and its ratio; a bad --membw-every is refused.
#
#   cli_batchbench.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"

"$MOEPAGER" gen --preset tiny --seed 1 --name bb --out "$T/m.mpk" --quiet || exit 1
A=(--model "$T/m.mpk" --batch 1,2 --prompt 2 --tokens 4 --repeat 3 --json)

cat >"$T/check.py" <<'PYEOF'
import json, math, sys
d, per_run = json.load(open(sys.argv[1])), int(sys.argv[2])
assert d["membw_bytes"] >= 1 << 20, d
assert d["membw_huge_share"] == -1 or 0 <= d["membw_huge_share"] <= 1, d
assert [r["batch"] for r in d["results"]] == [1, 2], d["results"]
for r in d["results"]:
    # Three runs, each sampled before and after and per_run times inside.
    assert r["membw_samples"] == 3 * (2 + per_run), (per_run, r)
    assert 0 < r["membw_min_gbps"] <= r["membw_gbps"] <= r["membw_max_gbps"], r
    assert r["membw_1t_gbps"] > 0, r
    assert math.isclose(r["bound_ratio"], r["tok_s"] / r["bound_tok_s"], rel_tol=1e-9), r
    assert math.isclose(r["bound_tok_s"],
                        r["membw_gbps"] * 1e9 / r["weight_bytes_per_step"] * r["batch"],
                        rel_tol=1e-9), r
    # The compute roof beside the byte bound.
    assert r["fma_gmacs"] > 0 and r["fma_1t_gmacs"] > 0 and r["macs_per_step"] > 0, r
    assert math.isclose(r["compute_tok_s"],
                        r["fma_gmacs"] * 1e9 / r["macs_per_step"] * r["batch"],
                        rel_tol=1e-9), r
    assert math.isclose(r["roof_tok_s"], min(r["bound_tok_s"], r["compute_tok_s"]),
                        rel_tol=1e-9), r
    assert 0 < r["roof_tok_s"] <= r["bound_tok_s"], r
    assert math.isclose(r["roof_ratio"], r["tok_s"] / r["roof_tok_s"], rel_tol=1e-9), r
    assert r["roof_ratio"] >= r["bound_ratio"], r
# Decode rows compute the same per sequence whatever the batch, but for attention over
# positions that do not depend on the batch either: twice the sequences, twice the work.
m1, m2 = (r["macs_per_step"] for r in d["results"])
assert math.isclose(m2, 2 * m1, rel_tol=1e-9), (m1, m2)
PYEOF

for every in 1 2 3 0; do
	inside=$(( every ? 4 / every : 0 ))
	"$MOEPAGER" batchbench "${A[@]}" --membw-every $every >"$T/out.json" 2>"$T/err"
	check "batchbench --membw-every $every runs" test $? = 0
	check "--membw-every $every: $inside samples inside each run, the JSON's figures agree" \
		$PY "$T/check.py" "$T/out.json" $inside
done
check "a bad --membw-every is refused" refused_by "--membw-every" \
	"$MOEPAGER" batchbench "${A[@]}" --membw-every x

exit $((fails > 0))
