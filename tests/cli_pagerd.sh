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
dir=$(mktemp -d)
daemon=
trap '[[ -n $daemon ]] && kill -9 $daemon 2>/dev/null; rm -rf "$dir"' EXIT
sock=$dir/pagerd.sock
fail=0
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
	for _ in $(seq 100); do [[ -S $sock ]] && return 0; sleep 0.1; done
	echo "FAILED: the daemon did not listen"; cat "$1.err"; exit 1
}
stop() {
	kill -TERM $daemon
	wait $daemon || { echo "FAILED: the daemon exited non-zero"; fail=1; }
	daemon=
}
attached() {
	local out
	out=$(run "$model" --attach "$sock" 2>"$dir/run.err") ||
		{ echo "FAILED: an attached run"; cat "$dir/run.err"; exit 1; }
	[[ $(field tokens <<<"$out") == "$resident" ]] ||
		{ echo "FAILED: an attached run decoded other tokens than the resident run"; fail=1; }
	[[ $(field mode <<<"$out") == '"attached"' ]] || { echo "FAILED: mode is not attached"; fail=1; }
}
stat() {
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
resident=$(run "$model" --resident | field tokens) || exit 1

start "$dir/one.json"
attached
stop
start "$dir/two.json"
attached
attached
# Two servers on the one daemon answer a greedy completion with the same text.
servers=()
for i in 1 2; do
	"$moepager" serve --model "$model" --attach "$sock" --listen 127.0.0.1:0 \
		--port-file "$dir/port$i" 2>"$dir/serve$i.err" &
	servers+=($!)
done
texts=()
for i in 1 2; do
	for _ in $(seq 100); do [[ -s $dir/port$i ]] && break; sleep 0.1; done
	texts+=("$(curl -s "127.0.0.1:$(cat "$dir/port$i")/v1/completions" \
		-d '{"prompt": "Q: What is a", "max_tokens": 12, "temperature": 0}' |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])')")
done
kill -TERM "${servers[@]}"
wait "${servers[@]}"
[[ -n ${texts[0]} && ${texts[0]} == "${texts[1]}" ]] ||
	{ echo "FAILED: two attached servers answered '${texts[0]}' and '${texts[1]}'"; fail=1; }
"$moepager" gen --preset tiny --out "$dir/other.mpk" >/dev/null || exit 1
if "$moepager" run --model "$dir/other.mpk" --attach "$sock" --tokens 2 2>"$dir/r3.err" >/dev/null
then
	echo "FAILED: a run of another model attached"; fail=1
fi
grep -q "the client opened another model" "$dir/r3.err" ||
	{ echo "FAILED: no message naming the other model:"; cat "$dir/r3.err"; fail=1; }
# The budget changes while the daemon serves: down to half the experts, evicting; the run
# after it still decodes the same tokens.
"$moepager" pagerd --model "$model" --socket "$sock" --set-budget 50% --json >"$dir/set.json" ||
	{ echo "FAILED: --set-budget"; fail=1; }
[[ $(stat "$dir/set.json" resident_bytes) -le $(stat "$dir/set.json" budget_bytes) ]] ||
	{ echo "FAILED: the daemon holds more than its new budget"; fail=1; }
attached
stop

one=$(stat "$dir/one.json" disk_bytes_read)
two=$(stat "$dir/set.json" disk_bytes_read)	# before the run after the shrink
echo "bytes read from disk: $one serving one run, $two serving two"
[[ $one -gt 0 && $two -eq $one ]] ||
	{ echo "FAILED: the second attached run read from disk"; fail=1; }
[[ $(stat "$dir/two.json" memfd_bytes) -le $(stat "$dir/two.json" budget_bytes) ]] ||
	{ echo "FAILED: the memfd holds more than the budget"; fail=1; }
[[ $(stat "$dir/two.json" refused) -eq 1 ]] || { echo "FAILED: not 1 refusal"; fail=1; }
# bench-elastic: the engine that attaches reads nothing from disk, a second copy does.
"$moepager" bench-elastic --model "$model" --budget 50% --json >"$dir/elastic.json" ||
	{ echo "FAILED: bench-elastic"; fail=1; }
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["shared"]["disk_bytes_read"] == 0, d["shared"]
assert d["second_copy"]["disk_bytes_read"] > 0, d["second_copy"]
assert d["cold_restart"]["downtime_s"] > 0 and d["shared"]["downtime_s"] == 0
for k in ("shared", "second_copy", "cold_restart"):
	assert d[k]["peak_memory_bytes"] > 0 and d[k]["scale_up_s"] > 0, k' "$dir/elastic.json" ||
	{ echo "FAILED: bench-elastic's figures"; fail=1; }
exit $fail
