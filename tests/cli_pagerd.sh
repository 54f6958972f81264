#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager pagerd` with `moepager run --attach` on the trained model: attached runs decode
# the same tokens as a resident run; a daemon that served two runs read from disk exactly
# what a daemon that served one read (the second run read nothing: the daemon's --json at
# exit); its memory stays within the budget; a run of another model is refused with the
# daemon's message; two `moepager serve --attach` on one daemon answer alike; the budget
# shrinks while it serves (--set-budget); bench-elastic's attaching engine reads nothing
# from disk. Needs userfaultfd (CI runs as root).
set -u
moepager=$1
model=$2
. "$(dirname "$0")/cli_lib.sh"
daemon=
sock=$T/pagerd.sock
field() {
	python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)[sys.argv[1]]))' "$1"
}
run() {
	"$moepager" run --model "$1" --prompt "Q: What is a" --tokens 16 --json "${@:2}"
}
start() {
	"$moepager" pagerd --model "$model" --socket "$sock" --budget 100% --json >"$1" \
		2>"$1.err" &
	daemon=$!
	KILL+=("$daemon")
	for _ in $(seq 100); do [[ -S $sock ]] && return 0; sleep 0.1; done
	echo "FAILED: the daemon did not listen"; cat "$1.err"; exit 1
}
stop() {
	kill -TERM $daemon
	wait $daemon || bad "the daemon exited non-zero"
	forget $daemon
	daemon=
}
attached() {
	local out
	out=$(run "$model" --attach "$sock" 2>"$T/run.err") ||
		{ echo "FAILED: an attached run"; cat "$T/run.err"; exit 1; }
	[[ $(field tokens <<<"$out") == "$resident" ]] ||
		bad "an attached run decoded other tokens than the resident run"
	[[ $(field mode <<<"$out") == '"attached"' ]] || bad "mode is not attached"
}
stat() {
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
resident=$(run "$model" --resident | field tokens) || exit 1

start "$T/one.json"
attached
stop
start "$T/two.json"
attached
attached
# Two servers on the one daemon answer a greedy completion with the same text.
servers=()
for i in 1 2; do
	"$moepager" serve --model "$model" --attach "$sock" --listen 127.0.0.1:0 \
		--port-file "$T/port$i" 2>"$T/serve$i.err" &
	servers+=($!)
	KILL+=($!)
done
texts=()
for i in 1 2; do
	port=$(wait_port "$T/port$i" "${servers[i - 1]}")
	texts+=("$(curl -s "127.0.0.1:$port/v1/completions" \
		-d '{"prompt": "Q: What is a", "max_tokens": 12, "temperature": 0}' |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])')")
done
kill -TERM "${servers[@]}"
wait "${servers[@]}"
for p in "${servers[@]}"; do forget "$p"; done
[[ -n ${texts[0]} && ${texts[0]} == "${texts[1]}" ]] ||
	bad "two attached servers answered '${texts[0]}' and '${texts[1]}'"
"$moepager" gen --preset tiny --out "$T/other.mpk" >/dev/null || exit 1
if "$moepager" run --model "$T/other.mpk" --attach "$sock" --tokens 2 2>"$T/r3.err" >/dev/null
then
	bad "a run of another model attached"
fi
grep -q "the client opened another model" "$T/r3.err" ||
	{ bad "no message naming the other model:"; cat "$T/r3.err"; }
# The budget changes while the daemon serves: down to half the experts, evicting; the run
# after it still decodes the same tokens.
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 50% --json >"$T/set.json" ||
	bad "--set-budget"
[[ $(stat "$T/set.json" resident_bytes) -le $(stat "$T/set.json" budget_bytes) ]] ||
	bad "the daemon holds more than its new budget"
attached
stop

one=$(stat "$T/one.json" disk_bytes_read)
two=$(stat "$T/set.json" disk_bytes_read)	# before the run after the shrink
echo "bytes read from disk: $one serving one run, $two serving two"
[[ $one -gt 0 && $two -eq $one ]] ||
	bad "the second attached run read from disk"
[[ $(stat "$T/two.json" memfd_bytes) -le $(stat "$T/two.json" budget_bytes) ]] ||
	bad "the memfd holds more than the budget"
[[ $(stat "$T/two.json" refused) -eq 1 ]] || bad "not 1 refusal"
# bench-elastic: the engine that attaches reads nothing from disk, a second copy does.
"$moepager" bench-elastic --model "$model" --budget 50% --json >"$T/elastic.json" ||
	bad "bench-elastic"
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["shared"]["disk_bytes_read"] == 0, d["shared"]
assert d["second_copy"]["disk_bytes_read"] > 0, d["second_copy"]
assert d["cold_restart"]["downtime_s"] > 0 and d["shared"]["downtime_s"] == 0
for k in ("shared", "second_copy", "cold_restart"):
	assert d[k]["peak_memory_bytes"] > 0 and d[k]["scale_up_s"] > 0, k' "$T/elastic.json" ||
	bad "bench-elastic's figures"
exit $((fails > 0))
