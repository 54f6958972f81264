#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager run --prompt TEXT` on the trained model: the text starts with the prompt,
# continues it, and paging (a budget of 30 % of the experts) changes no token.
set -u
moepager=$1
model=$2
. "$(dirname "$0")/cli_lib.sh"
text() {
	python3 -c 'import json, sys; d = json.load(sys.stdin); print(len(d["tokens"])); print(d["text"])'
}
resident=$("$moepager" run --model "$model" --prompt "Q: What is a" --tokens 24 --json | text) || exit 1
paged=$("$moepager" run --model "$model" --prompt "Q: What is a" --tokens 24 --budget 30% --json |
	text) || exit 1
printf '%s\n' "$resident"
[[ $(head -n1 <<<"$resident") -ge 24 ]] || bad "fewer than 24 tokens"
[[ $(sed -n 2p <<<"$resident") == "Q: What is a"?* ]] ||
	bad "the text does not continue the prompt"
[[ $resident == "$paged" ]] || bad "paged text differs: $paged"
exit $((fails > 0))
