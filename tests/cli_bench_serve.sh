#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager bench-serve` on a generated tiny model: one run per concurrency
# decodes the same requests with the runner alone and through a `serve` child, and the
# JSON says what the docs describe (per-step times alone and served, their difference and
# its share, the clients' CPU, the server's own step accounting and CPU share, one entry
# per run), also with idle clients and a named server binary; the server child exits cleanly; the plain report has a line per concurrency; bad command
# lines and a missing model are refused with a message.
#
#   cli_bench_serve.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"

refused() { refused_by "$1" "$MOEPAGER" bench-serve "${@:2}"; }	# refused MESSAGE ARGS...
"$MOEPAGER" gen --preset tiny --seed 1 --name bs --out "$T/m.mpk" --quiet || exit 1
A=(--model "$T/m.mpk" --tokens 8 --rounds 2)

"$MOEPAGER" bench-serve "${A[@]}" --concurrency 1,3 --repeat 3 --json >"$T/out.json" 2>"$T/err"
check "bench-serve runs each concurrency alone and served" test $? = 0
cat >"$T/check.py" <<'PYEOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["tokens"] == 8 and d["rounds"] == 2 and d["repeat"] == 3, d
assert d["server_exit_clean"] is True, d
assert d["clients"] == (sys.argv[2] if len(sys.argv) > 2 else "normal"), d["clients"]
assert [r["concurrency"] for r in d["results"]] == [1, 3], d["results"]
for r in d["results"]:
    c = r["concurrency"]
    assert len(r["runs"]) == 3, r
    # Each figure is the median of the runs' own (taken field by field).
    for k in ("alone_step_us", "served_step_us", "overhead_us", "overhead_share",
              "server_cpu_share", "client_cpu_us"):
        assert r[k] == sorted(x[k] for x in r["runs"])[1], (k, r)
    for x in r["runs"]:
        assert x["alone_step_us"] > 0 and x["served_step_us"] > 0, x
        assert math.isclose(x["overhead_us"], x["served_step_us"] - x["alone_step_us"],
                            rel_tol=1e-6, abs_tol=1e-6), x
        assert math.isclose(x["overhead_share"], x["overhead_us"] / x["alone_step_us"],
                            rel_tol=1e-6, abs_tol=1e-9), x
        assert x["client_cpu_us"] >= 0, x
        s = x["server"]
        # The server's own threads' CPU (scheduler + HTTP) per step over the step alone.
        assert math.isclose(x["server_cpu_share"],
                            (s["sched_cpu_us"] + s["http_thread_cpu_us"]) / x["alone_step_us"],
                            rel_tol=1e-6, abs_tol=1e-9), x
        # Every round decodes 8 tokens per request: at least 8 steps a round.
        assert s["steps"] >= 8 and 1 <= s["mean_batch"] <= c, s
        assert s["step_us"] > 0 and s["sched_wall_us"] > 0 and s["sched_cpu_us"] > 0 and s["http_thread_cpu_us"] > 0, s
        # The streams' wake-ups; a run starts from an idle server, which gathers.
        assert s["resumes_per_step"] > 0 and s["gathers"] >= 1 and s["gather_us"] > 0, s
PYEOF
check "bench-serve's JSON holds together" "$PY" "$T/check.py" "$T/out.json"

# Idle clients (SCHED_IDLE, on a thread of their own) and a server binary named: the same
# figures, said to be taken so.
"$MOEPAGER" bench-serve "${A[@]}" --concurrency 1,3 --repeat 3 --clients-idle \
	--server "$(command -v "$MOEPAGER")" --json >"$T/idle.json" 2>"$T/err"
check "bench-serve --clients-idle --server runs" test $? = 0
check "bench-serve --clients-idle's JSON holds together and says idle" \
	"$PY" "$T/check.py" "$T/idle.json" idle

"$MOEPAGER" bench-serve "${A[@]}" --concurrency 2 --repeat 1 >"$T/out.txt" 2>"$T/err"
check "bench-serve prints a line per concurrency" \
	grep -q "^C  2: alone .* us/step, served .*, overhead .* us (.* %)" "$T/out.txt"

# The server's options pass through: no gathering at --gather-us 0.
"$MOEPAGER" bench-serve "${A[@]}" --concurrency 2 --repeat 1 --gather-us 0 \
	--stream-interval-us 0 --json >"$T/g0.json" 2>"$T/err"
check "bench-serve --gather-us 0: the server never gathered" "$PY" -c \
	"import json,sys; d=json.load(open(sys.argv[1])); assert all(x['server']['gathers'] == 0 for r in d['results'] for x in r['runs']), d" "$T/g0.json"

check "--model is required" refused "--model FILE is required" --concurrency 1
check "a missing model is refused" refused "cannot open" --model "$T/none.mpk" --tokens 8
check "--concurrency 0 is refused" refused "--concurrency: '0' is not a number in \[1, 64\]" \
	"${A[@]}" --concurrency 0
check "nine concurrencies are refused" refused "--concurrency 1,2,3,4,5,6,7,8,9: more than 8" \
	"${A[@]}" --concurrency 1,2,3,4,5,6,7,8,9
check "an empty --concurrency is refused" refused "--concurrency: '' is not a number" "${A[@]}" \
	--concurrency ,
check "--tokens below 8 is refused" refused "--tokens" "${A[@]}" --tokens 4
check "--gather-us over 100000 is refused" refused "--gather-us" "${A[@]}" --gather-us 100001
check "a --server that is not an executable is refused" refused "--server: '$T/none'" \
	"${A[@]}" --server "$T/none"
check "--prompt over 64 is refused" refused "--prompt: '65' is not a number in \[1, 64\]" "${A[@]}" --prompt 65

[[ $fails == 0 ]] || { echo "$fails check(s) failed"; exit 1; }
