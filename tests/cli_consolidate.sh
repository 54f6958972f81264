#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `moepager consolidate` on three generated tiny models: every form of --capacity, the
# report's counts against Algorithm 1, --info reading back what was built, a map checked
# against the models in another order or another geometry refused with a message saying so.
set -u
moepager=$1
. "$(dirname "$0")/cli_lib.sh"
for s in 1 2 3; do
	"$moepager" gen --preset tiny --seed $s --name v$s --out "$T/v$s.mpk" --quiet || exit 1
done
"$moepager" gen --preset tiny --layers 2 --out "$T/short.mpk" --quiet || exit 1
models=("$T/v1.mpk" "$T/v2.mpk" "$T/v3.mpk")
capacity() {
	"$moepager" consolidate "${models[@]}" --capacity "$1" --out "$T/m.mpc" --json \
		--cross-samples 4 | python3 -c 'import json, sys; print(json.load(sys.stdin)["capacity"])'
}
# tiny: 4 x 8 = 32 positions, experts of 3 x 128 x 256 f32 = 393216 bytes
for c in 5:5 50%:16 0.25:8 1M:2 0:0 32:32 100G:32; do
	got=$(capacity "${c%%:*}")
	[[ $got == "${c##*:}" ]] || bad "--capacity ${c%%:*} gave '$got', not ${c##*:}"
done
for v in 33 1.5 150% abc -1; do
	if "$moepager" consolidate "${models[@]}" --capacity "$v" --out "$T/x.mpc" \
		>/dev/null 2>&1 || [[ -e $T/x.mpc ]]; then
		bad "--capacity $v was accepted"
	fi
done
"$moepager" consolidate "${models[@]}" --capacity 11 --out "$T/m.mpc" --json \
	--cross-samples 8 > "$T/build.json" || exit 1
"$moepager" consolidate --info "$T/m.mpc" "${models[@]}" --json > "$T/info.json" ||
	bad "--info refused the models the map was made for"
python3 - "$T/build.json" "$T/info.json" <<'PY' || bad "the map's report and --info (above)"
import json, sys
b, i = (json.load(open(p)) for p in sys.argv[1:3])
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("FAILED:", what)
        ok = False
n, C = len(b["models"]), b["capacity"]
check(C == 11 and sum(m["owned"] for m in b["models"]) == C, "owned counts do not sum to C")
for p in b["positions_by_index"]:
    want = (p["rank"] - 1) % n if p["rank"] <= C else -1
    check(p["owner"] == want, f"layer {p['layer']} expert {p['expert']}: owner {p['owner']}")
ranked = sorted(b["positions_by_index"], key=lambda p: p["rank"])
check(all(a["distance"] <= c["distance"] for a, c in zip(ranked, ranked[1:])),
      "ranks do not follow the distances")
for L in b["per_layer"]:
    check(sum(L["owned"]) + L["unowned"] == b["experts"], f"layer {L['layer']} counts")
    check(L["distance"]["cross"]["n"] == 8 * 3, f"layer {L['layer']}: cross samples")
check(b["distance"]["same"]["n"] == 3 * 32, "same-position distances: not 3 pairs x 32")
check(i["positions_by_index"] == b["positions_by_index"], "--info reads back other positions")
check(i["distance"]["cross"] is None, "--info reports cross-position distances")
sys.exit(0 if ok else 1)
PY
if err=$("$moepager" consolidate --info "$T/m.mpc" "$T/v2.mpk" "$T/v1.mpk" \
	"$T/v3.mpk" 2>&1 >/dev/null); then
	bad "a map was accepted for its models in another order"
fi
[[ $err == *"is model 1 of the map, not 0"* ]] || bad "the order error: $err"
if err=$("$moepager" consolidate "$T/v1.mpk" "$T/short.mpk" --capacity 1 \
	--out "$T/s.mpc" 2>&1 >/dev/null) || [[ -e $T/s.mpc ]]; then
	bad "models of two geometries were consolidated"
fi
[[ $err == *"v1.mpk and $T/short.mpk differ in geometry: layers 4 vs 2"* ]] ||
	bad "the geometry error: $err"
if err=$("$moepager" consolidate --info "$T/v1.mpk" 2>&1 >/dev/null); then
	bad "an .mpk was read as a map"
fi
[[ $err == *"not a moepager consolidation map"* ]] || bad "$err"
# Every subcommand's usage names itself as the user types it, and the help examples
# point at the trained model where the build puts it.
for c in consolidate loadgen bench batchbench bench-adapters bench-multi; do
	line=$("$moepager" "$c" --help | head -1)
	[[ $line == "Usage: moepager $c "* ]] || bad "$c --help: $line"
done
for c in eval generate; do
	"$moepager" "$c" --help | grep -q -- "--model build/data/models/tiny-real.mpk" ||
		bad "$c --help: the example model is not build/data/models/tiny-real.mpk"
done
exit $((fails > 0))
