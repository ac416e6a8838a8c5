"""Computes expected/ for the wordcount example independently of Weir.

Tokenizer rule (same as examples/wordcount/tokenizer): a word is a maximal run of bytes that
are ASCII letters or digits, an apostrophe, or >= 0x80; ASCII letters are lowercased. For a
word seen n times the counter emits the lines `w 1` ... `w n`.
"""
import collections, pathlib

here = pathlib.Path(__file__).parent
counts = collections.Counter()
for line in (here / "input.txt").read_bytes().splitlines():
    word = bytearray()
    for b in line + b" ":
        if (48 <= b <= 57) or (65 <= b <= 90) or (97 <= b <= 122) or b >= 0x80 or b == 39:
            word.append(b + 32 if 65 <= b <= 90 else b)
        elif word:
            counts[bytes(word)] += 1
            word = bytearray()
lines = sorted(w + b" " + str(i).encode() for w, n in counts.items() for i in range(1, n + 1))
(here / "expected").mkdir(exist_ok=True)
(here / "expected" / "counts.txt").write_bytes(b"".join(l + b"\n" for l in lines))
print(f"{len(counts)} words, {len(lines)} lines")
