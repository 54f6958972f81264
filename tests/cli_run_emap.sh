#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager run --prefetch finemoe --emap FILE` on the trained model: the expert-map
# store survives the process (the second run starts with the first run's records), the
# prefetcher gets each token's embedding, prefetching changes no token, and a map file
# that is not one is refused with a message naming it.
set -u
moepager=$1
model=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {
	"$moepager" run --model "$model" --prompt "Q: What is a" --tokens 24 --budget 50% \
		--json "$@"
}
field() {
	python3 -c 'import json, sys
d = json.load(sys.stdin)
v = d
for k in sys.argv[1].split("."):
	v = v[k]
print(json.dumps(v))' "$1"
}
fail=0
plain=$(run | field tokens) || exit 1
first=$(run --prefetch finemoe --emap "$dir/maps") || exit 1
second=$(run --prefetch finemoe --emap "$dir/maps") || exit 1
[[ -s $dir/maps ]] || { echo "FAILED: no map file written"; fail=1; }
n1=$(field prefetch.emap_records <<<"$first")
n2=$(field prefetch.emap_records <<<"$second")
echo "records: $n1 after the first run, $n2 after the second"
[[ $n1 -eq 24 ]] || { echo "FAILED: the first run stored $n1 records, not one per token"; fail=1; }
[[ $n2 -eq $((2 * n1)) ]] ||
	{ echo "FAILED: the second run did not start from the first run's records"; fail=1; }
[[ $(field prefetch.semantic <<<"$first") == true ]] ||
	{ echo "FAILED: no semantic vectors without a trace"; fail=1; }
# One begin event (the token's embedding) and one gate event per layer for each token.
events=$(field prefetch.events <<<"$first")
[[ $events -eq $((24 * 7)) ]] || { echo "FAILED: $events events, not 24 x (6 gates + 1)"; fail=1; }
for out in "$first" "$second"; do
	[[ $(field tokens <<<"$out") == "$plain" ]] ||
		{ echo "FAILED: prefetching changed the tokens"; fail=1; }
done
echo "not a map" > "$dir/bad"
if err=$(run --prefetch finemoe --emap "$dir/bad" 2>&1 >/dev/null); then
	echo "FAILED: a corrupt map file was accepted"
	fail=1
fi
[[ $err == *"$dir/bad"* ]] || { echo "FAILED: the error does not name the file: $err"; fail=1; }
echo "$err" | tail -n 1
exit $fail
