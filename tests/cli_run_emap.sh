#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager run --prefetch finemoe --emap FILE` on the trained model: the expert-map
# store survives the process (the second run starts with the first run's records), the
# prefetcher gets each token's embedding, prefetching changes no token, and a map file
# that is not one is refused with a message naming it.
set -u
moepager=$1
model=$2
. "$(dirname "$0")/cli_lib.sh"
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
plain=$(run | field tokens) || exit 1
first=$(run --prefetch finemoe --emap "$T/maps") || exit 1
second=$(run --prefetch finemoe --emap "$T/maps") || exit 1
[[ -s $T/maps ]] || bad "no map file written"
n1=$(field prefetch.emap_records <<<"$first")
n2=$(field prefetch.emap_records <<<"$second")
echo "records: $n1 after the first run, $n2 after the second"
[[ $n1 -eq 24 ]] || bad "the first run stored $n1 records, not one per token"
[[ $n2 -eq $((2 * n1)) ]] ||
	bad "the second run did not start from the first run's records"
[[ $(field prefetch.semantic <<<"$first") == true ]] ||
	bad "no semantic vectors without a trace"
# One begin event (the token's embedding) and one gate event per layer for each token.
events=$(field prefetch.events <<<"$first")
[[ $events -eq $((24 * 7)) ]] || bad "$events events, not 24 x (6 gates + 1)"
for out in "$first" "$second"; do
	[[ $(field tokens <<<"$out") == "$plain" ]] ||
		bad "prefetching changed the tokens"
done
echo "not a map" > "$T/bad"
if err=$(run --prefetch finemoe --emap "$T/bad" 2>&1 >/dev/null); then
	bad "a corrupt map file was accepted"
fi
[[ $err == *"$T/bad"* ]] || bad "the error does not name the file: $err"
echo "$err" | tail -n 1
exit $((fails > 0))
