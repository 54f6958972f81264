#!/bin/sh
# SPDX-License-Identifier: MIT
# The whole recipe, end to end: corpus and tokenizer, training, export through the C writer,
# perplexity check against the C runner, traces, test fixtures, recall figures.
#
#   tools/train/run.sh [WORK_DIR]        (default /work/data/train; needs build-train/ built)
#
# Debian packages: python3-torch python3-sentencepiece python3-numpy fortunes fortunes-min
# libopenblas0-pthread (without it torch falls back to the reference BLAS, ~30x slower).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/work/data/train}
py=/usr/bin/python3		# Debian's interpreter: it has torch and sentencepiece
steps=${STEPS:-650}
decay_start=${DECAY_START:-525}
name=tiny-real

$py "$here/corpus.py" --out "$work/corpus"
nice -n 19 $py "$here/train.py" --corpus "$work/corpus" --out "$work/run" --seed 1234 \
	--steps "$steps" --decay-start "$decay_start" --warmup 50 --batch 16 --seq 256 --lr 3e-3 \
	--eval-every 100
$py "$here/export.py" --ckpt "$work/run/final.pt" --corpus "$work/corpus" --run "$work/run" \
	--out "$work/$name.mpk" --dtype bf16 --name "$name"
$py "$here/evaluate.py" --ckpt "$work/run/final.pt" --corpus "$work/corpus" \
	--model "$work/$name.mpk" | tee "$work/eval.json"
$py "$here/traces.py" --ckpt "$work/run/final.pt" --corpus "$work/corpus" \
	--model "$work/$name.mpk" --out "$root/data/traces/$name"
$py "$here/fixtures.py" --ckpt "$work/run/final.pt" --corpus "$work/corpus" \
	--model "$work/$name.mpk" --out "$root/tests/data/$name"
$py "$here/recall.py" --ckpt "$work/run/final.pt" --corpus "$work/corpus" \
	--model "$work/$name.mpk" | tee "$work/recall.json"
# The repository carries the model xz-compressed (data/models/meson.build unpacks it).
xz -T1 -6 -c "$work/$name.mpk" > "$root/data/models/$name.mpk.xz"
cp "$work/$name.tok" "$work/$name.json" "$root/data/models/"
