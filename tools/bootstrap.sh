#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sets up a fresh Debian 12 machine (as root), builds moepager, then runs the demo or the tests.
#
#   tools/bootstrap.sh demo    install, build, compare prefetching against the baselines
#   tools/bootstrap.sh test    install, build, run every test suite, an ASan+UBSan build,
#                              and the pkg-config example against a staged install
#   tools/bootstrap.sh example install, build, and build the pkg-config example against a
#                              staged install (one step of test)
#   tools/bootstrap.sh build   install missing packages, configure and build
#   tools/bootstrap.sh deps    install missing packages only
#
# Environment: MOEPAGER_BUILD_DIR (default: build), MOEPAGER_ASAN_BUILD_DIR (default:
# build-asan), both relative to the source tree unless absolute; MOEPAGER_LLAMA_DIR
# (default: .cache/llama, where npm installs llama.cpp for tests/llama); CI=true and
# MOEPAGER_REQUIRE_BPF=1 (set by .ci/run) make tests fail instead of skipping when they
# lack userfaultfd, io_uring or BPF.
set -euo pipefail

# Every Debian package the build, the tests and the demo need: append here.
PACKAGES=(
	build-essential pkg-config meson ninja-build clang llvm
	liburing-dev libnuma-dev libbpf-dev bpftool libcmocka-dev libxxhash-dev
	libjansson-dev systemtap-sdt-dev libelf-dev zlib1g-dev
	python3-numpy gnuplot-nox bpftrace libopenblas-dev libclang-rt-14-dev xz-utils
	libmicrohttpd-dev libcurl4-openssl-dev curl python3-prometheus-client git
)

# llama.cpp, to check that exported GGUF files decode as the runner does (tests/llama/):
# the prebuilt CPU libraries of the npm package node-llama-cpp, and the headers of the
# same llama.cpp from the git bundle that package ships. npm, not Debian: no Debian
# package carries a llama.cpp that loads these models. Pinned: the headers must match
# the libraries (structs are passed by value).
LLAMA_NPM_VERSION=3.22.1
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6	# llama.cpp v0.5.0 inside that package

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

abs_dir() {
	case $1 in
	/*) printf '%s\n' "$1" ;;
	*) printf '%s\n' "$SRC/$1" ;;
	esac
}

BUILD=$(abs_dir "${MOEPAGER_BUILD_DIR:-build}")
ASAN_BUILD=$(abs_dir "${MOEPAGER_ASAN_BUILD_DIR:-build-asan}")
TSAN_BUILD=$(abs_dir "${MOEPAGER_TSAN_BUILD_DIR:-build-tsan}")
FUZZ_BUILD=$(abs_dir "${MOEPAGER_FUZZ_BUILD_DIR:-build-fuzz}")
LLAMA_DIR=$(abs_dir "${MOEPAGER_LLAMA_DIR:-.cache/llama}")
MOEPAGER=$BUILD/tools/moepager

say() { printf '\n==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() { printf 'bootstrap: %s\n' "$*" >&2; exit 1; }
# Echoes a command, then runs it.
run() {
	printf '$ %s\n' "$*"
	"$@"
}

usage() {
	sed -n '3,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

#
# Packages
#

missing_packages() {
	local p status

	for p in "${PACKAGES[@]}"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		[[ $status == installed ]] || printf '%s\n' "$p"
	done
}

install_deps() {
	local missing

	command -v dpkg-query >/dev/null || die "dpkg-query not found: this script needs Debian 12"
	if [[ -r /etc/os-release ]] && ! grep -q '^VERSION_ID="12"' /etc/os-release; then
		note "warning: not Debian 12; package names may differ"
	fi
	mapfile -t missing < <(missing_packages)
	if ((${#missing[@]} == 0)); then
		say "all ${#PACKAGES[@]} Debian packages are installed"
		return 0
	fi
	say "installing ${#missing[@]} missing Debian packages: ${missing[*]}"
	((EUID == 0)) || die "run as root to install: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	run apt-get -q update
	run apt-get -q install -y --no-install-recommends "${missing[@]}"
	mapfile -t missing < <(missing_packages)
	((${#missing[@]} == 0)) || die "still missing after apt-get install: ${missing[*]}"
}

# npm install of the pinned node-llama-cpp into LLAMA_DIR: --omit=optional skips the CUDA,
# Vulkan and other-OS builds (the CPU one is named), --ignore-scripts and
# NODE_LLAMA_CPP_SKIP_DOWNLOAD keep its postinstall from fetching or building llama.cpp.
# Without npm or network the llama tests cannot run (they fail in CI, skip elsewhere).
install_llama() {
	local bins=$LLAMA_DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
	local bundle=$LLAMA_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle

	if [[ -f $LLAMA_DIR/src/include/llama.h && -f $bins/libllama.v0.5.0.so ]]; then
		say "llama.cpp (node-llama-cpp $LLAMA_NPM_VERSION) is in $LLAMA_DIR"
		return 0
	fi
	say "installing llama.cpp (npm node-llama-cpp $LLAMA_NPM_VERSION) into $LLAMA_DIR"
	if ! command -v npm >/dev/null; then
		note "warning: npm not found: the llama.cpp tests cannot run (install Node.js and npm)"
		return 0
	fi
	mkdir -p "$LLAMA_DIR"
	[[ -f $LLAMA_DIR/package.json ]] ||
		printf '{"name": "moepager-llama", "private": true}\n' >"$LLAMA_DIR/package.json"
	if ! (cd "$LLAMA_DIR" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true run nice -n 10 npm install \
		--save-exact --omit=optional --ignore-scripts --no-audit --no-fund \
		"node-llama-cpp@$LLAMA_NPM_VERSION" "@node-llama-cpp/linux-x64@$LLAMA_NPM_VERSION"); then
		note "warning: npm install failed: the llama.cpp tests cannot run"
		return 0
	fi
	rm -rf "$LLAMA_DIR/src"
	run git clone -q --no-checkout "$bundle" "$LLAMA_DIR/src"
	run git -C "$LLAMA_DIR/src" checkout -q "$LLAMA_COMMIT" -- include ggml/include
}

#
# Build
#

# meson setup, or reconfigure when the directory already holds a build.
configure() {
	local dir=$1

	shift
	if [[ -f $dir/meson-private/coredata.dat ]]; then
		run meson setup --reconfigure "$dir" "$SRC" "$@"
	else
		run meson setup "$dir" "$SRC" "$@"
	fi
}

build() {
	say "configuring and building in $BUILD"
	configure "$BUILD" --werror -Dllama_dir="$LLAMA_DIR"
	run meson compile -C "$BUILD"
}

#
# Steps (each runs in a subshell with errexit on; a failing step is recorded, the rest run)
#

FAILED=()

step() {
	local name=$1 rc

	shift
	say "$name"
	set +e
	(set -e; "$@")
	rc=$?
	set -e
	if ((rc)); then
		FAILED+=("$name (exit $rc)")
		note "FAILED: $name"
	else
		note "ok: $name"
	fi
}

unit_tests() {
	run meson test -C "$BUILD" --print-errorlogs
}

# The slow suite holds long soak runs; ASan makes them 2-3x slower and they add no
# coverage the other suites lack, so they stay out of the sanitizer run.
asan_tests() {
	configure "$ASAN_BUILD" --werror -Dsanitize=true
	run meson compile -C "$ASAN_BUILD"
	run meson test -C "$ASAN_BUILD" --print-errorlogs --no-suite slow --timeout-multiplier 3
}

# The concurrency stress test under ThreadSanitizer: zero reports is the bar.
tsan_stress() {
	configure "$TSAN_BUILD" --werror -Dtsan=true
	run meson compile -C "$TSAN_BUILD" tests/stress
	run meson test -C "$TSAN_BUILD" --no-rebuild --print-errorlogs stress
}

# A few seconds of libFuzzer per target (clang): the .mpk reader and the trace reader.
fuzz_smoke() {
	CC=clang configure "$FUZZ_BUILD" -Dfuzz=true -Db_lundef=false -Dtests=false
	run meson compile -C "$FUZZ_BUILD"
	run meson test -C "$FUZZ_BUILD" --no-rebuild --print-errorlogs --suite fuzz
}

# Prints the value of a JSON path of moepager's --json output read on stdin.
json_get() {
	python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v[int(k) if isinstance(v, list) else k]
print(v)' "$@"
}

# Builds tests/example/example.c exactly as an engine would: from an installed tree,
# through pkg-config, then runs it on a model written by the installed CLI.
pkgconfig_example() {
	local stage=$BUILD/stage pcfile pcdir libdir incdir bindir h out model layers experts
	local -a cflags libs headers

	rm -rf "$stage"
	run meson install -C "$BUILD" --no-rebuild --quiet --destdir "$stage"
	pcfile=$(find "$stage" -name moepager.pc -print -quit)
	[[ -n $pcfile ]] || die "meson install did not install moepager.pc"
	pcdir=$(dirname "$pcfile")
	libdir=$(dirname "$pcdir")
	[[ -e $libdir/libmoepager.so ]] || die "libmoepager.so is not next to moepager.pc ($libdir)"
	export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$stage
	incdir=$(pkg-config --variable=includedir moepager)
	[[ $incdir == "$stage"* ]] || incdir=$stage$incdir
	headers=(moepager.h moepager/mp_version.h)
	# Each layer's public headers live in its folder's include/moepager/.
	for h in "$SRC"/lib/*/include/moepager/*.h "$SRC"/engine/include/moepager/*.h; do
		headers+=("moepager/${h##*/}")
	done
	for h in "${headers[@]}"; do
		[[ -f $incdir/$h ]] || die "public header $h was not installed (its layer's meson.build)"
	done
	note "installed: $(cd "$stage" && find . -type f -o -type l | sort | tr '\n' ' ')"

	read -ra cflags <<<"$(pkg-config --cflags moepager)"
	read -ra libs <<<"$(pkg-config --libs moepager)"
	# Each public header must compile on its own, with only the installed tree.
	for h in "${headers[@]}"; do
		printf '#include <%s>\n' "$h" |
			cc -std=c17 -Wall -Wextra -Werror -fsyntax-only -x c - "${cflags[@]}" ||
			die "installed header $h does not compile on its own"
	done
	note "each installed header compiles on its own"
	run cc -std=c17 -Wall -Wextra -Werror -o "$stage/example" "$SRC/tests/example/example.c" \
		"${cflags[@]}" "${libs[@]}"
	export LD_LIBRARY_PATH=$libdir
	# The example must load the staged library, not one from the build tree or the system.
	out=$(ldd "$stage/example")
	grep -q "libmoepager\.so.* => $libdir/" <<<"$out" ||
		die "example does not resolve libmoepager.so into $libdir: $out"

	bindir=$(find "$stage" -path '*/bin/moepager' -print -quit)
	[[ -n $bindir ]] || die "meson install did not install the moepager tool"
	model=$stage/tiny.mpk
	run "$bindir" gen --preset tiny --seed 3 --quiet --out "$model"
	out=$(run "$stage/example" "$model")
	printf '%s\n' "$out"
	layers=$("$bindir" inspect --json "$model" | json_get geometry layers)
	experts=$("$bindir" inspect --json "$model" | json_get geometry experts)
	grep -q "moepager headers .*, library " <<<"$out" || die "example printed no version"
	grep -q ": $layers layers x $experts experts" <<<"$out" ||
		die "example's geometry disagrees with inspect ($layers layers x $experts experts)"
	rm -f "$model"
}

#
# Demo: the store and CLI end to end (later issues add the region, engine and trajectories)
#

# Flips one byte at offset off of file (xor 0xff).
flip_byte() {
	python3 -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0xff]))' "$1" "$2"
}

demo_store() {
	local dir=$BUILD/demo model bad short out rc layer expert off bytes size f rows

	mkdir -p "$dir"
	model=$dir/tiny.mpk
	bad=$dir/tiny-corrupt.mpk
	short=$dir/tiny-truncated.mpk

	say "1. generate a tiny model with deterministic random weights"
	run "$MOEPAGER" gen --preset tiny --seed 42 --out "$model"

	say "2. inspect it: geometry, non-expert tensors and 2 MiB-aligned experts"
	out=$(run "$MOEPAGER" inspect "$model")
	head -n 12 <<<"$out"
	note "... ($(wc -l <<<"$out") lines; 'inspect --json' prints the same as one object)"

	say "3. verify every checksum"
	run "$MOEPAGER" verify "$model"

	layer=$("$MOEPAGER" inspect --json "$model" | json_get geometry layers)
	layer=$((layer - 1))
	expert=3
	off=$("$MOEPAGER" inspect --json "$model" |
	      python3 -c 'import json, sys
d = json.load(sys.stdin)
l, e = int(sys.argv[1]), int(sys.argv[2])
x = [x for x in d["experts"] if x["layer"] == l and x["expert"] == e][0]
print(x["offset"] + x["bytes"] // 2)' "$layer" "$expert")
	say "4. flip one byte inside layer $layer expert $expert (file offset $off) of a copy"
	run cp --sparse=always "$model" "$bad"
	flip_byte "$bad" "$off"
	set +e
	out=$(run "$MOEPAGER" verify "$bad" 2>&1)
	rc=$?
	set -e
	printf '%s\n' "$out"
	((rc != 0)) || die "verify passed a corrupted file"
	grep -q "layer $layer expert $expert" <<<"$out" ||
		die "verify did not name layer $layer expert $expert"
	note "verify exited $rc and named the damaged expert"

	size=$(stat -c %s "$model")
	bytes=$((size / 2))
	say "5. truncate a copy to $bytes of $size bytes and inspect it"
	run cp --sparse=always "$model" "$short"
	run truncate -s "$bytes" "$short"
	set +e
	out=$(run "$MOEPAGER" inspect "$short" 2>&1)
	rc=$?
	set -e
	printf '%s\n' "$out" | tail -n 3
	((rc != 0 && rc < 128)) || die "inspect of a truncated file exited $rc (want 1..127)"
	note "inspect refused the truncated file (exit $rc)"
	rm -f "$bad" "$short"

	say "6. routing traces shipped for replay (data/traces, moe-trace v1)"
	for f in "$SRC"/data/traces/*/*.csv; do
		rows=$(($(grep -vc '^#' "$f") - 1))
		note "${f#"$SRC"/}: $(grep -m1 '^# model=' "$f" | cut -d= -f2), $rows rows"
	done
	note "(the region, engine and trajectory steps join this demo as later issues land)"
}

#
# Demo (issue 6): the trajectory-driven prefetcher against what a user would run instead
#

# A Mixtral-shaped model (32 layers x 8 experts, top-2) with 1.6 GB of random-weight experts,
# the two Mixtral-8x7B routing traces replayed on it at a 50 % expert budget: finemoe against
# the mmap'd model under a memory cgroup, O_DIRECT reads into an LRU cache, and the oracle.
demo_prefetch() {
	local dir=$BUILD/demo model traces=$SRC/data/traces/mixtral-8x7b
	local tokens=${MOEPAGER_DEMO_TOKENS:-64}

	((EUID == 0)) || die "the demo drops the page cache and makes a memory cgroup: run as root"
	mkdir -p "$dir"
	model=$dir/mixtral-demo.mpk

	say "1. a Mixtral-shaped model: 32 layers x 8 experts, top-2, 1.6 GB of experts"
	if [[ -s $model ]]; then
		note "reusing $model"
	else
		run "$MOEPAGER" gen --preset mixtral-mini --hidden 512 --ffn 2048 --heads 8 \
			--kv-heads 2 --head-dim 64 --seed 7 --out "$model"
	fi

	say "2. replay the Mixtral-8x7B routing traces at a 50% expert budget"
	note "traces: data/traces/mixtral-8x7b (gsm8k, humaneval; provenance in its README.md)"
	note "each trace's first request warms the expert-map store (FineMoE's 7:3 split of 2"
	note "requests); its second request is decoded, $tokens tokens, routing forced to the trace"
	note "policies run one after another, each in its own process, page cache dropped before"
	run "$MOEPAGER" bench --model "$model" --trace "$traces/gsm8k.csv,$traces/humaneval.csv" \
		--budget 50% --policies mmap,pread-lru,finemoe,oracle --max-tokens "$tokens" \
		--csv "$dir/bench.csv" --plot "$dir/plots"

	say "3. results"
	note "table above: decode tokens/s, stall per token, expert hit rate, prefetch accuracy"
	note "and waste, bytes read and peak RSS per policy (also in $dir/bench.csv)"
	note "plots: $dir/plots/throughput.{svg,png}, hit_rate.{svg,png} (against budget; add"
	note "budgets with 'moepager bench --budget 25%,50%,75%'), heatmap.{svg,png} (the traces'"
	note "per-layer expert activation)"
	note "how each baseline and policy works: docs/prefetch.md"
}

#
# Commands
#

# The last lines of every failed or timed-out test of the build dirs given: CI shows only
# the end of the output, so the summary repeats what each failing test printed last.
failed_test_tails() {
	local dir

	for dir in "$@"; do
		[[ -f $dir/meson-logs/testlog.json ]] || continue
		python3 - "$dir/meson-logs/testlog.json" <<-'PY'
		import json, sys
		for line in open(sys.argv[1]):
		    t = json.loads(line)
		    if t.get("result") in ("OK", "SKIP", "EXPECTEDFAIL"):
		        continue
		    print(f"--- {t['name']}: {t['result']} after {t['duration']:.0f} s ({sys.argv[1]})")
		    out = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
		    for l in out.splitlines()[-12:]:
		        print("    " + l[:200])
		PY
	done
}

summary() {
	local f

	if ((${#FAILED[@]})); then
		failed_test_tails "$BUILD" "$ASAN_BUILD" "$TSAN_BUILD" "$FUZZ_BUILD"
		say "${#FAILED[@]} step(s) failed:"
		for f in "${FAILED[@]}"; do
			note "$f"
		done
		exit 1
	fi
	say "all steps passed"
}

cmd=${1:-}
case $cmd in
deps)
	install_deps
	install_llama
	;;
build)
	install_deps
	install_llama
	build
	;;
demo)
	install_deps
	install_llama
	build
	step "demo: finemoe prefetching against mmap, pread-lru and the oracle" demo_prefetch
	summary
	;;
test)
	install_deps
	install_llama
	build
	note "CI=${CI:-} MOEPAGER_REQUIRE_BPF=${MOEPAGER_REQUIRE_BPF:-} (set: skips are failures)"
	step "test suite ($BUILD)" unit_tests
	step "ASan+UBSan build and tests ($ASAN_BUILD)" asan_tests
	step "ThreadSanitizer stress ($TSAN_BUILD)" tsan_stress
	step "libFuzzer smoke runs ($FUZZ_BUILD)" fuzz_smoke
	step "pkg-config example against a staged install" pkgconfig_example
	step "CLI end to end: gen, inspect, verify, corruption" demo_store
	summary
	;;
example)
	install_deps
	install_llama
	build
	step "pkg-config example against a staged install" pkgconfig_example
	summary
	;;
-h | --help | help)
	usage
	;;
*)
	usage >&2
	exit 2
	;;
esac
