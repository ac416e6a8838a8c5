"""{{name}}: a keyed counter. For every record, adds one to the count of the record's key and
emits `<key> <count>`. The count is keyed state: checkpointed, restored after a failure, moved
by key group when the parallelism changes."""

import weir


class WitWorld(weir.Operator):  # componentize-py instantiates the class named WitWorld
    NAME, VERSION, SCHEMA_VERSION = "{{name}}", "0.1.0", 1
    STATES = [("count", weir.u64)]

    def on_record(self, ctx, rec):
        n = ctx.update("count", lambda c: (c or 0) + 1)
        ctx.emit(rec.key, rec.key + b" " + str(n).encode())
