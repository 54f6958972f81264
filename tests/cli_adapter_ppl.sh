#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The committed ESFT adapters of tiny-real (data/adapters, tools/train/domains.sh) really
# help: each one, merged into the base (`moepager adapter merge`), lowers the C runner's
# perplexity on a held-out slice of its own domain (tests/data/domains), and gives the
# perplexity the training side recorded for it (slices.json).
set -u
moepager=$1
base=$2
adapters=$3
slices=$4
. "$(dirname "$0")/cli_lib.sh"
tok=${base%.mpk}.tok
ppl() {
	"$moepager" eval --model "$1" --text "$2" --tokenizer "$tok" --json |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["perplexity"])'
}
field() {
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["slices"][sys.argv[2]][sys.argv[3]])' \
		"$slices/slices.json" "$1" "$2"
}
near() {	# $1 within 1 % of $2
	python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a / b - 1) >= 0.01)' "$1" "$2"
}
domains=$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["slices"]))' \
	"$slices/slices.json") || exit 1
[[ -n $domains ]] || { echo "FAILED: slices.json names no domain"; exit 1; }
for d in $domains; do
	text=$slices/$(field "$d" file)
	"$moepager" adapter info "$adapters/$d.mpa" --base "$base" --verify >/dev/null ||
		{ bad "$d.mpa is not a sound adapter of $base"; continue; }
	"$moepager" adapter merge "$base" "$adapters/$d.mpa" --out "$T/$d.mpk" >/dev/null ||
		{ bad "merging $d.mpa"; continue; }
	b=$(ppl "$base" "$text") && m=$(ppl "$T/$d.mpk" "$text") ||
		{ bad "moepager eval on $text"; continue; }
	echo "$d: base $b, with its adapter $m"
	python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < 0.9 * float(sys.argv[2]))' "$m" "$b" ||
		bad "$d's adapter does not lower its perplexity by 10 %"
	near "$b" "$(field "$d" base_ppl)" && near "$m" "$(field "$d" merged_ppl)" ||
		bad "$d: not the recorded perplexities"
	rm -f "$T/$d.mpk"
done
# A missing input is named, once, not the output the command never got to write.
if err=$("$moepager" adapter merge "$base" "$T/missing.mpa" --out "$T/m.mpk" 2>&1 >/dev/null); then
	bad "merge with a missing adapter succeeded"
fi
[[ $err == "moepager adapter: $T/missing.mpa: "*"No such file"* && $err != *$'\n'* &&
   $err != *"$T/m.mpk"* ]] ||
	bad "the missing adapter is not named: $err"
if err=$("$moepager" adapter pack "$base" "$T/missing.mpk" --out "$T/p.mpa" 2>&1 >/dev/null); then
	bad "pack with a missing fine-tune succeeded"
fi
[[ $err == "moepager adapter: $T/missing.mpk: "*"No such file"* && $err != *$'\n'* &&
   $err != *"$T/p.mpa"* ]] ||
	bad "the missing fine-tune is not named: $err"
exit $((fails > 0))
