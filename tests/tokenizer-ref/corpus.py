#!/usr/bin/env python3
"""tests/tokenizer-ref/corpus.py: build the tokenizer test corpus from files
every Debian system has, plus the committed multilingual sample and seeded
random documents.

    corpus.py OUTDIR SEED [MIN_BYTES]

Writes OUTDIR/valid.docs (documents of valid UTF-8: the equality test feeds
them to both tokenizers), OUTDIR/invalid.docs (the same kind of text with
invalid UTF-8 spliced in: round-trip only, since the reference reads text as
a JavaScript string and cannot see invalid bytes) and a .names file beside
each (one line per document: where it came from). A .docs file is a
sequence of documents, each a little-endian uint32 byte length and the
bytes. Prints the byte counts.
"""
import glob, gzip, os, random, struct, sys, unicodedata

out, seed = sys.argv[1], int(sys.argv[2])
min_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 1_050_000
rng = random.Random(seed)
here = os.path.dirname(os.path.abspath(__file__))
MAX_DOC = 4096


def read(path):
    """The file's text cut into documents of at most MAX_DOC bytes at line ends
    (long single words make the reference's BPE slow, not ours)."""
    try:
        raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    except OSError:
        return []
    if b"\0" in raw[:4096]:
        return []  # binary
    docs = []
    while raw:
        cut = len(raw) if len(raw) <= MAX_DOC else raw.rfind(b"\n", 0, MAX_DOC) + 1 or MAX_DOC
        docs.append(raw[:cut].decode("utf-8", "replace"))
        raw = raw[cut:]
    return docs


def pool(patterns):
    files = sorted(set(f for p in patterns for f in glob.glob(p, recursive=True) if os.path.isfile(f)))
    rng.shuffle(files)
    return files


valid, names = [], []


def add(text, name):
    valid.append(text)
    names.append(name)


# real text: licenses, package documentation, source code of several languages
share = (min_bytes - 150_000) / 900_000
sources = [
    (["/usr/share/common-licenses/*"], 250_000),
    (["/usr/share/doc/*/copyright"], 200_000),
    (["/usr/share/doc/*/changelog.Debian.gz", "/usr/share/doc/*/README*", "/usr/share/doc/*/NEWS*"], 150_000),
    (["/usr/include/*.h", "/usr/include/*/*.h"], 100_000),
    (["/usr/lib/python3/dist-packages/*/*.py", "/usr/lib/python3.*/*.py"], 100_000),
    (["/usr/share/perl/*/*.pm", "/usr/share/perl5/*/*.pm", "/usr/bin/*"], 100_000),
]
real = 0
for patterns, budget in sources:
    got = 0
    for f in pool(patterns):
        for i, t in enumerate(read(f)):
            if got >= budget * share:
                break
            add(t, f"{f} (part {i + 1})")
            got += len(t.encode())
        if got >= budget * share:
            break
    real += got
ml = open(os.path.join(here, "multilingual.txt"), encoding="utf-8").read()
add(ml, "tests/tokenizer-ref/multilingual.txt")
# the same sample decomposed (NFD) and compatibility-decomposed (NFKD): what
# a Unicode normalizer (Qwen2's NFC) has to compose back
add(unicodedata.normalize("NFD", ml), "tests/tokenizer-ref/multilingual.txt in NFD")
add(unicodedata.normalize("NFKD", ml), "tests/tokenizer-ref/multilingual.txt in NFKD")

# seeded random documents: whitespace runs, special-token strings, numbers,
# contractions, characters of many scripts, splices of the real text
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", "\x0b", "\x0c", " \n ", "\t\t "]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_7|>", "<|eot_id|", "<|eot",
           "<s>", "</s>", "<unk>", "<s", "< s>", "<0x41>"]
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f),
          (0xe00, 0xe7f), (0x1100, 0x11ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x300, 0x36f),
          (0x2000, 0x206f), (0x2190, 0x22ff), (0x1f300, 0x1f64f), (0x1f900, 0x1f9ff), (0xff00, 0xffef), (0x10000, 0x1007f)]
words = " ".join(valid[: len(valid) // 2]).split()


def rand_char():
    lo, hi = rng.choice(RANGES)
    c = rng.randint(lo, hi)
    return chr(c) if not 0xd800 <= c <= 0xdfff else "x"


def rand_doc():
    parts = []
    for _ in range(rng.randint(20, 120)):
        k = rng.random()
        if k < 0.3:
            parts.append(rng.choice(words))
        elif k < 0.45:
            parts.append(rng.choice(SPACES) * rng.randint(1, 6))
        elif k < 0.55:
            parts.append("".join(rand_char() for _ in range(rng.randint(1, 12))))
        elif k < 0.62:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 20))))
        elif k < 0.68:
            parts.append(rng.choice(["'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'M", "'t", "n't", "’s"]))
        elif k < 0.74:
            parts.append(rng.choice(SPECIAL))
        elif k < 0.8:
            parts.append(rng.choice("!?.,;:-_=+*/\\|()[]{}<>\"'`~@#$%^&") * rng.randint(1, 5))
        else:
            src = rng.choice(valid)
            a = rng.randrange(len(src))
            parts.append(src[a : a + rng.randint(1, 300)])
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


synth = 0
while real + synth < min_bytes or synth < 150_000:
    d = rand_doc()
    add(d, f"random document (seed {seed}, #{len(valid)})")
    synth += len(d.encode())

# invalid UTF-8: the same kind of text with bad bytes spliced in
BAD = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82",
       b"\xf0\x9f\x98", b"\xc3", b"\xf4\x90\x80\x80", b"\x80\x80\x80"]
invalid, inv_names = [], []
for i in range(200):
    src = rng.choice(valid).encode()
    a = rng.randrange(len(src))
    piece = bytearray(src[a : a + rng.randint(50, 4000)])
    for _ in range(rng.randint(1, 12)):
        p = rng.randrange(len(piece) + 1)
        piece[p:p] = rng.choice(BAD)
    invalid.append(bytes(piece))
    inv_names.append(f"invalid UTF-8 document (seed {seed}, #{i})")


def write(path, docs, nm):
    with open(path, "wb") as f:
        for d in docs:
            b = d if isinstance(d, bytes) else d.encode("utf-8")
            f.write(struct.pack("<I", len(b)) + b)
    with open(path[:-5] + ".names", "w") as f:
        f.write("\n".join(n.replace("\n", " ") for n in nm) + "\n")


os.makedirs(out, exist_ok=True)
write(os.path.join(out, "valid.docs"), valid, names)
write(os.path.join(out, "invalid.docs"), invalid, inv_names)
print(f"corpus: seed {seed}: {len(valid)} documents, {real} bytes of Debian text, {synth} bytes random; "
      f"{len(invalid)} invalid-UTF-8 documents, {sum(map(len, invalid))} bytes")
