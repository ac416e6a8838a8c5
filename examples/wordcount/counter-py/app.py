"""The wordcount counter in Python: counts records per key and emits `<key> <count>` for every
record, exactly like the Rust counter (examples/wordcount/counter), with the same state
(`count`, a keyed u64, schema 1), so savepoints move between the two.

Build: bash guest-sdk/python/build.sh examples/wordcount/counter-py/app.py target/python/wordcount_counter_py.wasm
"""

import weir


class WitWorld(weir.Operator):
    NAME, VERSION, SCHEMA_VERSION = "wordcount-counter", "1.0.0-py", 1
    STATES = [("count", weir.u64)]

    def on_record(self, ctx, rec):
        if rec.value == b"panic":
            raise RuntimeError("counter: failing on request (`panic`)")
        n = ctx.update("count", lambda c: (c or 0) + 1)
        ctx.emit(rec.key, rec.key + b" " + str(n).encode())
