# SPDX-License-Identifier: MIT
"""Description: llama.cpp decodes moepager's exported GGUF files as moepager's runner does.

    check_llama.py MOEPAGER LLAMA_RUN BACKEND_DIR MODEL.mpk WORKDIR
    check_llama.py --missing WHY

For each type the trained model is exported to GGUF (`moepager export --dtype T`,
every weight matrix in T) and imported back (`moepager import`), so both sides
hold the same weights; then, for each prompt, `moepager run` and llama.cpp
(tests/llama/llama_run.c over the npm package's libraries) decode greedily from
the same prompt ids. The generated tokens must be identical for f32 and q8_0,
and f32 logits within 1e-4 of the largest; bf16 is reported (llama.cpp rounds
activations to bf16 before its bf16 products, and to q8_0 blocks before its q8_0
ones; the runner keeps them f32). Every case prints the largest absolute
difference of the logits over the steps both sides share.

--missing: llama.cpp was not found when the build was configured. That is a
failure where every test must run (CI, MOEPAGER_REQUIRE_BPF=1), a skip (77)
elsewhere. Run with Debian's /usr/bin/python3 (python3-numpy).
"""
import json
import os
import subprocess
import sys

import numpy as np

# (type, whether the tokens must be identical, bound on max |logit diff| / max |logit|):
# llama.cpp's f32 products are f32 as the runner's; its q8_0 products quantize the
# activations to q8_0 blocks and its bf16 ones round them to bf16, so only f32 is held
# to a bound.
TYPES = [("f32", True, 1e-4), ("q8_0", True, None), ("bf16", False, None)]
PROMPTS = ["The secret of life", "Q: What is a", "Computers are"]
TOKENS = 24
THREADS = "2"


def required():
    v = os.environ.get("MOEPAGER_REQUIRE_BPF", "")
    return (v not in ("", "0")) or "CI" in os.environ


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def runner(moepager, mpk, tok, prompt, dump):
    res = json.loads(run(moepager, "run", "--model", mpk, "--tokenizer", tok, "--prompt",
                         prompt, "--tokens", str(TOKENS - 1), "--threads", THREADS, "--json",
                         "--dump-logits", dump, "--membw-bytes", "8M"))
    return res["prompt"], res["tokens"]


def llama(llama_run, bins, gguf, prompt_ids, n, dump):
    out = run(llama_run, "-m", gguf, "-B", bins, "-p", ",".join(map(str, prompt_ids)),
              "-n", str(n), "-l", dump, "-t", THREADS)
    line = [l for l in out.splitlines() if l.startswith("tokens:")][0]
    return [int(x) for x in line.split()[1:]]


def compare(moepager, llama_run, bins, model, work, dtype):
    """Returns (tokens identical for every prompt, max |logit diff|, max |logit|, steps)."""
    tok = model[:-4] + ".tok"
    gguf = os.path.join(work, f"tiny-real-{dtype}.gguf")
    mpk = os.path.join(work, f"tiny-real-{dtype}.mpk")
    run(moepager, "export", model, "--gguf", gguf, "--dtype", dtype, "--quiet")
    run(moepager, "import", gguf, "--out", mpk, "--quiet")
    same, diff, scale, steps = True, 0.0, 0.0, 0
    for i, prompt in enumerate(PROMPTS):
        ours_bin = os.path.join(work, f"ours-{dtype}-{i}.bin")
        theirs_bin = os.path.join(work, f"llama-{dtype}-{i}.bin")
        ids, ours = runner(moepager, mpk, tok, prompt, ours_bin)
        theirs = llama(llama_run, bins, gguf, ids, len(ours), theirs_bin)
        a = np.fromfile(ours_bin, dtype="<f4").reshape(len(ours), -1)
        b = np.fromfile(theirs_bin, dtype="<f4").reshape(len(theirs), -1)
        # logits are comparable up to the first step whose token differs (included)
        k = next((j for j in range(len(ours)) if ours[j] != theirs[j]), len(ours) - 1) + 1
        diff = max(diff, float(np.max(np.abs(a[:k] - b[:k]))))
        scale = max(scale, float(np.max(np.abs(a[:k]))))
        steps += k
        if ours != theirs:
            same = False
            print(f"  {dtype} prompt {prompt!r}: runner {ours}\n"
                  f"  {' ' * len(dtype)} {' ' * (len(prompt) + 11)}llama.cpp {theirs}")
    return same, diff, scale, steps


def main(argv):
    if argv[1] == "--missing":
        print(f"llama.cpp is not installed ({argv[2]}): run tools/bootstrap.sh deps")
        return 1 if required() else 77
    moepager, llama_run, bins, model, work = argv[1:6]
    os.makedirs(work, exist_ok=True)
    failed = 0
    for dtype, strict, bound in TYPES:
        same, diff, scale, steps = compare(moepager, llama_run, bins, model, work, dtype)
        close = bound is None or diff <= bound * scale
        verdict = "ok" if same and close else "FAIL" if strict or not close else "note"
        failed += verdict == "FAIL"
        print(f"{verdict}: {dtype}: tokens {'identical' if same else 'differ'} "
              f"({len(PROMPTS)} prompts x {TOKENS} tokens); max |logit difference| "
              f"{diff:.3g} over {steps} steps (max |logit| {scale:.3g}"
              + (f", bound {bound:g} of it)" if bound else ")"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
