# SPDX-License-Identifier: MIT
"""Domain corpora for the fine-tunes of tiny-real: text from Debian packages it never saw.

  /usr/bin/python3 tools/train/domains.py --out /work/data/domains/corpus [--only NAME,...]

tiny-real was trained on fortunes only. Each domain here is the text of one or a
few named Debian packages (their versions are recorded). A domain's text is cut
into documents (a file, or a chapter or paragraph group of a long text), documents
longer than PIECE_CHARS into pieces at blank lines; documents are shuffled with a
seed derived from --seed and the domain's name, the first ones held out (never
trained on) until HELDOUT_TOKENS, the rest are the training text (capped at
TRAIN_TOKENS). Every piece is encoded as BOS piece EOS with tiny-real's own
tokenizer (engine/tokenizer.c over data/models/tiny-real.tok, the ids
SentencePiece gives), so training and `moepager eval` see the same ids.

Writes OUT/NAME/{train,heldout}.txt (fortune(6) format: pieces separated by
lines holding only "%", as `moepager eval --text` reads), OUT/NAME/{train,heldout}.ids
(uint16 streams), OUT/NAME/domain.json (provenance) and OUT/domains.json (all).
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from corpus import write_fortunes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIECE_CHARS = 6000		# ~2,000 tokens: a piece is seen through 256-token windows anyway
MIN_CHARS = 80			# pieces with less non-blank text (.so stubs, empty files) are dropped
HELDOUT_TOKENS = 32768		# 128 windows of 256
HELDOUT_MAX_SHARE = 0.15	# small domains hold out at most this share of their tokens
TRAIN_TOKENS = 1500000		# more than any fine-tune here reads
READ_CHARS = 12000000		# domains bigger than this are sampled (documents in shuffled order)


def package_files(pkg, suffixes=None, under=None):
    """Regular files (not symlinks) that dpkg says the installed package owns, sorted."""
    out = subprocess.run(["dpkg", "-L", pkg], check=True, capture_output=True, text=True).stdout
    files = []
    for p in out.splitlines():
        if not os.path.isfile(p) or os.path.islink(p):
            continue
        if suffixes and not p.endswith(tuple(suffixes)):
            continue
        if under and not any(u in p for u in under):
            continue
        files.append(p)
    return sorted(set(files))


def read_text(path):
    data = open(path, "rb").read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def paragraph_groups(text, limit=PIECE_CHARS):
    """Consecutive paragraphs joined up to limit characters (a paragraph alone may pass it:
    pieces() cuts it further)."""
    groups, cur, size = [], [], 0
    for para in text.split("\n\n"):
        if cur and size + len(para) + 2 > limit:
            groups.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += len(para) + 2
    if cur:
        groups.append("\n\n".join(cur))
    return groups


def pieces(text):
    """A document cut into pieces of at most PIECE_CHARS, at blank lines, else at line ends."""
    out = []
    for group in paragraph_groups(text):
        while len(group) > PIECE_CHARS:
            cut = group.rfind("\n", 0, PIECE_CHARS)
            cut = cut if cut > 0 else PIECE_CHARS
            out.append(group[:cut])
            group = group[cut:]
        out.append(group)
    return out


def clean(text):
    """Lines right-stripped, lines holding only "%" dropped (the file format's separator),
    leading and trailing blank lines removed."""
    lines = [l.rstrip() for l in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(l for l in lines if l != "%").strip("\n")


# Readers: each yields documents (lists of one or more texts) and names the packages used.

def files_reader(pkg, suffixes=None, under=None):
    def read():
        return [[read_text(p)] for p in package_files(pkg, suffixes, under)]
    return read


def chunks_reader(pkg, suffixes=None, under=None):
    """A few long texts: every paragraph group is a document of its own."""
    def read():
        docs = []
        for p in package_files(pkg, suffixes, under):
            docs += [[g] for g in paragraph_groups(clean(read_text(p)))]
        return docs
    return read


def bible_reader():
    """The King James Bible through the bible(1) reader: one document per chapter."""
    env = dict(os.environ, COLUMNS="80")
    text = subprocess.run(["bible", "gen1:1-rev22:21"], check=True, capture_output=True,
                          text=True, env=env, cwd="/").stdout
    docs, cur = [], []
    for line in text.split("\n"):
        # A chapter starts with its title ("Genesis 1", "1 Kings 3") after a blank line.
        if line and not line.startswith(" ") and line.split()[-1].isdigit() and cur and cur[-1] == "":
            docs.append(["\n".join(cur)])
            cur = []
        cur.append(line)
    docs.append(["\n".join(cur)])
    return [d for d in docs if d[0].strip()]


INFO_PACKAGES = ["coreutils", "findutils", "grep", "sed", "diffutils", "gzip"]


def info_reader():
    docs = []
    for pkg in INFO_PACKAGES:
        docs += chunks_reader(pkg, under=["/usr/share/info/"])()
    return docs


DOMAINS = {
    "bible": dict(packages=["bible-kjv-text", "bible-kjv"], reader=bible_reader,
                  what="King James Bible, one document per chapter (read by bible(1))"),
    "man": dict(packages=["manpages-dev"], reader=files_reader("manpages-dev", [".2.gz", ".3.gz"]),
                what="troff source of the section 2 and 3 manual pages"),
    "cheaders": dict(packages=["linux-libc-dev"], reader=files_reader("linux-libc-dev", [".h"]),
                     what="Linux UAPI C headers (/usr/include)"),
    "python": dict(packages=["libpython3.11-stdlib"],
                   reader=files_reader("libpython3.11-stdlib", [".py"]),
                   what="Python 3.11 standard library source"),
    "perl": dict(packages=["perl-modules-5.36"], reader=files_reader("perl-modules-5.36", [".pm"]),
                 what="Perl 5.36 core modules (code and POD)"),
    "shell": dict(packages=["bash-completion"],
                  reader=files_reader("bash-completion", under=["/bash-completion/"]),
                  what="bash completion scripts"),
    "jargon": dict(packages=["jargon-text"],
                   reader=chunks_reader("jargon-text", ["jargon.txt.gz"]),
                   what="the Jargon File 4.4.7, rendered text, paragraph groups"),
    "policy": dict(packages=["debian-policy"], reader=chunks_reader("debian-policy", [".txt.gz"]),
                   what="Debian Policy Manual and its companion documents, text, paragraph groups"),
    "gnustd": dict(packages=["gnu-standards"], reader=chunks_reader("gnu-standards", [".text.gz"]),
                   what="GNU Coding Standards and Information for Maintainers, text, paragraph groups"),
    "info": dict(packages=INFO_PACKAGES, reader=info_reader,
                 what="Info manuals of coreutils, findutils, grep, sed, diffutils and gzip, "
                      "paragraph groups"),
}


def package_version(pkg):
    return subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], check=True,
                          capture_output=True, text=True).stdout


def build(name, spec, tok, tok_sha, out, seed):
    docs = spec["reader"]()
    rng = random.Random("%d-%s" % (seed, name))
    rng.shuffle(docs)
    seen, kept, chars = set(), [], 0
    for doc in docs:
        if chars >= READ_CHARS:
            break
        ps = []
        for text in doc:
            for p in pieces(clean(text)):
                p = p.strip("\n")
                if len("".join(p.split())) < MIN_CHARS or p in seen:
                    continue
                seen.add(p)
                ps.append((p, tok.encode(p)))
                chars += len(p)
        if ps:
            kept.append(ps)
    total = sum(len(ids) + 2 for d in kept for _, ids in d)
    held_target = min(HELDOUT_TOKENS, int(total * HELDOUT_MAX_SHARE))
    split = {"heldout": [], "train": []}
    count = {"heldout": 0, "train": 0}
    used = 0
    for d in kept:
        which = "heldout" if count["heldout"] < held_target else "train"
        if which == "train" and count["train"] >= TRAIN_TOKENS:
            break
        used += 1
        for p, ids in d:
            split[which].append((p, ids))
            count[which] += len(ids) + 2
    os.makedirs(os.path.join(out, name), exist_ok=True)
    info = {"name": name, "what": spec["what"],
            "packages": [{"name": p, "version": package_version(p)} for p in spec["packages"]],
            "seed": seed, "documents": len(docs), "documents_read": len(kept),
            "documents_used": used, "piece_chars": PIECE_CHARS, "tokenizer_sha256": tok_sha}
    for which, items in split.items():
        base = os.path.join(out, name, which)
        write_fortunes(base + ".txt", [p for p, _ in items])
        stream = []
        for _, ids in items:
            stream += [tok.bos] + ids.tolist() + [tok.eos]
        np.asarray(stream, dtype=np.uint16).tofile(base + ".ids")
        info["pieces_" + which] = len(items)
        info["tokens_" + which] = len(stream)
        info[which + "_sha256"] = hashlib.sha256(open(base + ".txt", "rb").read()).hexdigest()
    with open(os.path.join(out, name, "domain.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "models", "tiny-real.tok"))
    ap.add_argument("--only", default=None, help="comma-separated domain names (default all)")
    ap.add_argument("--lib", default=None, help="libmoepager.so (default: build-train/ or build/)")
    args = ap.parse_args()

    names = args.only.split(",") if args.only else list(DOMAINS)
    for n in names:
        if n not in DOMAINS:
            ap.error("unknown domain %r (known: %s)" % (n, ", ".join(DOMAINS)))
    tok = mpk.Tokenizer(mpk.Lib(args.lib), args.tokenizer)
    tok_sha = hashlib.sha256(open(args.tokenizer, "rb").read()).hexdigest()
    os.makedirs(args.out, exist_ok=True)
    summary_path = os.path.join(args.out, "domains.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    for n in names:
        info = build(n, DOMAINS[n], tok, tok_sha, args.out, args.seed)
        summary[n] = info
        print(json.dumps({k: info[k] for k in ("name", "documents", "tokens_train",
                                                "tokens_heldout")}), flush=True)
    summary = {n: summary[n] for n in DOMAINS if n in summary}
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
