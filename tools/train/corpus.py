# SPDX-License-Identifier: MIT
"""Corpus preparation: Debian's fortunes -> train/held-out split -> SentencePiece tokenizer.

Run with Debian's interpreter (/usr/bin/python3): it has python3-sentencepiece.

  /usr/bin/python3 tools/train/corpus.py --out /work/data/train/corpus

Writes OUT/train.txt and OUT/heldout.txt (fortunes separated by lines holding
only "%", the fortune(6) file format), OUT/tok.model (the SentencePiece model),
OUT/tok.vocab.txt (the vocabulary in the text form engine/tokenizer.c reads) and
OUT/{train,heldout}.ids (uint16 token stream: BOS fortune EOS BOS fortune EOS ...).

Every model of the recipe shares one tokenizer (tiny-real's): --tokenizer FILE loads
that tok.model instead of training one (the split is made the same way, so the
corpus is identical), and --expect-vocab data/models/tiny-real.tok fails unless the
exported vocabulary is byte for byte the committed one. Training it anew with the
same seed gives the same model too (same tokenizer_sha256), but reusing is cheaper
and does not depend on sentencepiece's trainer staying the same.
"""
import argparse
import hashlib
import io
import json
import os
import random
import sys

import numpy as np

FORTUNE_DIR = "/usr/share/games/fortunes"
# Pictures, not prose: they teach the model nothing about English.
EXCLUDED = {"art", "ascii-art"}
VOCAB_SIZE = 4096
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
HELDOUT_FRACTION = 0.05
# A newline is a piece of its own (the trainer never sees one inside a piece otherwise).
USER_SYMBOLS = ["\n"]

# SentencePiece's piece types (sentencepiece_model.proto).
PIECE_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user", 5: "unused", 6: "byte"}


def fortune_files(root):
    names = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if "." in name or name in EXCLUDED or not os.path.isfile(path) or os.path.islink(path):
            continue
        names.append(name)
    return names


def read_fortunes(root, names):
    """Every fortune of the files, in file order, trailing blanks removed, exact duplicates dropped."""
    seen = set()
    out = []
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        cur = []
        for line in text.split("\n") + ["%"]:
            if line.rstrip() == "%":
                body = "\n".join(l.rstrip() for l in cur).strip("\n")
                cur = []
                if body.strip() and body not in seen:
                    seen.add(body)
                    out.append(body)
            else:
                cur.append(line)
    return out


def write_fortunes(path, fortunes):
    with open(path, "w", encoding="utf-8") as f:
        for i, body in enumerate(fortunes):
            if i:
                f.write("%\n")
            f.write(body + "\n")


def load_fortunes(path):
    """Inverse of write_fortunes (the fortune(6) format)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out, cur = [], []
    for line in text.split("\n"):
        if line == "%":
            out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur and cur[-1] == "":
        cur.pop()
    if cur:
        out.append("\n".join(cur))
    return out


def encode_stream(sp, fortunes):
    ids = []
    for body in fortunes:
        ids.append(BOS_ID)
        ids.extend(sp.encode(body))
        ids.append(EOS_ID)
    return np.asarray(ids, dtype=np.uint16)


def export_vocab(sp, path):
    """The vocabulary as text: a header line, then one "id type score hexbytes" line per piece.

    Pieces are written as hex so that any byte (spaces, newlines, U+2581) survives.
    The normalizer settings are the ones main() trains with; engine/tokenizer.c
    implements exactly those (identity rule, dummy prefix, byte fallback).
    """
    with open(path, "w", encoding="ascii") as f:
        f.write("# moepager-spm-unigram v1\n")
        f.write("# pieces=%d unk=%d bos=%d eos=%d add_dummy_prefix=1 byte_fallback=1\n"
                % (sp.get_piece_size(), sp.unk_id(), sp.bos_id(), sp.eos_id()))
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if sp.is_unknown(i):
                kind = "unknown"
            elif sp.is_control(i):
                kind = "control"
            elif sp.is_byte(i):
                kind = "byte"
            elif sp.is_unused(i):
                kind = "unused"
            elif piece in USER_SYMBOLS:
                kind = "user"
            else:
                kind = "normal"
            # repr() of a float32 widened to double round-trips exactly through strtof.
            score = float(np.float32(sp.get_score(i)))
            f.write("%d %s %r %s\n" % (i, kind, score, piece.encode("utf-8").hex()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--fortunes", default=FORTUNE_DIR)
    ap.add_argument("--tokenizer", default=None,
                    help="an existing tok.model to reuse instead of training one")
    ap.add_argument("--expect-vocab", default=None,
                    help="a .tok file the exported vocabulary must equal (e.g. data/models/tiny-real.tok)")
    args = ap.parse_args()

    import sentencepiece as spm

    os.makedirs(args.out, exist_ok=True)
    names = fortune_files(args.fortunes)
    fortunes = read_fortunes(args.fortunes, names)
    rng = random.Random(args.seed)
    rng.shuffle(fortunes)
    n_held = int(len(fortunes) * HELDOUT_FRACTION)
    heldout, train = fortunes[:n_held], fortunes[n_held:]
    write_fortunes(os.path.join(args.out, "train.txt"), train)
    write_fortunes(os.path.join(args.out, "heldout.txt"), heldout)

    if args.tokenizer:
        with open(args.tokenizer, "rb") as f:
            model_bytes = f.read()
    else:
        model_bytes = train_tokenizer(spm, train)
    with open(os.path.join(args.out, "tok.model"), "wb") as f:
        f.write(model_bytes)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    vocab_path = os.path.join(args.out, "tok.vocab.txt")
    export_vocab(sp, vocab_path)
    if args.expect_vocab:
        with open(vocab_path, "rb") as a, open(args.expect_vocab, "rb") as b:
            if a.read() != b.read():
                sys.exit("corpus.py: the tokenizer's vocabulary differs from %s" % args.expect_vocab)
    tr = encode_stream(sp, train)
    he = encode_stream(sp, heldout)
    tr.tofile(os.path.join(args.out, "train.ids"))
    he.tofile(os.path.join(args.out, "heldout.ids"))
    info = {
        "source": "Debian package fortunes 1:1.99.1-7.3 (and fortunes-min), %s" % args.fortunes,
        "files": names, "seed": args.seed, "fortunes_train": len(train),
        "fortunes_heldout": len(heldout), "tokens_train": int(tr.size),
        "tokens_heldout": int(he.size), "vocab": sp.get_piece_size(),
        "train_sha256": hashlib.sha256(open(os.path.join(args.out, "train.txt"), "rb").read()).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(model_bytes).hexdigest(),
    }
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=1)
    json.dump(info, sys.stdout, indent=1)
    print()


def train_tokenizer(spm, train):
    """The SentencePiece model (serialized) trained on the training split."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_writer=model, vocab_size=VOCAB_SIZE,
        model_type="unigram", normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, byte_fallback=True,
        user_defined_symbols=USER_SYMBOLS, character_coverage=0.9999,
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        max_sentence_length=16384, seed_sentencepiece_size=1000000,
        num_threads=1, minloglevel=2)
    return model.getvalue()


if __name__ == "__main__":
    main()
