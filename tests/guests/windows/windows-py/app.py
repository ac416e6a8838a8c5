"""The windows under test (tests/guests/windows) in Python, tumbling only: the input is file
lines `key,timestamp,value`; config `size_ms`, `offset_ms`, `lateness_ms` and `aggregate`
(`count`, or `sum` of the values). Each firing emits `<key> <start> <end> <result>` at the
window's last millisecond; late records go to the `late` side output as they came.
tests/all/lang_windows.rs checks it against the same reference as the Rust operator.

Build: bash guest-sdk/python/build.sh tests/guests/windows/windows-py/app.py target/python/windows_py.wasm
"""

import weir

# componentize-py makes a new WitWorld per call: what lives from call to call is module-level.
WINDOWS = None
SUM = False  # aggregate = sum (else count)


def value(rec):
    """The third column of `key,timestamp,value`, as an integer."""
    parts = rec.value.decode().split(",")
    return int(parts[2].strip() if len(parts) > 2 else "")


def add(acc, rec):
    count, total = acc
    return (count + 1, total + (value(rec) if SUM else 0))


def fire(ctx, w, acc):
    count, total = acc
    key = ctx.record.key
    line = key + f" {w.start} {w.end} {total if SUM else count}".encode()
    ctx.emit_at(key, line, w.max_timestamp)


class WitWorld(weir.Operator):
    NAME, VERSION, SCHEMA_VERSION = "test-windows", "1.0.0-py", 1
    # Per window (count, sum): the Rust SDK's `Vec<(Window, (u64, i64))>`.
    STATES = [("windows", weir.windows(weir.struct(weir.u64, weir.i64)))]
    SIDE_OUTPUTS = ["late"]

    def on_open(self, ctx, config):
        global WINDOWS, SUM
        if config.get("kind", "tumbling") != "tumbling":
            raise ValueError("the Python windows under test are tumbling only: use kind = `tumbling`")
        aggregate = config.get("aggregate", "count")
        if aggregate not in ("count", "sum"):
            raise ValueError(f"aggregate = `{aggregate}`: use count or sum")
        SUM = aggregate == "sum"
        WINDOWS = weir.tumbling(
            ctx,
            "windows",
            size_ms=config.get("size_ms", 10),
            offset_ms=config.get("offset_ms", 0),
            lateness_ms=config.get("lateness_ms", 0),
            late_output="late",
            initial=(0, 0),
            add=add,
            fire=fire,
        )

    def on_record(self, ctx, rec):
        WINDOWS.add(ctx, rec)

    def on_timer_due(self, ctx, domain, timer):
        WINDOWS.on_timer(ctx, domain)
