#!/bin/bash
# SPDX-License-Identifier: MIT
# Each failure of a moepager command says one line naming what failed and where (the
# library's message when the library failed, prefixed by the command), with exit status 1,
# or 64 for a usage error (then argp's "Try `moepager CMD --help'" hint follows it).
# Usage: cli_errors.sh MOEPAGER TINY_REAL_MPK
set -u
MOEPAGER=$1
MODEL=$2
. "$(dirname "$0")/cli_lib.sh"

# A model cut short (its header promises more), a file that is no model, and none at all.
head -c 100000 "$MODEL" >"$T/cut.mpk"
echo hello >"$T/junk.mpk"
NONE=$T/none.mpk
echo "the quick brown fox" >"$T/text.txt"

# one_error STATUS MESSAGE COMMAND...: COMMAND exits STATUS and its stderr holds exactly
# one error line (argp's "Try ..." hint aside), starting "moepager CMD: " and holding MESSAGE.
one_error() {
	local want=$1 msg=$2 st lines
	shift 2
	"$MOEPAGER" "$@" >/dev/null 2>"$T/err"
	st=$?
	grep -v "^Try \`moepager" "$T/err" >"$T/lines"
	lines=$(wc -l <"$T/lines")
	if [[ $st != "$want" || $lines != 1 ]] || ! grep -q -- "^moepager $1: .*$msg" "$T/lines"; then
		echo "moepager $*: exit $st (want $want), $lines error lines (want 1, '$msg'):"
		cat "$T/err"
		return 1
	fi
}

# A truncated model: the library's message, once, naming the file and both sizes.
CUT="$T/cut.mpk: truncated: file is 100000 bytes, header says"
check "inspect: truncated model" one_error 1 "$CUT" inspect "$T/cut.mpk"
check "verify: truncated model" one_error 1 "$CUT" verify "$T/cut.mpk"
check "run: truncated model" one_error 1 "$CUT" run --model "$T/cut.mpk" --tokens 2
check "export: truncated model" one_error 1 "$CUT" export "$T/cut.mpk" --gguf "$T/x.gguf"
check "eval: truncated model" one_error 1 "$CUT" eval --model "$T/cut.mpk" --text "$T/text.txt"
check "generate: truncated model" one_error 1 "$CUT" generate --model "$T/cut.mpk" --prompt hi
check "serve: truncated model" one_error 1 "$CUT" serve --model "$T/cut.mpk" --listen 127.0.0.1:0
check "faultbench: truncated model" one_error 1 "$CUT" faultbench --model "$T/cut.mpk"
check "pagerd: truncated model" one_error 1 "$CUT" pagerd --model "$T/cut.mpk" --socket "$T/s"
check "bench: truncated model" one_error 1 "$CUT" bench --model "$T/cut.mpk" --trace "$T/text.txt"
check "inspect: not a model" one_error 1 "junk.mpk: truncated: file is 6 bytes" inspect "$T/junk.mpk"

# A missing file: named with the system's reason, once.
check "inspect: missing file" one_error 1 "$NONE: cannot open: No such file" inspect "$NONE"
check "run: missing model" one_error 1 "$NONE: cannot open: No such file" run --model "$NONE"
check "verify: missing file" one_error 1 "$NONE: cannot open: No such file" verify "$NONE"

# A value checked against the input once it is read: the tool's line alone, not a second
# "Invalid argument" after it.
check "run --request past the trace's end" one_error 1 "has 64 requests; --request 999 is not one" \
	run --model "$MODEL" --trace "$(dirname "$0")/../data/traces/tiny-real/heldout-fortunes.csv" \
	--request 999 --tokens 2

# No tokenizer beside the model (looked for as MODEL.tok): one line naming it and the option.
ln -s "$(realpath "$MODEL")" "$T/notok.mpk"
check "generate: no tokenizer beside the model" one_error 1 \
	"$T/notok.tok: no tokenizer beside the model; give --tokenizer FILE" \
	generate --model "$T/notok.mpk" --prompt hi

# Bad arguments: one line naming the option and what it wants, exit 64.
check "run --threads x" one_error 64 "--threads: 'x' is not a number in \[1, 1024\]" \
	run --model "$MODEL" --threads x
check "gen --layers -3 names the option" one_error 64 "--layers: '-3' is not a number" \
	gen --layers -3 --out "$T/g.mpk"
check "gen --dtype f7" one_error 64 "unknown weight type 'f7'" gen --dtype f7 --out "$T/g.mpk"
check "inspect with no FILE" one_error 64 "FILE is missing" inspect
check "inspect with two FILEs" one_error 64 "one FILE only: 'b' is a second" inspect a b
check "run --bogus" one_error 64 "unrecognized option '--bogus'" run --bogus
check "gen with an argument" one_error 64 "unexpected argument 'x'" gen x --out "$T/g.mpk"
check "trace --pid 0" one_error 64 "--pid: '0' is not a number" trace --pid 0
check "adapter with an unknown action" one_error 64 "unknown action 'inspect'" adapter inspect x
check "adapter info: not an adapter" one_error 1 "junk.mpk" adapter info "$T/junk.mpk"

# Parsers that returned EINVAL to argp (exit 1, no hint) and checks across options made
# after parsing: usage errors too.
check "faultbench --experts 0" one_error 64 "--experts: '0' is not a number" \
	faultbench --model "$MODEL" --experts 0
check "faultbench --io-bytes 5000" one_error 64 "--io-bytes: '5000' is not a multiple of 4K" \
	faultbench --model "$MODEL" --io-bytes 5000
check "faultbench with an argument" one_error 64 "unexpected argument 'x'" \
	faultbench --model "$MODEL" x
check "faultbench without --model" one_error 64 "--model FILE is required" faultbench
check "bench-elastic without --model" one_error 64 "--model FILE is required" bench-elastic
check "bench-elastic --threads-to without --load" one_error 64 "--threads-to 2 needs --load" \
	bench-elastic --model "$MODEL" --threads-to 2
check "bench-preload --tokens 1" one_error 64 "--tokens: '1' is not a number" \
	bench-preload --tokens 1
check "consolidate --cross-samples x" one_error 64 "--cross-samples: 'x' is not a number" \
	consolidate --cross-samples x "$MODEL" "$MODEL"
check "adapter gen --per-layer 0" one_error 64 "--per-layer: '0' is not a number" \
	adapter gen --per-layer 0 "$MODEL"
check "run --record-alternate without --repeat 2" one_error 64 \
	"--record-alternate needs --repeat 2" run --model "$MODEL" --record-alternate
check "serve --api-key and --api-key-file" one_error 64 "--api-key or --api-key-file, not both" \
	serve --model "$MODEL" --api-key abcdefghij --api-key-file "$T/text.txt"
check "serve: a short API key" one_error 1 "--api-key: the API key has 2 characters" \
	serve --model "$MODEL" --api-key ab --listen 127.0.0.1:0

# usage_error MESSAGE COMMAND...: one_error 64, with argp's hint after the line.
usage_error() {
	one_error 64 "$@" && grep -q "^Try \`moepager $2 --help'" "$T/err"
}

# Values that failed with exit 1 and no hint, or said two lines (the parser's and argp's):
# one line, the hint, exit 64 (session 33).
check "faultbench --shared-pages huge" usage_error "--shared-pages huge: small, thp or hugetlb" \
	faultbench --model "$MODEL" --shared-pages huge
check "batchbench --batch 0" usage_error "--batch: '0' is not a number in \[1, 256\]" \
	batchbench --model "$MODEL" --batch 0
check "batchbench --batch with 17 sizes" usage_error "--batch $(seq -s, 17): more than 16 values" \
	batchbench --model "$MODEL" --batch "$(seq -s, 17)"
check "bench-serve --concurrency 1,x" usage_error "--concurrency: 'x' is not a number in \[1, 64" \
	bench-serve --model "$MODEL" --concurrency 1,x
check "serve --max-body 1Q" usage_error "--max-body: '1Q' is not a size" \
	serve --model "$MODEL" --max-body 1Q
check "serve --max-body 512" usage_error "--max-body must be in \[1K, 1G\]" \
	serve --model "$MODEL" --max-body 512
check "run --membw-bytes x" usage_error "--membw-bytes: 'x' is not a size" \
	run --model "$MODEL" --membw-bytes x
check "export --alignment 16" usage_error "--alignment: '16' is not a number in \[32, " \
	export "$MODEL" --alignment 16
check "export --alignment 48" usage_error "--alignment: '48' is not a power of two" \
	export "$MODEL" --alignment 48
check "bench-multi --io-rate x" usage_error "--io-rate: 'x' is not a size" \
	bench-multi --model "$MODEL" --io-rate x
check "bench --gates-memory x" usage_error "--gates-memory: 'x' is not a size" \
	bench --simulate --trace "$T/text.txt" --gates-memory x

# The dispatcher: no command or an unknown one is a usage error too.
"$MOEPAGER" >/dev/null 2>&1
check "no command: exit 64" test $? = 64
"$MOEPAGER" nosuch >/dev/null 2>&1
check "an unknown command: exit 64" test $? = 64

exit $((fails > 0))
