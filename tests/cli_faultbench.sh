#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Description: `moepager faultbench` on a generated tiny model: every method measures the
# faults and reads it says (file faults once per expert and repeat, host faults four rounds
# of them, no read error), each headline figure is the median of the repeats' own, the cache
# is dropped as root (kept warm when asked), the shared host tier through a pagerd child adds
# its own object, the plain report has a line per method; bad command lines and a missing
# model are refused with a message, before any daemon starts.
#
#   cli_faultbench.sh MOEPAGER
set -uo pipefail
MOEPAGER=$1
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"

refused() { refused_by "$1" "$MOEPAGER" faultbench "${@:2}"; }	# refused MESSAGE ARGS...
"$MOEPAGER" gen --preset tiny --seed 1 --name fb --out "$T/m.mpk" --quiet || exit 1
A=(--model "$T/m.mpk" --experts 2)

cat >"$T/check.py" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
experts, repeat, cache = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
assert d["experts"] == experts and d["repeat"] == repeat, d
assert d["cache_mode"] == cache and d["o_direct"] is True, d
assert d["expert_bytes"] > 0 and d["expert_bytes"] % 4096 == 0, d
# Each file-set expert is faulted in once a repeat, each host-set expert four times.
assert d["faults_file"] == experts * repeat, d
assert d["faults_host"] == d["host_fault_samples"] == 4 * experts * repeat, d
assert d["read_errors"] == 0, d
reps = [d["repeats"][str(r)] for r in range(repeat)]
assert len(d["repeats"]) == repeat, d["repeats"]
for top, key in (("raw_io_uring_gbps", "raw_gbps"), ("file_fault_gbps", "file_gbps"),
                 ("file_to_raw", "file_to_raw"), ("mmap_gbps", "mmap_gbps")):
    # The nearest-rank median (the lower one of an even count), as the tool takes it.
    med = sorted(x[key] for x in reps)[(repeat + 1) // 2 - 1]
    assert abs(d[top] - med) <= 1e-5 * max(1.0, med), (top, d[top], med)
for x in reps:
    assert x["raw_gbps"] > 0 and x["file_gbps"] > 0 and x["mmap_gbps"] > 0, x
    assert abs(x["file_to_raw"] - x["file_gbps"] / x["raw_gbps"]) <= 1e-4 * x["file_to_raw"], x
    assert 0 < x["host_fault_p50_us"] <= x["host_fault_p99_us"], x
for lo, hi in (("file_fault_p50_us", "file_fault_p99_us"), ("host_fault_p50_us", "host_fault_p99_us"),
               ("host_service_p50_us", "host_service_p99_us")):
    assert 0 < d[lo] <= d[hi], (lo, hi, d)
assert d["host_fault_gbps"] > 0 and d["file_fault_fresh_gbps"] > 0, d
sh = d.get("shared")
if len(sys.argv) > 5:
    assert sh is not None and sh["pages"] == sys.argv[5], sh
    assert sh["samples"] == 4 * experts * repeat, sh
    assert sh["host_fault_gbps"] > 0 and sh["file_fault_gbps"] > 0, sh
    assert 0 < sh["host_fault_p50_us"] <= sh["host_fault_p99_us"], sh
    assert sh["continue_to_move_p50"] > 0, sh
else:
    assert sh is None, sh
PYEOF

"$MOEPAGER" faultbench "${A[@]}" --repeat 3 --json >"$T/out.json" 2>"$T/err"
check "faultbench measures every method" test $? = 0
check "faultbench's JSON holds together, cache dropped as root" \
	"$PY" "$T/check.py" "$T/out.json" 2 3 "$([ "$(id -u)" = 0 ] && echo drop_caches || echo fadvise)"

"$MOEPAGER" faultbench "${A[@]}" --repeat 2 --no-drop-caches --shared --shared-pages small \
	--json >"$T/sh.json" 2>"$T/err"
check "faultbench --shared runs the daemon's host tier too" test $? = 0
check "the shared tier's JSON holds together, the cache kept warm" \
	"$PY" "$T/check.py" "$T/sh.json" 2 2 warm small

"$MOEPAGER" faultbench "${A[@]}" --repeat 1 >"$T/plain" 2>"$T/err"
check "faultbench prints a plain report" test $? = 0
for line in "raw io_uring O_DIRECT" "file-tier faults" "host-tier faults" "mmap, cold page cache"; do
	check "the plain report has '$line'" grep -q "$line" "$T/plain"
done

check "a missing model is refused" refused "No such file" --model "$T/none.mpk"
check "more experts than the model has are refused" \
	refused "distinct experts; the model has" --model "$T/m.mpk" --experts 4096
check "--experts 0 is refused" refused "--experts" --model "$T/m.mpk" --experts 0
check "--io-bytes not a multiple of 4K is refused" refused "a multiple of 4K" "${A[@]}" --io-bytes 1000
check "an unknown page kind is refused before a daemon starts" \
	refused "--shared-pages bogus: small, thp or hugetlb" "${A[@]}" --shared-pages bogus
check "... and nothing was started for it" bash -c "! grep -q pagerd '$T/err'"

exit $((fails > 0))
