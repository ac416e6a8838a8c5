"""Writes input.txt and expected/ for the upgrade example, independently of Weir.

input.txt: 2400 deterministic lines of words from a small vocabulary (so counts grow large).
expected/counts.txt: for a word seen n times, the lines `w 1` ... `w n`, sorted — what the
counter emits whatever version counted which record, and however the job was stopped,
rescaled and upgraded along the way (exactly once).
"""
import collections, pathlib

here = pathlib.Path(__file__).parent
vocab = ("weir river barrier state snapshot stream operator upgrade savepoint rescale "
         "component schema migrate version barrier align commit restore").split()
x, lines = 12345, []
for i in range(2400):
    words = []
    for _ in range(5):
        x = (x * 1103515245 + 12345) % 2**31
        words.append(vocab[x % len(vocab)])
    lines.append(" ".join(words))
(here / "input.txt").write_text("\n".join(lines) + "\n")
counts = collections.Counter(w for l in lines for w in l.split())
out = sorted(f"{w} {i}" for w, n in counts.items() for i in range(1, n + 1))
(here / "expected").mkdir(exist_ok=True)
(here / "expected" / "counts.txt").write_text("".join(l + "\n" for l in out))
print(f"{len(lines)} lines, {len(counts)} words, {len(out)} output lines")
