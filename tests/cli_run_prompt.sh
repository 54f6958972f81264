#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager run --prompt TEXT` on the trained model: the text starts with the prompt,
# continues it, and paging (a budget of 30 % of the experts) changes no token.
set -u
moepager=$1
model=$2
text() {
	python3 -c 'import json, sys; d = json.load(sys.stdin); print(len(d["tokens"])); print(d["text"])'
}
resident=$("$moepager" run --model "$model" --prompt "Q: What is a" --tokens 24 --json | text) || exit 1
paged=$("$moepager" run --model "$model" --prompt "Q: What is a" --tokens 24 --budget 30% --json |
	text) || exit 1
printf '%s\n' "$resident"
fail=0
[[ $(head -n1 <<<"$resident") -ge 24 ]] || { echo "FAILED: fewer than 24 tokens"; fail=1; }
[[ $(sed -n 2p <<<"$resident") == "Q: What is a"?* ]] ||
	{ echo "FAILED: the text does not continue the prompt"; fail=1; }
[[ $resident == "$paged" ]] || { echo "FAILED: paged text differs: $paged"; fail=1; }
exit $fail
