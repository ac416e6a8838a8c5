"""Writes the iterate example's graph and, independently of Weir, its expected output.

edges.txt: undirected edges `u v` of a random sparse graph (several components);
expected/labels.txt: `<vertex> <smallest vertex id in its component>` for every vertex
that appears in an edge (union-find).
"""
import pathlib, random

here = pathlib.Path(__file__).parent
rng = random.Random(11)
n = 400
edges = set()
while len(edges) < 330:
    u, v = rng.randrange(n), rng.randrange(n)
    if u != v:
        edges.add((min(u, v), max(u, v)))
edges = sorted(edges)
rng.shuffle(edges)
(here / "edges.txt").write_text("".join(f"{u} {v}\n" for u, v in edges))
parent = {}
def find(x):
    parent.setdefault(x, x)
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x
for u, v in edges:
    a, b = find(u), find(v)
    if a != b:
        parent[max(a, b)] = min(a, b)
verts = sorted({x for e in edges for x in e})
comp = {}
for x in verts:
    comp.setdefault(find(x), []).append(x)
label = {x: min(c) for c in comp.values() for x in c}
(here / "expected").mkdir(exist_ok=True)
(here / "expected" / "labels.txt").write_text("".join(sorted(f"{x} {label[x]}\n" for x in verts)))
print(f"{len(edges)} edges, {len(verts)} vertices, {len(comp)} components")
