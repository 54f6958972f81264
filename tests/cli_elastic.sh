#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Live changes while serving (docs/elastic.md), on the trained model: `moepager serve
# --attach` processes on one pager daemon behind loadgen's epoch pool; under Poisson load a
# second server attaches, warms (reads nothing from disk) and joins (epoch 2), the first
# leaves the pool and drains (epoch 3), the first server's engine threads go 1 -> 2 -> 1 in
# place (POST /admin/threads), the daemon's budget goes down and up, its host tier moves to
# NUMA node 0 (and node 1000 is refused): no request fails, and
# the servers answer a greedy completion as the first did before any change. The new server
# reads the dense weights in the daemon's memfd (lent, none read from the file). Bad pool files,
# a bad --epoch, a bad --set-budget and a bad thread count are refused with a message.
# bench-elastic --load on a small load: zero failed requests in every setup, the shared scale-up reads 0 bytes; and
# with --threads-to a server's threads change in place and back, no request failed.
# Needs userfaultfd (CI runs as root).
set -u
moepager=$1
model=$2
prompts=$3
. "$(dirname "$0")/cli_lib.sh"
sock=$T/pagerd.sock
json() {
	python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
	d = d[k]
print(d)' "$1" "$2"
}
# serve NAME EPOCH THREADS: an attached, warmed server; sets PORT.
serve() {
	"$moepager" serve --model "$model" --attach "$sock" --warm --epoch "$2" \
		--listen 127.0.0.1:0 --port-file "$T/$1.port" --threads "$3" \
		>"$T/$1.out" 2>"$T/$1.err" &
	KILL+=($!)
	eval "pid_$1=$!"
	PORT=$(wait_port "$T/$1.port" "${KILL[-1]}") ||
		{ cat "$T/$1.err"; echo "FAILED: server $1 not ready"; exit 1; }
}
pool() {	# pool EPOCH PORT...: a new pool file renamed over the old
	{ echo "epoch $1"; shift; for p in "$@"; do echo "http://127.0.0.1:$p"; done; } >"$T/pool.tmp"
	mv "$T/pool.tmp" "$T/pool"
}
# threads PORT BODY: POST /admin/threads; prints the status, the answer in $T/threads.json.
threads() {
	curl -s -o "$T/threads.json" -w '%{http_code}' "127.0.0.1:$1/admin/threads" -d "$2"
}
metric() {	# metric PORT NAME: its value in /metrics
	curl -s "127.0.0.1:$1/metrics" | awk -v n="$2" 'index($0, n "{") == 1 {print $2}'
}
greedy() {
	curl -s "127.0.0.1:$1/v1/completions" \
		-d '{"prompt": "Q: What is a", "max_tokens": 12, "temperature": 0}' |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}

"$moepager" pagerd --model "$model" --socket "$sock" --budget 100% >"$T/d.out" 2>&1 &
KILL+=($!)
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
serve a 1 1
port_a=$PORT
text_a=$(greedy "$port_a")
pool 1 "$port_a"
"$moepager" loadgen --pool "$T/pool" --prompts "$prompts" --rate 6 --duration 6 \
	--max-tokens 8 --retry-s 60 --json >"$T/lg.json" 2>"$T/lg.err" &
lg=$!
sleep 0.5
# a's engine threads, 1 -> 2 in place under load (between two of its scheduler's steps).
[[ $(metric "$port_a" moepager_engine_threads) == 1 ]] || bad "server a does not show 1 thread"
code=$(threads "$port_a" '{"threads": 2}')
[[ $code == 200 && $(json "$T/threads.json" threads) == 2 &&
   $(json "$T/threads.json" previous) == 1 ]] || bad "threads 1 -> 2: $code $(cat "$T/threads.json")"
[[ $(metric "$port_a" moepager_engine_threads) == 2 ]] || bad "server a does not show 2 threads"
[[ $(greedy "$port_a") == "$text_a" ]] || bad "server a answers otherwise with 2 threads"
# Bad thread counts: refused naming the field, nothing changed.
for body in '{"threads": 0}' '{"threads": 1025}' '{"threads": "2"}' '{"thread": 2}' '{}' 'x'; do
	code=$(threads "$port_a" "$body")
	[[ $code == 400 ]] || bad "threads body $body: $code, not 400"
	grep -q '"message"' "$T/threads.json" || bad "no message for threads body $body"
done
[[ $(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port_a/admin/threads") == 405 ]] ||
	bad "GET /admin/threads is not 405"
[[ $(metric "$port_a" moepager_engine_threads) == 2 ]] || bad "a refused change changed a's threads"
sleep 1
# b has two engine threads from its start (a swap changes threads too: docs/elastic.md).
serve b 2 2
port_b=$PORT
# What server a's requests read is in the daemon's memfd: b maps it before it listens.
grep -Eq ", [1-9][0-9]* experts warmed" "$T/b.out" || bad "server b warmed nothing: $(cat "$T/b.out")"
pool 2 "$port_a" "$port_b"
curl -s "127.0.0.1:$port_b/metrics" >"$T/b.metrics"
grep -qx 'moepager_serve_epoch 2' "$T/b.metrics" || bad "server b's /metrics does not show epoch 2"
# b reads the dense weights where the daemon holds them: lent, not read from the file.
lent=$(awk '/^moepager_runner_dense_lent_bytes/ {print $2}' "$T/b.metrics")
copied=$(awk '/^moepager_runner_dense_read_bytes/ {print $2}' "$T/b.metrics")
[[ $copied == 0 && ${lent:-0} -gt 0 ]] || bad "server b's dense weights: $lent lent, $copied read"
rchar=$(awk '/^rchar/ {print $2}' "/proc/$pid_b/io")
(( rchar < ${lent:-0} )) || bad "server b read $rchar bytes; the dense weights are $lent"
sleep 0.5
code=$(threads "$port_a" '{"threads": 1}')
[[ $code == 200 && $(json "$T/threads.json" previous) == 2 ]] || bad "threads 2 -> 1: $code"
[[ $(metric "$port_a" moepager_engine_threads) == 1 &&
   $(metric "$port_a" moepager_engine_thread_changes_total) == 2 ]] ||
	bad "server a does not show 1 thread after 2 changes"
[[ $(greedy "$port_a") == "$text_a" ]] || bad "server a answers otherwise back at 1 thread"
sleep 1
pool 3 "$port_b"
kill -TERM "$pid_a"
wait "$pid_a" || bad "server a exited non-zero when drained"
grep -q "0 request(s) cut short" "$T/a.err" || bad "server a cut requests short: $(cat "$T/a.err")"
# The budget, one number across the processes, down and up while they serve.
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 50% >/dev/null ||
	bad "--set-budget 50% under load"
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 100% >/dev/null ||
	bad "--set-budget 100% under load"
# The host tier to NUMA node 0 under load (this machine's one node: the call path, the pages
# counted on it), and a node that does not exist refused with a message.
"$moepager" pagerd --model "$model" --socket "$sock" --set-node 0 >"$T/node.out" ||
	bad "--set-node 0 under load"
grep -Eq 'host tier on node 0: ([1-9][0-9]*) of \1 resident' "$T/node.out" ||
	bad "--set-node 0: $(cat "$T/node.out")"
"$moepager" pagerd --model "$model" --socket "$sock" --set-node 1000 2>"$T/e6" &&
	bad "--set-node 1000 was taken"
grep -q "NUMA node 1000 does not exist" "$T/e6" || bad "no message for node 1000: $(cat "$T/e6")"
wait $lg || { cat "$T/lg.err"; bad "loadgen"; }
[[ $(json "$T/lg.json" errors) == 0 ]] || bad "$(json "$T/lg.json" errors) requests failed"
[[ $(json "$T/lg.json" completed) == $(json "$T/lg.json" requests) ]] ||
	bad "not every request completed"
echo "load: $(json "$T/lg.json" requests) requests, $(json "$T/lg.json" retried) retried"
text_b=$(greedy "$port_b")
[[ -n $text_a && $text_a == "$text_b" ]] || bad "server a answered '$text_a', b '$text_b'"
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 100% --json >"$T/st.json" ||
	bad "--set-budget 100% --json"
# The daemon holds them once: its memfd of dense weights holds what b was lent.
(( $(json "$T/st.json" dense_bytes) >= ${lent:-1} )) ||
	bad "the daemon's dense memfd is $(json "$T/st.json" dense_bytes) bytes, b was lent $lent"
# Bad control input: refused with a message, nothing changed.
printf 'epoch x\nhttp://127.0.0.1:1\n' >"$T/badpool"
if "$moepager" loadgen --pool "$T/badpool" --prompts "$prompts" --duration 1 2>"$T/e1"; then
	bad "loadgen took a pool file without an epoch"
fi
grep -q 'want "epoch N" first' "$T/e1" || bad "no message for the bad pool file: $(cat "$T/e1")"
printf 'epoch 4\nftp://x\n' >"$T/badpool"
"$moepager" loadgen --pool "$T/badpool" --prompts "$prompts" --duration 1 2>"$T/e2" &&
	bad "loadgen took a pool file with a bad URL"
printf 'epoch 5\n' >"$T/badpool"
"$moepager" loadgen --pool "$T/badpool" --prompts "$prompts" --duration 1 2>"$T/e3" &&
	bad "loadgen took a pool without servers"
grep -q "has no server" "$T/e3" || bad "no message for an empty pool: $(cat "$T/e3")"
"$moepager" serve --model "$model" --epoch many --port-file "$T/x.port" 2>/dev/null &&
	bad "serve took --epoch many"
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget lots 2>"$T/e4" &&
	bad "--set-budget lots was taken"
[[ -s $T/e4 ]] || bad "no message for --set-budget lots"
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 100% --json >"$T/st2.json"
[[ $(json "$T/st2.json" budget_bytes) == $(json "$T/st.json" budget_bytes) ]] ||
	bad "a refused --set-budget changed the budget"
# A server that left without leaving the pool: requests it refuses go to the other one.
pool 4 "$port_a" "$port_b"
"$moepager" loadgen --pool "$T/pool" --prompts "$prompts" --rate 8 --duration 1.5 \
	--max-tokens 4 --retry-s 60 --json >"$T/lg2.json" 2>"$T/lg2.err" || bad "loadgen 2"
[[ $(json "$T/lg2.json" errors) == 0 ]] || bad "requests failed with a dead server in the pool"
[[ $(json "$T/lg2.json" retried) -gt 0 ]] || bad "no request was refused by the dead server"
kill -TERM "$pid_b"
wait "$pid_b"

# The daemon dies: a server that has mapped nothing answers its next request with an
# error naming the daemon, not a hang, and still exits cleanly.
kill -9 "${KILL[0]}"
wait "${KILL[0]}" 2>/dev/null
rm -f "$sock"
"$moepager" pagerd --model "$model" --socket "$sock" --budget 100% >"$T/d2.out" 2>&1 &
KILL+=($!)
daemon2=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
serve c 5 1
kill -9 $daemon2
wait $daemon2 2>/dev/null
code=$(curl -s -m 60 -o "$T/c.json" -w '%{http_code}' "127.0.0.1:$PORT/v1/completions" \
	-d '{"prompt": "Q: What is a", "max_tokens": 4, "temperature": 0}')
[[ $code == 500 ]] || bad "a request after the daemon's death got $code, not 500"
grep -q "pager daemon this server is attached to is gone" "$T/c.json" || bad "no message naming the daemon: $(cat "$T/c.json")"
kill -TERM "$pid_c"
wait "$pid_c" || bad "server c exited non-zero after the daemon's death"

# bench-elastic under a small load: no failed request; the shared scale-up reads none of
# the weights. Its disk_bytes_read also counts pages of code or of the model's header that
# memory pressure evicted (4 KiB seen once on a loaded machine), so the bound is one expert:
# the daemon reads whole experts, and the dense weights read are counted apart.
xbytes=$("$moepager" inspect "$model" | awk '/^experts/ {print $4}')
"$moepager" bench-elastic --model "$model" --load 4 --phase 1 --json >"$T/bench.json" \
	2>"$T/bench.err" || { tail "$T/bench.err"; bad "bench-elastic --load"; }
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in ("shared", "second_copy", "cold_restart"):
	assert d[k]["failed_requests"] == 0, (k, d[k])
	assert d[k]["requests"] > 0 and d[k]["peak_memory_bytes"] > 0, (k, d[k])
	assert [e["epoch"] for e in d[k]["epochs"]] == [1, 2, 3], (k, d[k]["epochs"])
xbytes = int(sys.argv[2])
assert xbytes > 0
assert d["shared"]["disk_bytes_read"] < xbytes, d["shared"]
assert d["shared"]["new_server"]["dense_read_bytes"] == 0, d["shared"]["new_server"]
assert d["shared"]["new_server"]["dense_lent_bytes"] > 0, d["shared"]["new_server"]
assert d["shared"]["downtime_s"] == 0 and d["cold_restart"]["downtime_s"] > 0
assert d["second_copy"]["disk_bytes_read"] > 10 * xbytes, d["second_copy"]' "$T/bench.json" "$xbytes" ||
	bad "bench-elastic --load's figures"
# bench-elastic --threads-to: a server's threads 1 -> 2 -> 1 in place under load, none failed.
"$moepager" bench-elastic --model "$model" --load 4 --phase 1 --threads-to 2 --json \
	>"$T/bench-t.json" 2>"$T/bench-t.err" || { tail "$T/bench-t.err"; bad "--threads-to"; }
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in ("fixed", "in_place"):
	assert d[k]["failed_requests"] == 0 and d[k]["requests"] > 0, (k, d[k])
ch = d["in_place"]["changes"]
assert [(c["status"], c["from"], c["to"], c["threads_seen"]) for c in ch] == \
	[(200, 1, 2, 2), (200, 2, 1, 1)], ch
assert d["fixed"]["changes"] == []' "$T/bench-t.json" || bad "bench-elastic --threads-to's figures"
"$moepager" bench-elastic --model "$model" --threads-to 2 2>"$T/e5" &&
	bad "--threads-to without --load was taken"
grep -q "needs --load" "$T/e5" || bad "no message for --threads-to without --load"
exit $((fails > 0))
