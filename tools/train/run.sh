#!/bin/sh
# SPDX-License-Identifier: MIT
# The whole recipe, end to end: corpus and tokenizer, training, export through the C writer,
# perplexity check against the C runner, routing balance, traces, test fixtures, recall figures.
#
#   tools/train/run.sh [WORK_DIR] [MODEL]   (default /work/data/train tiny-real; needs build-train/)
#
# MODEL is a preset: tiny-real (6 layers x 16 experts, top-2, expert ffn 256),
# tiny-fine (26 x 64, top-6, ffn 64: DeepSeek-V2-Lite-like routing) or
# tiny-olmoe (16 x 64, top-8, ffn 32: OLMoE-like routing). Environment variables
# override a preset: LAYERS EXPERTS TOPK FFN STEPS DECAY_START WARMUP DISPATCH.
# Every model shares tiny-real's tokenizer and corpus split: the corpus step trains the
# tokenizer once (or reuses WORK_DIR/corpus/tok.model) and checks that its vocabulary is
# data/models/tiny-real.tok byte for byte.
#
# Debian packages: python3-torch python3-sentencepiece python3-numpy fortunes fortunes-min
# libopenblas0-pthread (without it torch falls back to the reference BLAS, ~30x slower).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/work/data/train}
name=${2:-tiny-real}
py=/usr/bin/python3		# Debian's interpreter: it has torch and sentencepiece

case $name in
tiny-real)	# the committed tiny-real run (steps 650, decay from 525)
	p_layers=6 p_experts=16 p_topk=2 p_ffn=256 p_steps=650 p_decay=525 p_dispatch=loop
	run=$work/run ;;
tiny-fine)	# the committed tiny-fine model: constant LR to step 150, no decay (README.md)
	p_layers=26 p_experts=64 p_topk=6 p_ffn=64 p_steps=150 p_decay=150 p_dispatch=blocks
	run=$work/$name/run ;;
tiny-olmoe)	# not trained yet: a starting point
	p_layers=16 p_experts=64 p_topk=8 p_ffn=32 p_steps=650 p_decay=525 p_dispatch=blocks
	run=$work/$name/run ;;
*)	echo "run.sh: unknown model $name (tiny-real, tiny-fine, tiny-olmoe)" >&2; exit 2 ;;
esac
layers=${LAYERS:-$p_layers}
experts=${EXPERTS:-$p_experts}
topk=${TOPK:-$p_topk}
ffn=${FFN:-$p_ffn}
steps=${STEPS:-$p_steps}
decay_start=${DECAY_START:-$p_decay}
warmup=${WARMUP:-50}
dispatch=${DISPATCH:-$p_dispatch}
model=$work/$name.mpk
out=$work/$name-	# JSON results
[ "$name" = tiny-real ] && out=$work/

reuse=		# read whole before corpus.py writes the same bytes back
[ -f "$work/corpus/tok.model" ] && reuse="--tokenizer $work/corpus/tok.model"
$py "$here/corpus.py" --out "$work/corpus" $reuse --expect-vocab "$root/data/models/tiny-real.tok"
# Many small experts (blocks dispatch): OpenBLAS single-threaded under torch's two
# threads (its own threads otherwise spin against torch's: a third of the step was
# kernel time). tiny-real ran without it.
tenv=
[ "$dispatch" != loop ] && tenv="OPENBLAS_NUM_THREADS=1"
env $tenv nice -n 19 $py "$here/train.py" --corpus "$work/corpus" --out "$run" --seed 1234 \
	--steps "$steps" --decay-start "$decay_start" --warmup "$warmup" --batch 16 --seq 256 \
	--lr 3e-3 --eval-every 100 --layers "$layers" --experts "$experts" --topk "$topk" \
	--ffn "$ffn" --dispatch "$dispatch"
shared=
[ "$name" != tiny-real ] && shared="--shared-tokenizer $root/data/models/tiny-real.tok"
$py "$here/export.py" --ckpt "$run/final.pt" --corpus "$work/corpus" --run "$run" \
	--out "$model" --dtype bf16 --name "$name" $shared
$py "$here/evaluate.py" --ckpt "$run/final.pt" --corpus "$work/corpus" \
	--model "$model" --dispatch "$dispatch" | tee "${out}eval.json"
$py "$here/balance.py" --ckpt "$run/final.pt" --corpus "$work/corpus" \
	--model "$model" | tee "${out}balance.json"
$py "$here/traces.py" --ckpt "$run/final.pt" --corpus "$work/corpus" \
	--model "$model" --out "$root/data/traces/$name" --dispatch "$dispatch"
$py "$here/routecheck.py" --model "$model" "$root/data/traces/$name/heldout-fortunes.csv" \
	"$root/data/traces/$name/heldout-windows.csv" | tee "${out}routecheck.json"
if [ "$name" != tiny-real ]; then	# 64 probability columns: ~650 bytes a row
	xz -f -T1 -6 "$root/data/traces/$name/heldout-fortunes.csv" "$root/data/traces/$name/heldout-windows.csv"
fi
if [ "$name" = tiny-real ]; then	# tests/test_tiny_real.c's fixtures
	$py "$here/fixtures.py" --ckpt "$run/final.pt" --corpus "$work/corpus" \
		--model "$model" --out "$root/tests/data/$name"
fi
$py "$here/recall.py" --ckpt "$run/final.pt" --corpus "$work/corpus" \
	--model "$model" --dispatch "$dispatch" | tee "${out}recall.json"
# The repository carries the model xz-compressed (data/models/meson.build unpacks it).
xz -T1 -6 -c "$model" > "$root/data/models/$name.mpk.xz"
cp "$work/$name.json" "$root/data/models/"
[ "$name" = tiny-real ] && cp "$work/$name.tok" "$root/data/models/"
exit 0
