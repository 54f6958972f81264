#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager serve` end to end with curl on 127.0.0.1 (a free port): the
# endpoints, streaming, batched requests equal to lone ones, every bad input answered
# with a 4xx naming the field while the server keeps serving, a full queue (503 with
# Retry-After), a client leaving mid-stream, a client trickling bytes, Prometheus text
# that parses, and SIGTERM with requests in flight.
#
#   cli_serve.sh MOEPAGER MODEL.mpk
set -uo pipefail
MOEPAGER=$1
MODEL=$2
PY=/usr/bin/python3
. "$(dirname "$0")/serve_lib.sh"

# start ARGS...: the server over MODEL.
start() { serve_start --model "$MODEL" "$@"; }

# post BODY [CURL ARGS...]: prints the body, then the status on its own last line.
post() {
	local body=$1
	shift
	curl -s -o "$T/body" -w '%{http_code}' "$URL/v1/completions" -d "$body" "$@" >"$T/code"
	cat "$T/body"
	printf '\n%s\n' "$(cat "$T/code")"
}

# json FILE EXPR: evaluates a Python expression on the JSON in FILE (as j).
json() {
	"$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}

# expect_error BODY STATUS PARAM: a 4xx JSON error naming PARAM ("" for none).
expect_error() {
	local body=$1 want=$2 param=$3 got
	post "$body" >/dev/null
	got=$(cat "$T/code")
	if [[ $got != "$want" ]]; then
		bad "$body -> $got, want $want: $(cat "$T/body")"
		return
	fi
	if [[ $(json "$T/body" "j['error']['param'] or ''") != "$param" ]]; then
		bad "$body -> error names '$(json "$T/body" "j['error']['param']")', want '$param'"
		return
	fi
	ok "$body -> $want naming '${param:-nothing}': $(json "$T/body" "j['error']['message']")"
}

healthy() {
	[[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/health") == 200 ]]
}

start --max-batch 4 --max-queue 16 --max-body 4K --request-timeout 2 || exit 1

# Endpoints
check "/health answers ok" test "$(curl -s "$URL/health")" = '{"status":"ok"}'

# http_policy: the server's HTTP thread's scheduling policy (/proc stat field 41; 3: SCHED_BATCH).
http_policy() {
	local t
	for t in /proc/"$SERVER"/task/*; do
		[[ $(cat "$t/comm" 2>/dev/null) == serve-http ]] && sed 's/.*) //' "$t/stat" | awk '{print $39}'
	done
}
check "the HTTP thread runs at SCHED_BATCH (woken by a step, it does not preempt the scheduler)" \
	test "$(http_policy)" = 3
curl -s "$URL/v1/models" >"$T/models"
check "/v1/models lists tiny-real" test "$(json "$T/models" "j['data'][0]['id']")" = tiny-real

# A greedy completion, as JSON and as a stream: the same text.
post '{"prompt": "The meaning of life is", "max_tokens": 24, "temperature": 0}' >/dev/null
check "a completion answers 200" test "$(cat "$T/code")" = 200
cp "$T/body" "$T/plain"
check "usage counts the prompt and the completion" \
	test "$(json "$T/plain" "j['usage']['prompt_tokens'] + j['usage']['completion_tokens'] == j['usage']['total_tokens'] and j['usage']['completion_tokens'] > 0")" = True
curl -sN -D "$T/sse.h" "$URL/v1/completions" -d '{"prompt": "The meaning of life is", "max_tokens": 24, "temperature": 0, "stream": true}' >"$T/sse"
check "the stream ends with [DONE]" test "$(tail -n 2 "$T/sse" | head -n 1)" = "data: [DONE]"
"$PY" - "$T/sse" "$T/plain" <<'EOF'
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-1]
chunks = [json.loads(e) for e in events[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks)
finish = [c["choices"][0]["finish_reason"] for c in chunks]
plain = json.load(open(sys.argv[2]))["choices"][0]
assert text == plain["text"], (text, plain["text"])
assert finish[-1] == plain["finish_reason"] and all(f is None for f in finish[:-1]), finish
print("ok: the stream's chunks join into the plain completion's text (%d chunks)" % len(chunks))
EOF
[[ $? == 0 ]] || bad "stream and plain completion differ"

# The bytes clients parse (the OpenAI SDK, node-llama-cpp), pinned: every event and the
# plain answer rebuilt from their values in the one layout the server writes, byte for byte.
for h in 'Content-Type: text/event-stream' 'Cache-Control: no-cache' \
	'Transfer-Encoding: chunked'; do
	check "the stream's headers: $h, once" test "$(grep -ci "^$h" "$T/sse.h")" = 1
done
"$PY" - "$T/sse" "$T/plain" <<'EOF'
import json, sys

def esc(s):
    # jansson's escapes: quote, backslash, the short control ones, other controls as \u00XX
    short = {'"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r',
             '\t': '\\t'}
    return '"' + ''.join(short.get(c) or ('\\u%04X' % ord(c) if ord(c) < 0x20 else c)
                         for c in s) + '"'

def head(j):
    return ('{"id":"%s","object":"text_completion","created":%d,"model":"%s","choices":'
            '[{"text":%s,"index":0,"logprobs":null,"finish_reason":' %
            (j["id"], j["created"], j["model"], esc(j["choices"][0]["text"])))

def usage(j):
    u = j["usage"]
    return (',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}' %
            (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]))

raw = open(sys.argv[1], "rb").read()
events = raw.split(b"\n\n")
assert events[-1] == b"" and events[-2] == b"data: [DONE]", events[-2:]
chunks = [json.loads(e[6:]) for e in events[:-2]]
want = "".join("data: " + head(c) + "null}]}\n\n" for c in chunks[:-1])
last = chunks[-1]
want += "data: " + head(last) + '"%s"}]' % last["choices"][0]["finish_reason"] + usage(last)
want += "\n\ndata: [DONE]\n\n"
assert raw == want.encode(), (raw[:300], want[:300])
assert all(c["id"] == last["id"] and c["created"] == last["created"] for c in chunks)
plain = open(sys.argv[2], "rb").read()
p = json.loads(plain)
assert plain == (head(p) + '"%s"}]' % p["choices"][0]["finish_reason"] + usage(p)).encode(), plain
print("ok: the stream's %d events and the plain answer are in their layout, byte for byte"
      % len(chunks))
EOF
[[ $? == 0 ]] || bad "the stream's or the plain answer's bytes are not in the layout clients parse"

# Token ids as the prompt, and a stop string that ends the text before it.
post '{"prompt": [1, 450, 693], "max_tokens": 5, "temperature": 0}' >/dev/null
check "a prompt of token ids answers 200" test "$(cat "$T/code")" = 200
post '{"prompt": "Q: what", "max_tokens": 60, "temperature": 0, "stop": [" the", "."]}' >/dev/null
check "a stop string ends the text before it" \
	test "$(json "$T/body" "j['choices'][0]['finish_reason'] == 'stop' and ' the' not in j['choices'][0]['text'] and '.' not in j['choices'][0]['text']")" = True

# The text of a request without stop strings is made on the HTTP thread (its ids kept by
# the scheduler's), that of one with stop strings on the scheduler's thread (a stop ends
# it there): a one-byte stop string that never comes holds nothing back, so both streams
# have the same events, byte for byte, and the plain answer the same text.
for k in nostop stop; do
	extra=''
	[[ $k == stop ]] && extra=', "stop": "\u0001"'
	curl -sN "$URL/v1/completions" -d "{\"prompt\": \"The meaning of life is\", \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true$extra}" |
		sed 's/"created":[0-9]*/"created":0/g; s/"id":"[^"]*"/"id":""/g' >"$T/$k.sse"
	post "{\"prompt\": \"The meaning of life is\", \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true$extra}" >/dev/null
	json "$T/body" "j['choices'][0]['text']" >"$T/$k.text"
done
check "a stream without stop strings (text made on the HTTP thread) has $(grep -c '^data: {' "$T/nostop.sse") events, those of one with a stop string that never comes" \
	cmp "$T/nostop.sse" "$T/stop.sse"
check "the plain answers with and without that stop string have the same text" \
	cmp "$T/nostop.text" "$T/stop.text"
check "the stream's text is the plain answer's" \
	test "$("$PY" -c 'import json,sys; print("".join(json.loads(l[6:])["choices"][0]["text"] for l in open(sys.argv[1]) if l.startswith("data: {")))' "$T/nostop.sse")" = "$(cat "$T/nostop.text")"

# Requests decoded together give what each gives alone (greedy).
for i in 0 1 2 3; do
	post "{\"prompt\": \"Fortune $i says\", \"max_tokens\": 30, \"temperature\": 0, \"ignore_eos\": true}" >/dev/null
	json "$T/body" "j['choices'][0]['text']" >"$T/alone.$i"
done
pids=()
for i in 0 1 2 3; do
	curl -s "$URL/v1/completions" -d "{\"prompt\": \"Fortune $i says\", \"max_tokens\": 30, \"temperature\": 0, \"ignore_eos\": true}" >"$T/together.$i" &
	pids+=($!)
done
wait "${pids[@]}"
same=1
for i in 0 1 2 3; do
	[[ $(json "$T/together.$i" "j['choices'][0]['text']") == "$(cat "$T/alone.$i")" ]] || same=0
done
check "four concurrent greedy requests give their lone texts" test $same = 1

# Bad input: a 4xx naming the field, and the server goes on serving.
expect_error '{"prompt": "x", "max_tokens": 3' 400 ""
expect_error '[1, 2]' 400 ""
expect_error '{"prompt": "x", "max_tokens": "ten"}' 400 max_tokens
expect_error '{"prompt": "x", "max_tokens": 0}' 400 max_tokens
expect_error '{"prompt": "x", "max_tokens": 254}' 400 max_tokens
expect_error '{"prompt": "x", "temperature": 7}' 400 temperature
expect_error '{"prompt": "x", "stream": "yes"}' 400 stream
expect_error '{"prompt": 42}' 400 prompt
expect_error '{"prompt": ["a", "b"]}' 400 prompt
expect_error '{"max_tokens": 4}' 400 prompt
expect_error '{"prompt": [1, 99999]}' 400 prompt
expect_error "{\"prompt\": [$(seq -s, 1 300)]}" 400 prompt
expect_error '{"prompt": "x", "model": "gpt-5"}' 404 model
expect_error '{"prompt": "x", "n": 2}' 400 n
expect_error '{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}' 400 stop
expect_error "{\"prompt\": \"$(head -c 6000 /dev/zero | tr '\0' a)\"}" 413 ""
check "GET on /v1/completions is 405" \
	test "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions")" = 405
check "an unknown path is 404" test "$(curl -s -o /dev/null -w '%{http_code}' "$URL/nope")" = 404
# libmicrohttpd's per-connection pool (32 KiB: malloc()ed, not mmap()ed) holds the headers:
# a request with an 8 KiB header is still answered.
pad=$(head -c 8192 /dev/zero | tr '\0' a)
check "a request with an 8 KiB header is answered" \
	test "$(post '{"prompt": "x", "max_tokens": 4}' -H "X-Pad: $pad" | tail -n 1)" = 200
check "the server still serves after every bad input" healthy

# A client trickling its headers is cut off after --request-timeout; others are served meanwhile.
"$PY" - "$PORT" >"$T/trickle" <<'EOF' &
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t0 = time.time()
try:
    for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n":
        s.send(bytes([ch]))
        time.sleep(0.25)
        if time.time() - t0 > 20:
            break
    r = s.recv(100)
    print("closed" if r == b"" else "answered", round(time.time() - t0, 1))
except (BrokenPipeError, ConnectionResetError):
    print("closed", round(time.time() - t0, 1))
EOF
TRICKLE=$!
post '{"prompt": "x", "max_tokens": 4, "temperature": 0}' >/dev/null
check "a request is served while another client trickles" test "$(cat "$T/code")" = 200
wait $TRICKLE
check "the trickling client is closed after the timeout ($(cat "$T/trickle"))" \
	"$PY" -c "import sys; w=sys.argv[1].split(); sys.exit(not (w[0] == 'closed' and float(w[1]) < 10))" "$(cat "$T/trickle")"

# Prometheus text that a real parser reads, with the histograms whole.
curl -s "$URL/metrics" >"$T/metrics"
"$PY" - "$T/metrics" <<'EOF'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
for name in ("moepager_time_to_first_token_seconds", "moepager_time_per_output_token_seconds",
             "moepager_batch_size"):
    f = fams[name]
    assert f.type == "histogram", (name, f.type)
    les = [s.labels["le"] for s in f.samples if s.name.endswith("_bucket")]
    assert les[-1] == "+Inf", les
    counts = [s.value for s in f.samples if s.name.endswith("_bucket")]
    assert counts == sorted(counts), counts
    assert any(s.name.endswith("_count") for s in f.samples)
for name in ("moepager_requests", "moepager_generation_tokens", "moepager_http_requests",
             "moepager_queue_length", "moepager_running_requests", "moepager_kv_cache_bytes"):
    assert name in fams, name
print("ok: /metrics parses as Prometheus text (%d families)" % len(fams))
EOF
[[ $? == 0 ]] || bad "/metrics does not parse"

check "SIGTERM with nothing running exits 0" stop

# --stream-interval-us: a stream's tokens between writes wait for one write. At 1 s a
# stream of 200 tokens is resumed for its first text and its end only, and its bytes are
# those of a server writing after every step (0), "created" aside. At 0 the HTTP thread
# is resumed whenever a step finds it parked: how often is the scheduler's to say (48
# tokens, ~4 ms on a fast machine, once saw 3 under CI's parallel tests), so the stream
# is long enough (~20 ms and up; 11-124 wake-ups beside a busy loop) that 3 or fewer
# means its tokens were held back.
for iv in 0 1 1000000; do
	start --stream-interval-us "$iv" || exit 1
	curl -sN "$URL/v1/completions" -d '{"prompt": "The meaning of life is", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true}' |
		sed 's/"created":[0-9]*/"created":0/g' >"$T/iv$iv.sse"
	curl -s "$URL/metrics" | awk '$1 == "moepager_http_resumes_total" {print $2}' >"$T/iv$iv.resumes"
	check "a stream at --stream-interval-us $iv ends with [DONE]" \
		test "$(tail -n 2 "$T/iv$iv.sse" | head -n 1)" = "data: [DONE]"
	check "the server at --stream-interval-us $iv stops cleanly" stop
done
check "a stream coalesced for 1 s has the bytes of one written every step" \
	cmp "$T/iv0.sse" "$T/iv1000000.sse"
check "coalesced: 2 or 3 wake-ups for 200 tokens ($(cat "$T/iv1000000.resumes")), more every step ($(cat "$T/iv0.resumes"))" \
	test "$(cat "$T/iv1000000.resumes")" -ge 2 -a "$(cat "$T/iv1000000.resumes")" -le 3 \
	-a "$(cat "$T/iv0.resumes")" -gt 3
check "a stream at 1 us (steps longer than the interval) has the bytes of one at 0" \
	cmp "$T/iv0.sse" "$T/iv1.sse"

# A first token may give no text (this prompt's: a lone space, held back); the stream's first
# text then goes with the next token, not at the tick (at 1 s: with the end). The client
# reads the socket itself: the first text and [DONE] come in different reads, ~230 steps apart.
NOTEXT="If our behavior is strict, we do not need fun!"
start --stream-interval-us 1000000 || exit 1
check "the prompt's first greedy token gives no text" \
	test "$(post "{\"prompt\": \"$NOTEXT\", \"max_tokens\": 1, \"temperature\": 0, \"ignore_eos\": true}" | head -n 1 |
		"$PY" -c 'import json, sys; print(repr(json.load(sys.stdin)["choices"][0]["text"]))')" = "''"
check "at 1 s its first text comes before its end, with its second token" "$PY" -c '
import json, re, socket, sys
body = json.dumps({"prompt": sys.argv[2], "max_tokens": 230, "temperature": 0,
                   "ignore_eos": True, "stream": True}).encode()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
buf, first, done, k = b"", None, None, 0
while True:
    d = s.recv(1 << 20)
    if not d:
        break
    buf += d
    if first is None and re.search(rb"\"text\":\"[^\"]", buf):
        first = k
    if done is None and b"data: [DONE]" in buf:
        done = k
    k += 1
assert first is not None and done is not None and first < done, (first, done)
' "$PORT" "$NOTEXT"
check "the server stops cleanly" stop

# Three streams at once share the server's tick (every stream's tokens go together, at 2 ms
# or 1 s): each still gets every token, in order, as written every step.
for iv in 0 2000 1000000; do
	start --stream-interval-us "$iv" || exit 1
	pids=()
	for k in 1 2 3; do
		curl -sN "$URL/v1/completions" -d "{\"prompt\": \"Once upon a time $k\", \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}" |
			sed 's/"created":[0-9]*/"created":0/g; s/"id":"[^"]*"/"id":""/g' >"$T/m$iv.$k.sse" &
		pids+=($!)
	done
	wait "${pids[@]}"
	check "the server with three streams at --stream-interval-us $iv stops cleanly" stop
done
for k in 1 2 3; do
	check "stream $k of 3 at 2 ms and at 1 s has the bytes of one written every step" \
		eval 'cmp "$T/m0.$k.sse" "$T/m2000.$k.sse" && cmp "$T/m0.$k.sse" "$T/m1000000.$k.sse"'
	check "stream $k of 3 ends with [DONE] after 40 tokens" "$PY" -c "
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split('\\n') if l.startswith('data: ')]
assert ev[-1] == '[DONE]' and json.loads(ev[-2])['usage']['completion_tokens'] == 40, ev[-2:]
" "$T/m1000000.$k.sse"
done

# Adapters (ExpertWeave): served by name beside the base, mixed in batches, each request as
# its merged model alone; bad adapters skipped at start with the reason; loads and unloads
# at run time, one while a request of it runs.
A=$T/adapters
mkdir -p "$A"
"$MOEPAGER" adapter gen "$MODEL" --out "$A/legal.mpa" --per-layer 2 --seed 1 >/dev/null &&
"$MOEPAGER" adapter gen "$MODEL" --out "$A/code.mpa" --per-layer 3 --seed 2 >/dev/null &&
"$MOEPAGER" adapter gen "$MODEL" --out "$T/late.mpa" --per-layer 1 --seed 3 >/dev/null &&
"$MOEPAGER" gen --preset tiny --quiet --out "$T/other.mpk" &&
"$MOEPAGER" adapter gen "$T/other.mpk" --out "$A/alien.mpa" --per-layer 1 >/dev/null &&
"$MOEPAGER" adapter gen "$MODEL" --out "$A/rotten.mpa" --per-layer 1 --seed 4 >/dev/null || exit 1
"$PY" -c "import sys; f=open(sys.argv[1], 'r+b'); f.seek(4096 + 77); b=f.read(1); f.seek(4096 + 77); f.write(bytes([b[0] ^ 255]))" "$A/rotten.mpa"
start --adapters "$A" --max-batch 4 || exit 1
check "an adapter made for another model is skipped, saying so" \
	grep -q "alien.mpa not loaded: .*was made for model 'tiny'" "$T/server.err"
check "a damaged adapter is skipped, saying so" \
	grep -q "rotten.mpa not loaded: .*checksum mismatch" "$T/server.err"
curl -s "$URL/v1/models" >"$T/models"
check "/v1/models lists the base and the good adapters" \
	test "$(json "$T/models" "sorted(m['id'] for m in j['data'])")" = "['code', 'legal', 'tiny-real']"
GREEDY='"max_tokens": 40, "temperature": 0, "ignore_eos": true'
pids=()
for m in legal code tiny-real legal; do
	curl -s "$URL/v1/completions" -d "{\"model\": \"$m\", \"prompt\": \"Fortune says\", $GREEDY}" >"$T/mixed.$m.${#pids[@]}" &
	pids+=($!)
done
wait "${pids[@]}"
check "an adapter's completion names its model" test "$(json "$T/mixed.code.1" "j['model']")" = code
curl -s "$URL/v1/adapters" >"$T/adapters.json"
check "GET /v1/adapters: two loaded, F_mem 1, less held than padded" \
	test "$(json "$T/adapters.json" "len(j['loaded']) == 2 and j['f_mem'] == 1.0 and j['held_bytes'] < j['padded_bytes']")" = True
admin() {	# admin METHOD PATH [BODY]: prints the status
	curl -s -o "$T/admin" -w '%{http_code}' -X "$1" "$URL$2" ${3:+-d "$3"}
}
cp "$T/late.mpa" "$A/late.mpa"
check "POST /v1/adapters loads one more (201)" test "$(admin POST /v1/adapters '{"file": "late.mpa"}')" = 201
check "loading it again is a conflict (409)" test "$(admin POST /v1/adapters '{"file": "late.mpa"}')" = 409
check "a path out of the directory is refused (400)" \
	test "$(admin POST /v1/adapters '{"file": "../late.mpa"}')" = 400
check "a file that is not there is 404" test "$(admin POST /v1/adapters '{"file": "none.mpa"}')" = 404
check "an adapter for another base is refused (400)" \
	test "$(admin POST /v1/adapters '{"file": "alien.mpa", "name": "x"}')" = 400
check "and its error says why" grep -q "was made for model" "$T/admin"
check "a bad body names the field (400)" test "$(admin POST /v1/adapters '{"flie": 1}')" = 400
# Unloading an adapter while a request of it streams: the request finishes whole.
curl -sN "$URL/v1/completions" -d '{"model": "late", "prompt": "x", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true}' >"$T/late.sse" &
LATE=$!
for _ in $(seq 200); do grep -q '^data: {' "$T/late.sse" 2>/dev/null && break; sleep 0.01; done
check "DELETE /v1/adapters/late unloads it (200)" test "$(admin DELETE /v1/adapters/late)" = 200
check "a new request for it is 404" test "$(post '{"model": "late", "prompt": "x"}' | tail -n 1)" = 404
check "unloading it again is 404" test "$(admin DELETE /v1/adapters/late)" = 404
wait $LATE
"$PY" - "$T/late.sse" <<'EOF'
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert ev[-1] == "[DONE]", ev[-1]
last = json.loads(ev[-2])
assert last["usage"]["completion_tokens"] == 200, last["usage"]
assert last["choices"][0]["finish_reason"] == "length", last
print("ok: the request of the unloaded adapter finished whole (200 tokens)")
EOF
[[ $? == 0 ]] || bad "a request of an unloaded adapter did not finish whole"
curl -s "$URL/metrics" >"$T/metrics"
check "once it ended, nothing drains" grep -q '^moepager_adapters_draining{model="tiny-real"} 0' "$T/metrics"
check "the unload is counted" grep -q '^moepager_adapters_unloads_total{model="tiny-real"} 1' "$T/metrics"
"$MOEPAGER" loadgen --url "$URL" --rate 20 --duration 1.5 --max-tokens 8 --mix power:1 --ignore-eos --json \
	--prompts "$(dirname "$0")/../data/prompts/heldout-fortunes.txt" >"$T/loadgen.json" 2>"$T/loadgen.err"
check "loadgen --mix power:1 spreads requests over the base and adapters, with no error" \
	test "$(json "$T/loadgen.json" "j['errors'] == 0 and sum(m['requests'] > 0 for m in j['models'].values()) >= 2")" = True
check "loadgen --ignore-eos: every request generated its 8 tokens" \
	test "$(json "$T/loadgen.json" "all(m['tokens'] == 8 * m['requests'] for m in j['models'].values())")" = True
check "loadgen reports the server's CPU time: the scheduler's, the HTTP thread's (handlers in it)" \
	test "$(json "$T/loadgen.json" "(lambda s: s['sched_cpu_seconds'] > 0 and s['http_thread_cpu_seconds'] >= s['http_handler_cpu_seconds'] > 0 and s['overhead_cpu_share'] > 0 and 0 < s['sched_share'] <= s['overhead_share'])(j['server'])")" = True
curl -s "$URL/metrics" >"$T/metrics"
check "later requests ran in finished requests' KV caches" \
	"$PY" -c "import sys; sys.exit(not any(l.startswith('moepager_sequences_reused_total{') and float(l.split()[1]) > 0 for l in open(sys.argv[1])))" "$T/metrics"
check "the adapter server stops cleanly" stop
# Paged (--budget): adapter rows are the pager's, under its budget with the base's experts;
# the texts must not change (checked against the merged models below).
check "--warm-rows without paged adapters is refused" \
	bash -c '"$1" serve --model "$2" --warm-rows 2>&1 | grep -q "warm-rows needs --adapters"' _ \
	"$MOEPAGER" "$MODEL"
# Warm rows: a request's adapter rows are read when it is admitted, as prefetches (the
# server runs no prefetch policy, so every one counted is a warm row's).
start --adapters "$A" --max-batch 4 --budget 30% --warm-rows || exit 1
pids=()
for m in legal code legal; do
	curl -s "$URL/v1/completions" -d "{\"model\": \"$m\", \"prompt\": \"Fortune says\", $GREEDY}" >"$T/mixed.$m.paged${#pids[@]}" &
	pids+=($!)
done
wait "${pids[@]}"
curl -s "$URL/metrics" >"$T/metrics.paged"
"$PY" - "$T/metrics.paged" <<'EOF'
import sys
m = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1]) if l.startswith(("moepager_pager_", "moepager_prefetch_"))}
get = lambda k: next(v for n, v in m.items() if n.startswith(k + "{"))
assert get("moepager_pager_resident_bytes") <= get("moepager_pager_budget_bytes"), m
assert get("moepager_pager_evictions_total") > 0, m
assert get("moepager_prefetch_issued_total") > 0, m
print("ok: paged adapters: resident within the budget, with evictions and warm rows")
EOF
[[ $? == 0 ]] || bad "paged adapters: the budget or eviction figures are wrong"
check "the paged adapter server stops cleanly" stop
# Each adapter's text above is its merged model's, decoded alone.
BASE_MODEL=$MODEL
for m in legal code; do
	"$MOEPAGER" adapter merge "$BASE_MODEL" "$A/$m.mpa" --out "$T/$m.mpk" >/dev/null || bad "merge $m"
	MODEL=$T/$m.mpk
	start --name "$m" --tokenizer "${BASE_MODEL%.mpk}.tok" || exit 1
	post "{\"prompt\": \"Fortune says\", $GREEDY}" >/dev/null
	for f in "$T"/mixed."$m".*; do
		check "$m in a mixed batch gives its merged model's lone text ($(basename "$f"))" \
			test "$(json "$f" "j['choices'][0]['text']")" = "$(json "$T/body" "j['choices'][0]['text']")"
	done
	stop
done
MODEL=$BASE_MODEL

# An API key: every endpoint but /health wants it; loadgen sends $MOEPAGER_API_KEY.
printf 'k3y-0f-this-test\n' >"$T/key"
start --api-key-file "$T/key" --max-batch 2 || exit 1
check "with a key, /health still answers without it" healthy
code=$(curl -s -D "$T/hdr" -o "$T/body" -w '%{http_code}' "$URL/v1/models")
check "/v1/models without the key -> 401" test "$code" = 401
check "... naming the Authorization header" \
	test "$(json "$T/body" "j['error']['param']")" = Authorization
check "... with 'WWW-Authenticate: Bearer'" grep -qi '^WWW-Authenticate: Bearer' "$T/hdr"
expect_error "{\"prompt\": \"Fortune says\", $GREEDY}" 401 Authorization
post "{\"prompt\": \"Fortune says\", $GREEDY}" -H 'Authorization: Bearer k3y-0f-this-tesT' >/dev/null
check "a wrong key (one letter) -> 401" test "$(cat "$T/code")" = 401
post "{\"prompt\": \"Fortune says\", $GREEDY}" -H 'Authorization: Bearer k3y-0f-this-test' >/dev/null
check "the key -> 200" test "$(cat "$T/code")" = 200
check "... with its completion" test "$(json "$T/body" "len(j['choices'][0]['text']) > 0")" = True
printf 'Fortune says\nA wise man once\n' >"$T/prompts"
MOEPAGER_API_KEY=k3y-0f-this-test "$MOEPAGER" loadgen --url "$URL" --rate 20 --duration 0.5 \
	--max-tokens 4 --prompts "$T/prompts" --json >"$T/lg.json" 2>"$T/lg.err"
check "loadgen with \$MOEPAGER_API_KEY is served (status $?)" \
	test "$(json "$T/lg.json" "j['errors'] == 0 and j['requests'] > 0")" = True
curl -s -H 'Authorization: Bearer k3y-0f-this-test' "$URL/metrics" >"$T/metrics"
check "/metrics counts the 401s" grep -q 'code="401"' "$T/metrics"
stop
MOEPAGER_API_KEY=an0ther-k3y start --max-batch 2 || exit 1
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models")
check "a server started with \$MOEPAGER_API_KEY wants it (status $code)" test "$code" = 401
check "... and takes it" test "$(curl -s -o /dev/null -w '%{http_code}' \
	-H 'Authorization: Bearer an0ther-k3y' "$URL/v1/models")" = 200
stop
refused() { refused_by "$1" "$MOEPAGER" serve --model "$MODEL" "${@:2}"; }
check "a key under 8 characters is refused" refused "8 at least" --api-key short
check "--api-key and --api-key-file together are refused" \
	refused "not both" --api-key k3y-0f-this-test --api-key-file "$T/key"
printf 'two words\n' >"$T/badkey"
check "a key with a space is refused, naming the file" refused "$T/badkey: the API key has a byte 0x20" \
	--api-key-file "$T/badkey"

# A model slow enough for requests to overlap (2 Mixtral-mini layers, 22 MB experts, random
# weights: prompts are token ids): a client leaving mid-stream or while queued, a full queue,
# SIGTERM with requests in flight.
"$MOEPAGER" gen --preset mixtral-mini --layers 2 --quiet --out "$T/slow.mpk" || exit 1
MODEL=$T/slow.mpk
LONG='"prompt": [1], "max_tokens": 4000, "temperature": 0, "ignore_eos": true'
start --max-batch 1 --max-queue 1 --grace-ms 300 || exit 1

"$PY" - "$PORT" "{$LONG, \"stream\": true}" <<'EOF'
import socket, sys
body = sys.argv[2].encode()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
got = b""
while b"data: " not in got:
    got += s.recv(4096)
s.close()		# after the first event
EOF
curl -s --max-time 0.5 "$URL/v1/completions" -d "{$LONG}" >/dev/null	# queued, then gone
for _ in $(seq 100); do
	curl -s "$URL/metrics" >"$T/metrics"
	grep -q 'finish="cancelled"} 2' "$T/metrics" && break
	sleep 0.1
done
check "clients leaving mid-stream and while queued cancel their requests" \
	grep -q 'finish="cancelled"} 2' "$T/metrics"
check "and nothing runs afterwards" grep -q '^moepager_running_requests{model="slow"} 0' "$T/metrics"
check "no KV cache is held afterwards" grep -q '^moepager_kv_cache_bytes{model="slow"} 0' "$T/metrics"

curl -sN "$URL/v1/completions" -o "$T/inflight.sse" -d "{$LONG, \"stream\": true}" &
pids=($!)
# It runs once its first event came (a sanitizer build on a busy machine takes seconds).
for _ in $(seq 600); do [[ -s $T/inflight.sse ]] && break; sleep 0.1; done
for i in 1 2 3 4; do
	curl -s -D "$T/h.$i" -o "$T/b.$i" "$URL/v1/completions" -d "{$LONG}" &
	pids+=($!)
done
sleep 0.5
busy=0
for i in 1 2 3 4; do
	for _ in $(seq 100); do [[ -s $T/h.$i ]] && break; sleep 0.05; done
	if grep -q '^HTTP/1.1 503' "$T/h.$i"; then
		grep -qi '^Retry-After: 1' "$T/h.$i" && busy=$((busy + 1))
	fi
done
check "a full queue answers 503 with Retry-After ($busy of 4)" test $busy -ge 2
kill -TERM "$SERVER"
wait "$SERVER"
st=$?
forget "$SERVER"
SERVER=
wait "${pids[@]}"
check "SIGTERM with requests in flight exits 0 (status $st)" test $st = 0
check "the stream in flight ended with an error event, then [DONE]" \
	grep -q '"error"' "$T/inflight.sse"
if grep -q 'data: \[DONE\]' "$T/inflight.sse"; then
	ok "the stream's last event is [DONE]"
else
	bad "the stream's last event is [DONE]; its last bytes:"
	tail -c 400 "$T/inflight.sse"
	echo
fi
check "the server said how many requests it cut short" grep -q 'cut short' "$T/server.err"
check "the port is closed afterwards" \
	test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$URL/health")" = 000

if ((fails)); then
	echo "$fails check(s) failed"
	exit 1
fi
echo "all serve checks passed"
