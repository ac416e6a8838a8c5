"""Word counter v2 in Python: the same state schema 2 as the Rust v2 (examples/upgrade/counter-v2):
`count` = (u64 n, i64 first_seen), migrated from schema 1 (a bare u64) with first_seen = i64::MIN."""

import weir

COUNT = weir.struct(weir.u64, weir.i64)


class WitWorld(weir.Operator):
    NAME, VERSION, SCHEMA_VERSION, MIGRATES_FROM = "wordcount-counter", "2.0.0-py", 2, [1]
    STATES = [("count", COUNT)]

    def migrate(self, state, from_schema, data):
        return COUNT.encode((weir.u64.decode(data), -(2**63)))

    def on_record(self, ctx, rec):
        n, first = ctx.update("count", lambda c: (c[0] + 1, c[1]) if c else (1, rec.timestamp))
        ctx.emit(rec.key, rec.key + b" " + str(n).encode())
