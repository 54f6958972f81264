#!/bin/sh
# SPDX-License-Identifier: MIT
# Domain fine-tunes of tiny-real, end to end: corpora from Debian packages, one ESFT
# adapter per domain (issue 16), full fine-tuned variants on three domains (issue 17),
# perplexity of every model through the C runner, the variants' L2 report, the
# adapters packed as .mpa, and the CI slices.
#
#   tools/train/domains.sh [WORK_DIR]            (default /work/data/domains)
#
# BUILD (default build/) must hold tiny-real.mpk and moepager; STAGES picks steps
# (default: corpus esft variants eval l2 pack ci); a model already made is kept.
# Training runs at nice 10, its PID written to PIDFILE when set (the shared machine's
# timing runs pause it). Debian packages: python3-torch python3-numpy bible-kjv
# bible-kjv-text manpages-dev linux-libc-dev libpython3.11-stdlib perl-modules-5.36
# bash-completion jargon-text debian-policy gnu-standards (and coreutils, findutils,
# grep, sed, diffutils, gzip for their Info manuals).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/work/data/domains}
build=${BUILD:-$root/build}
py=/usr/bin/python3
base=$build/data/models/tiny-real.mpk
lib=$build/libmoepager.so
domains="bible man cheaders python perl shell jargon policy gnustd info"
variants="python bible policy"
stages=${STAGES:-corpus esft variants eval l2 pack ci}

train() {
	nice -n 10 "$@" &
	pid=$!
	[ -z "${PIDFILE:-}" ] || echo $pid > "$PIDFILE"
	wait $pid
}

has() { case " $stages " in *" $1 "*) return 0;; esac; return 1; }

if has corpus; then
	$py "$here/domains.py" --out "$work/corpus" --lib "$lib"
	# Fortunes held-out text (the forgetting check): tiny-real's own corpus step.
	[ -e "$work/fortunes/heldout.ids" ] || $py "$here/corpus.py" --out "$work/fortunes"
fi
if has esft; then
	for d in $domains; do
		[ -e "$work/adapters/tiny-real-esft-$d.json" ] && continue
		train $py "$here/esft.py" --base "$base" --domain "$work/corpus/$d" \
			--out "$work/adapters" --lib "$lib" --score token --p 0.2 \
			--steps 40 --lr 2e-3 --score-windows 64 --eval-windows 16
	done
fi
if has variants; then
	for d in $variants; do
		[ -e "$work/variants/tiny-real-$d.json" ] && continue
		train $py "$here/finetune.py" --base "$base" --domain "$work/corpus/$d" \
			--out "$work/variants" --lib "$lib" --steps 40 --lr 1.5e-4 --eval-windows 16
	done
fi
if has eval; then
	$py "$here/domaineval.py" --work "$work" --base "$base" --moepager "$build/tools/moepager" \
		--lib "$lib" --out "$here/results/domains-eval.json" | tee "$work/eval.md"
fi
if has l2; then
	set --
	for d in $variants; do set -- "$@" "$work/variants/tiny-real-$d.mpk"; done
	$py "$here/variants.py" "$base" "$@" --lib "$lib" --out "$here/results/variants-l2.json" \
		| tee "$work/variants-l2.md"
fi
if has pack; then
	if "$build/tools/moepager" adapter pack --help > /dev/null 2>&1; then
		for d in $domains; do
			"$build/tools/moepager" adapter pack "$base" \
				"$work/adapters/tiny-real-esft-$d.mpk" \
				--out "$work/adapters/$d.mpa"
		done
	else
		echo "domains.sh: this moepager has no 'adapter pack': the .mpa files are not made" >&2
	fi
fi
if has ci; then
	# Held-out slices of the two adapters with the fewest experts, and their figures.
	$py "$here/domaineval.py" --work "$work" --base "$base" --moepager "$build/tools/moepager" \
		--lib "$lib" --out "$here/results/domains-eval.json" --slices 2 \
		--slice-dir "$root/tests/data/domains"
	for d in $($py -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["slices"]))' \
			"$root/tests/data/domains/slices.json"); do
		xz -T1 -6 -c "$work/adapters/$d.mpa" > "$root/data/adapters/$d.mpa.xz"
		cp "$work/adapters/tiny-real-esft-$d.json" "$root/data/adapters/$d.json"
	done
fi
