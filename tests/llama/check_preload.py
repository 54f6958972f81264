# SPDX-License-Identifier: MIT
"""Description: llama.cpp under libmoepager-preload.so decodes as it does on its own mmap.

    check_preload.py MOEPAGER LLAMA_RUN BACKEND_DIR MODEL.mpk PRELOAD.so WORKDIR \
        LLAMA_DIR CHAT.mjs NODE
    check_preload.py --missing WHY

The trained model is exported to GGUF (f32, bf16 and q8_0 weights, tensors aligned to
32 bytes as llama.cpp's own files are, so expert slices share boundary pages);
llama.cpp (tests/llama/llama_run.c) decodes each prompt greedily on its plain
mmap of the file, then with LD_PRELOAD=PRELOAD.so at budgets of one expert, 50 %
and 100 % of the expert pages, routing read from llama.cpp's eval callback; and
at 50 % again from fault order alone (MOEPAGER_EVAL=0) with read-ahead learnt
from it (MOEPAGER_PREFETCH=2). Tokens and every step's logits must be
identical, the preload's statistics line must show the image was used (routes
seen through the callback, or faults without it), its resident peak within the
budget, and experts evicted below 100 %.

Then a chat through node-llama-cpp (tests/llama/chat.mjs: a chat answer and a
plain completion, greedy, under NODE, the node-llama-cpp of LLAMA_DIR) with and
without the preload at one expert and 50 %: the same answers and token ids, and
routes seen through the eval callback the preload installs in the addon's
context (its libllama is loaded with dlopen, RTLD_LOCAL). No NODE: a failure
where every test must run, a note elsewhere.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_llama import PROMPTS, THREADS, TOKENS, required, run, runner  # noqa: E402

TYPES = ["f32", "bf16", "q8_0"]


def llama(llama_run, bins, gguf, ids, dump, env=None):
    out = subprocess.run([llama_run, "-m", gguf, "-B", bins, "-p", ",".join(map(str, ids)),
                          "-n", str(TOKENS), "-l", dump, "-t", THREADS], check=True,
                         capture_output=True, text=True, env=env).stdout
    line = [l for l in out.splitlines() if l.startswith("tokens:")][0]
    with open(dump, "rb") as f:
        return line, f.read()


# (name, budget, extra environment)
CASES = [("100%", "100%", {}), ("1 expert", None, {}), ("50%", "50%", {}),
         ("50% fault order", "50%", {"MOEPAGER_EVAL": "0", "MOEPAGER_PREFETCH": "2"})]


def preloaded(preload, budget, stats, extra):
    env = dict(os.environ, LD_PRELOAD=preload, MOEPAGER_BUDGET=budget,
               MOEPAGER_PRELOAD_STATS=stats, **extra)
    if os.path.exists(stats):
        os.unlink(stats)
    return env


def read_stats(stats):
    with open(stats) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    if len(lines) != 1:
        raise SystemExit(f"FAIL: {len(lines)} image statistics lines in {stats}, want 1")
    return lines[0]


def check_type(moepager, llama_run, bins, model, preload, work, dtype):
    tok = model[:-4] + ".tok"
    gguf = os.path.join(work, f"tiny-real-{dtype}.gguf")
    stats = os.path.join(work, "stats.json")
    dump = os.path.join(work, "logits.bin")
    run(moepager, "export", model, "--gguf", gguf, "--dtype", dtype, "--alignment", "32",
        "--quiet")
    failed = 0
    one = None
    for i, prompt in enumerate(PROMPTS):
        ids, _ = runner(moepager, model, tok, prompt, dump)
        plain = llama(llama_run, bins, gguf, ids, dump)
        for name, budget, extra in CASES:
            env = preloaded(preload, budget or str(one), stats, extra)
            got = llama(llama_run, bins, gguf, ids, dump, env)
            s = read_stats(stats)
            one = s["expert_max_bytes"]
            used = s["faults"] > 0 if extra else s["routes"] > 0
            ok = (got == plain and used and s["resident_peak"] <= s["budget_bytes"] and
                  s["fills"] > 0 and (name == "100%" or s["evictions"] > 0))
            failed += not ok
            print(f"{'ok' if ok else 'FAIL'}: {dtype} prompt {i} budget {name} "
                  f"({s['budget_bytes']} B): tokens {'identical' if got[0] == plain[0] else 'differ'}, "
                  f"logits {'identical' if got[1] == plain[1] else 'differ'}; "
                  f"peak {s['resident_peak']} B, {s['faults']} faults, {s['fills']} fills, "
                  f"{s['evictions']} evictions, {s['prefetches']} read ahead, "
                  f"{s['bytes_read']} B read, hit rate {s['hit_rate']:.2f}")
            if got[0] != plain[0]:
                print(f"  plain   {plain[0]}\n  preload {got[0]}")
    return failed


def chat(node, chat_js, llama_dir, gguf, env=None):
    env = dict(env or os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
    out = subprocess.run([node, chat_js, llama_dir, gguf, "The secret of life"], check=True,
                         capture_output=True, text=True, env=env, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def check_chat(preload, work, llama_dir, chat_js, node):
    if not node:
        print(("FAIL" if required() else "note") + ": node not found: no node-llama-cpp chat")
        return 1 if required() else 0
    gguf = os.path.join(work, "tiny-real-q8_0.gguf")
    stats = os.path.join(work, "stats.json")
    plain = chat(node, chat_js, llama_dir, gguf)
    failed = 0
    one = None
    for name, budget in [("100%", "100%"), ("1 expert", None), ("50%", "50%")]:
        got = chat(node, chat_js, llama_dir, gguf,
                   preloaded(preload, budget or str(one), stats, {}))
        s = read_stats(stats)
        one = s["expert_max_bytes"]
        ok = got == plain and s["routes"] > 0 and s["resident_peak"] <= s["budget_bytes"]
        failed += not ok
        print(f"{'ok' if ok else 'FAIL'}: node-llama-cpp chat, q8_0, budget {name}: "
              f"{'same' if got == plain else 'different'} answer and completion "
              f"({len(got['chatIds'])} + {len(got['completionIds'])} tokens); "
              f"{s['routes']} routes, hit rate {s['hit_rate']:.2f}, {s['faults']} faults, "
              f"{s['evictions']} evictions")
        if got != plain:
            print(f"  plain   {plain}\n  preload {got}")
    print(f"  completion: {plain['completion']!r}")
    return failed


def main(argv):
    if argv[1] == "--missing":
        print(f"llama.cpp is not installed ({argv[2]}): run tools/bootstrap.sh deps")
        return 1 if required() else 77
    moepager, llama_run, bins, model, preload, work, llama_dir, chat_js, node = argv[1:10]
    os.makedirs(work, exist_ok=True)
    failed = sum(check_type(moepager, llama_run, bins, model, preload, work, t) for t in TYPES)
    failed += check_chat(preload, work, llama_dir, chat_js, node)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
