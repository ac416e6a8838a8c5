"""Writes the enrich example's inputs and, independently of Weir, its expected output.

orders.csv:    order_id,customer_id,amount   (some malformed, some for unknown customers)
customers.csv: customer_id,name,country
expected/enriched/lines.txt: order_id,customer_id,amount,name,country for every valid order
                             whose customer exists
expected/invalid/lines.txt:  every malformed order line, unchanged
"""
import pathlib, random

here = pathlib.Path(__file__).parent
rng = random.Random(7)
names = ["Ada", "Brunel", "Curie", "Dijkstra", "Euler", "Faraday", "Gauss", "Hopper", "Izumi", "Jansky",
         "Kepler", "Lovelace"]
countries = ["NL", "FR", "DE", "JP", "US", "IN", "BR", "KE"]
customers = {f"c{i:02d}": (names[i], rng.choice(countries)) for i in range(len(names))}
orders = []
for o in range(1, 121):
    cid = f"c{rng.randrange(0, 14):02d}"          # c12, c13 do not exist
    amount = f"{rng.randrange(100, 100000) / 100:.2f}"
    if o % 17 == 0:
        orders.append(f"o{o:04d},{cid},n/a")       # malformed amount
    elif o % 29 == 0:
        orders.append(f"o{o:04d},{cid}")           # missing field
    else:
        orders.append(f"o{o:04d},{cid},{amount}")
(here / "orders.csv").write_text("".join(l + "\n" for l in orders))
(here / "customers.csv").write_text("".join(f"{c},{n},{k}\n" for c, (n, k) in customers.items()))
enriched, invalid = [], []
for l in orders:
    f = l.split(",")
    try:
        ok = len(f) == 3 and float(f[2]) is not None
    except ValueError:
        ok = False
    if not ok:
        invalid.append(l)
    elif f[1] in customers:
        n, k = customers[f[1]]
        enriched.append(f"{l},{n},{k}")
for sub, lines in [("enriched", enriched), ("invalid", invalid)]:
    d = here / "expected" / sub
    d.mkdir(parents=True, exist_ok=True)
    (d / "lines.txt").write_text("".join(x + "\n" for x in sorted(lines)))
print(f"{len(orders)} orders, {len(enriched)} enriched, {len(invalid)} invalid")
