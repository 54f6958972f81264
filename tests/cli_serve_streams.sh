#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: many streams at once through the HTTP thread's tick, with clients that leave
# mid-stream, round after round on one server: every stream that is read to its end has the
# bytes of the same request alone ("created" and "id" aside), the server keeps serving and
# stops cleanly with nothing cut short. The hand-over of streams between the scheduler's
# thread and the HTTP thread (docs/serve.md) is what it exercises; loop it to look for races.
#
#   cli_serve_streams.sh MOEPAGER MODEL.mpk [ROUNDS]
set -uo pipefail
MOEPAGER=$1
MODEL=$2
ROUNDS=${3:-3}
. "$(dirname "$0")/serve_lib.sh"

norm() { sed 's/"created":[0-9]*/"created":0/g; s/"id":"[^"]*"/"id":""/g'; }
req() { printf '{"prompt": "Once upon a time %s", "max_tokens": %s, "temperature": 0, "ignore_eos": true, "stream": true}' "$1" "$2"; }

for iv in 0 500 2000; do
	serve_start --model "$MODEL" --max-batch 4 --stream-interval-us "$iv" || exit 1
	# Each request alone first: the bytes every later one must have.
	for k in 1 2 3 4 5 6; do
		curl -sN "$URL/v1/completions" -d "$(req "$k" $((16 + 8 * k)))" | norm >"$T/ref.$k"
	done
	for r in $(seq "$ROUNDS"); do
		pids=()
		for k in 1 2 3 4 5 6; do
			curl -sN "$URL/v1/completions" -d "$(req "$k" $((16 + 8 * k)))" | norm >"$T/got.$k" &
			pids+=($!)
		done
		# Two that leave after their first events: their requests are cancelled.
		for k in 1 2; do
			curl -sN "$URL/v1/completions" -d "$(req "x$k" 200)" | head -c 300 >/dev/null &
			pids+=($!)
		done
		wait "${pids[@]}"
		for k in 1 2 3 4 5 6; do
			cmp -s "$T/ref.$k" "$T/got.$k" || bad "interval $iv us, round $r: stream $k differs from alone"
		done
	done
	check "interval $iv us: the server still answers /health" \
		test "$(curl -s "$URL/health")" = '{"status":"ok"}'
	check "interval $iv us: $ROUNDS rounds of 6 streams and 2 that left, then SIGTERM: exit 0" stop
	check "interval $iv us: nothing cut short at the stop" grep -q "0 request(s) cut short" "$T/server.err"
done
((fails == 0)) && ok "every stream read to its end equals the same request alone"
exit $((fails > 0))
