#!/usr/bin/env python3
"""Write tests/text/tiny_tokenizer.json: a valid byte-level BPE tokenizer.json with a small vocabulary
(the 256 byte tokens, 160 merges learned here from a few English and Python lines, and the three Qwen
chat tokens as added tokens), with Qwen3's pre-tokenizer (digits one by one), NFC normaliser and
ByteLevel decoder. The tests run small models on it (vocab ~420, so a model is tiny and fast).
Deterministic: rerun to regenerate the same file. Usage: python3 make_tiny_tokenizer.py [OUT]"""
import json, re, sys
from collections import Counter

CORPUS = """Below is a list of keys and their values. Remember them.
The value of apple is 4821. The value of river is 1093. The value of garden is 7710.
Question: what is the value of apple? Answer: The value of apple is 4821.
The weather was calm and the streets were quiet. People walked to the market in the morning.
def quantize_fp8(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().max() / 448.0
    return (x / scale).to(torch.float8_e4m3fn)
    ========================================
    ########################################
    ----------------------------------------
the of and to in is that for it with as on was at by this be from are or an
"""

def byte_map():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

BM = byte_map()
# a simplification of Qwen's split (ASCII only): words with their leading space, digits one by one
PRE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

def main(out):
    words = Counter()
    for piece in PRE.findall(CORPUS):
        words[tuple(BM[b] for b in piece.encode())] += 1
    vocab = {BM[b]: i for i, b in enumerate(sorted(BM))}  # id = byte value
    merges = []
    words = dict(words)
    while len(merges) < 160:
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append([a, b])
        vocab[a + b] = len(vocab)
        nw = {}
        for w, c in words.items():
            o, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    o.append(a + b)
                    i += 2
                else:
                    o.append(w[i])
                    i += 1
            nw[tuple(o)] = nw.get(tuple(o), 0) + c
        words = nw
    added = []
    for name in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        added.append({"id": len(vocab) + len(added), "content": name, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(vocab)} vocab + {len(added)} added = {len(vocab) + len(added)} ids")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else __file__.rsplit("/", 1)[0] + "/tiny_tokenizer.json")
