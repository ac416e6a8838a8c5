"""Weir operators in Python (componentize-py): the same WIT contract, record framing and keyed
state layout as the Rust SDK (see wit/operator.wit), so state written by an operator in one
language restores into the same schema in another.

    import weir

    class WitWorld(weir.Operator):          # componentize-py instantiates `WitWorld`
        NAME, VERSION, SCHEMA_VERSION = "wordcount-counter", "1.0.0-py", 1
        STATES = [("count", weir.u64)]       # keyed value states and their codecs

        def on_record(self, ctx, rec):
            n = ctx.update("count", lambda c: (c or 0) + 1)
            ctx.emit(rec.key, rec.key + b" " + str(n).encode())

Keyed state lives in the guest, one dict per key group per state; `snapshot` serializes the
key groups, `restore` reads them back (calling `migrate(state, from_schema, data)` for older
schemas). Values use bincode-1 codecs (`u64`, `i64`, `string`, `bytes_`, `struct(...)`,
`list_(...)`). Output is buffered and handed to the host once per call. An exception fails the
call (the host restarts the job from its last checkpoint).

Event time: `on_timer_due(ctx, domain, timer)` gets the key's timers
(`ctx.register_event_timer`), `ctx.watermark()` is the last watermark, and `weir.tumbling(ctx,
state, ...)` keeps tumbling windows with an accumulator per window in one keyed state (codec
`weir.windows(acc)`), laid out as the Rust SDK's `Windows<A>`.
"""

import struct as _struct
from bisect import bisect_left as _bisect_left
from operator import itemgetter as _itemgetter
from types import SimpleNamespace as _Ns

import wit_world
from componentize_py_types import Err
from wit_world.imports import collector, context, timers, types

TimeDomain = types.TimeDomain
EVENT_TIME = types.TimeDomain.EVENT_TIME
PROCESSING_TIME = types.TimeDomain.PROCESSING_TIME

# ---- bincode 1 codecs ---------------------------------------------------------------------


class Codec:
    """Encodes a value to bytes and decodes it from a memoryview at an offset."""

    def __init__(self, write, read):
        self.write, self.read = write, read

    def encode(self, v):
        out = bytearray()
        self.write(out, v)
        return bytes(out)

    def decode(self, b):
        v, pos = self.read(memoryview(b), 0)
        if pos != len(b):
            raise ValueError("corrupt state value: trailing bytes")
        return v


def _read_u64(b, pos):
    return _struct.unpack_from("<Q", b, pos)[0], pos + 8


u64 = Codec(lambda out, v: out.extend(_struct.pack("<Q", v)), _read_u64)
i64 = Codec(lambda out, v: out.extend(_struct.pack("<q", v)), lambda b, p: (_struct.unpack_from("<q", b, p)[0], p + 8))


def _read_bytes(b, pos):
    n, pos = _read_u64(b, pos)
    if pos + n > len(b):
        raise ValueError("corrupt state value: truncated")
    return bytes(b[pos : pos + n]), pos + n


bytes_ = Codec(lambda out, v: (out.extend(_struct.pack("<Q", len(v))), out.extend(v)), _read_bytes)
string = Codec(
    lambda out, v: bytes_.write(out, v.encode()),
    lambda b, p: (lambda r: (r[0].decode(), r[1]))(_read_bytes(b, p)),
)


def struct(*fields):
    """A Rust struct or tuple: its fields in order; values are tuples."""

    def write(out, v):
        for f, x in zip(fields, v):
            f.write(out, x)

    def read(b, pos):
        vals = []
        for f in fields:
            x, pos = f.read(b, pos)
            vals.append(x)
        return tuple(vals), pos

    return Codec(write, read)


def list_(codec):
    """A Rust `Vec` of `codec` values (u64 length + elements); values are lists."""

    def write(out, v):
        out.extend(_struct.pack("<Q", len(v)))
        for x in v:
            codec.write(out, x)

    def read(b, pos):
        n, pos = _read_u64(b, pos)
        vals = []
        for _ in range(n):
            x, pos = codec.read(b, pos)
            vals.append(x)
        return vals, pos

    return Codec(write, read)


def windows(acc):
    """The codec of a windows state (see `tumbling`): a key's open windows, sorted, each a list
    `[start, end, acc]`; the Rust SDK's `Vec<(Window, A)>`."""

    def write(out, v):
        out.extend(_struct.pack("<Q", len(v)))
        for start, end, a in v:
            out.extend(_struct.pack("<qq", start, end))
            acc.write(out, a)

    def read(b, pos):
        n, pos = _read_u64(b, pos)
        vals = []
        for _ in range(n):
            start, end = _struct.unpack_from("<qq", b, pos)
            a, pos = acc.read(b, pos + 16)
            vals.append([start, end, a])
        return vals, pos

    codec = Codec(write, read)
    codec.acc = acc
    return codec


# ---- records and context ------------------------------------------------------------------


class Record:
    __slots__ = ("key_group", "timestamp", "key", "value")

    def __init__(self, key_group, timestamp, key, value):
        self.key_group, self.timestamp, self.key, self.value = key_group, timestamp, key, value


class Context:
    """What an operator uses while processing: its current record's keyed state, emit."""

    def __init__(self, op):
        self._op = op
        self.record = None

    def task(self):
        return _G.task

    def _table(self, state):
        i = _G.index.get(state)
        if i is None:
            raise KeyError(f"state `{state}` is not declared")
        g = self.record.key_group - _G.task.key_group_start
        if not 0 <= g < len(_G.tables[i]):
            raise ValueError(f"key group {self.record.key_group} is not this subtask's")
        return _G.tables[i][g]

    def get(self, state):
        """The value of `state` for the current record's key (None if none)."""
        return self._table(state).get(self.record.key)

    def set(self, state, v):
        self._table(state)[self.record.key] = v

    def update(self, state, f):
        """Replaces the value with `f(old)` and returns it."""
        t = self._table(state)
        v = f(t.get(self.record.key))
        t[self.record.key] = v
        return v

    def remove(self, state):
        """Removes the value of `state` for the current record's key (if any)."""
        self._table(state).pop(self.record.key, None)

    def emit(self, key, value, port=0):
        """Emits `(key, value)` (bytes) on the main output (port 0) or side output `port`."""
        self.emit_at(key, value, self.record.timestamp if self.record else 0, port)

    def emit_at(self, key, value, timestamp, port=0):
        """Emits `(key, value)` with event time `timestamp` (ms)."""
        out = _G.out
        out += _HEAD.pack(port, timestamp, len(key), len(value))
        out += key
        out += value

    def register_event_timer(self, time):
        """Asks for `on_timer_due` for the current key when the watermark reaches `time` (once
        per time)."""
        r = self._keyed()
        timers.register(EVENT_TIME, r.key_group, r.key, time)

    def delete_event_timer(self, time):
        """Cancels it (unknown timers are ignored)."""
        r = self._keyed()
        timers.delete(EVENT_TIME, r.key_group, r.key, time)

    def watermark(self):
        """The watermark of the last on-watermark call (i64 minimum before the first; an instance
        opened by a live upgrade starts from the running one)."""
        return _G.watermark

    def _keyed(self):
        if self.record is None:
            raise ValueError("keyed state and timers need a key: use them in on_record or on_timer_due")
        return self.record


_HEAD = _struct.Struct("<IqII")

# componentize-py creates the `WitWorld` object anew for every export call, so what must live
# from call to call (task, keyed state, output buffer) lives here, once per instance.
_G = _Ns(task=None, index={}, tables=[], out=bytearray(), ctx=None, watermark=-(2**63), operator=None)


class Operator(wit_world.WitWorld):
    """Base class of a Python operator; subclass it as `WitWorld` in your module.

    Class attributes: NAME, VERSION, SCHEMA_VERSION (default 1), MIGRATES_FROM (older
    schemas), STATES (list of (name, codec): keyed value states), SIDE_OUTPUTS. Methods:
    `on_open(ctx, config)`, `on_record(ctx, rec)`, `on_timer_due(ctx, domain, timer)`,
    `on_close(ctx)`, `migrate(state, from_schema, data) -> bytes`. componentize-py makes a new
    object for every call: keep state in the declared STATES (or module globals), not on `self`.
    """

    NAME = "python-operator"
    VERSION = "0.0.0"
    SCHEMA_VERSION = 1
    MIGRATES_FROM = []
    STATES = []
    SIDE_OUTPUTS = []

    def on_open(self, ctx, config):
        pass

    def on_record(self, ctx, rec):
        raise NotImplementedError

    def on_timer_due(self, ctx, domain, timer):
        """A timer of `timer.key` came due at `timer.timestamp` (`domain`: weir.EVENT_TIME)."""

    def on_close(self, ctx):
        pass

    def migrate(self, state, from_schema, data):
        raise ValueError(f"`{self.NAME}` {self.VERSION} does not migrate state `{state}` from schema {from_schema}")

    # ---- the exports ----

    def describe(self):
        return types.OperatorInfo(
            name=self.NAME,
            version=self.VERSION,
            state_schema_version=self.SCHEMA_VERSION,
            migrates_from=list(self.MIGRATES_FROM),
            states=[
                types.StateDescriptor(name=n, kind=types.StateKind.VALUE, keyed=True, redistribution=types.Redistribution.NONE)
                for n, _ in self.STATES
            ],
            side_outputs=list(self.SIDE_OUTPUTS),
        )

    def _guard(self, f, *args):
        try:
            return f(*args)
        except Err:
            raise
        except Exception as e:  # an operator bug fails the call, naming it
            raise Err(f"{type(e).__name__}: {e}")

    def setup(self, config):
        def run():
            _G.task = context.task()
            n = _G.task.key_group_end - _G.task.key_group_start
            _G.index = {name: i for i, (name, _) in enumerate(self.STATES)}
            _G.tables = [[{} for _ in range(n)] for _ in self.STATES]
            _G.out = bytearray()
            # A live upgrade's new instance opens mid-stream: the running watermark.
            _G.watermark = context.current_watermark()
            _G.operator = self
            _G.ctx = Context(self)
            self.on_open(_G.ctx, dict(config))

        self._guard(run)

    def _flush(self):
        if _G.out:
            collector.emit_batch(bytes(_G.out))
            _G.out = bytearray()

    def process(self, batch):
        def run():
            b = memoryview(batch)
            pos, end = 0, len(batch)
            ctx = _G.ctx
            i = 0
            while pos < end:
                tag, ts, klen, vlen = _HEAD.unpack_from(b, pos)
                k0 = pos + 20
                ctx.record = Record(tag, ts, bytes(b[k0 : k0 + klen]), bytes(b[k0 + klen : k0 + klen + vlen]))
                pos = k0 + klen + vlen
                try:
                    self.on_record(ctx, ctx.record)
                except Exception as e:  # names the record (the host shows its key and origin)
                    ctx.record = None
                    self._flush()
                    raise Err(f"record {i}: {type(e).__name__}: {e}")
                i += 1
            ctx.record = None
            self._flush()

        self._guard(run)

    def on_timer(self, domain, timers):
        def run():
            b = memoryview(timers)
            pos, end = 0, len(timers)
            ctx = _G.ctx
            try:
                while pos < end:
                    tag, ts, klen, vlen = _HEAD.unpack_from(b, pos)
                    k0 = pos + 20
                    ctx.record = Record(tag, ts, bytes(b[k0 : k0 + klen]), b"")
                    pos = k0 + klen + vlen
                    self.on_timer_due(ctx, domain, ctx.record)
            finally:
                ctx.record = None
                self._flush()

        self._guard(run)

    def on_watermark(self, watermark):
        _G.watermark = watermark

    def snapshot(self, checkpoint_id, mode):
        def run():
            keyed = []
            start = _G.task.key_group_start
            for g in range(_G.task.key_group_end - start):
                if all(not t[g] for t in _G.tables):
                    continue
                out = bytearray(_struct.pack("<I", len(self.STATES)))
                for (name, codec), t in zip(self.STATES, _G.tables):
                    nb = name.encode()
                    out += _struct.pack("<I", len(nb)) + nb + _struct.pack("<I", len(t[g]))
                    for k, v in t[g].items():
                        vb = codec.encode(v)
                        out += _struct.pack("<I", len(k)) + k + _struct.pack("<I", len(vb)) + vb
                keyed.append(types.KeyGroupState(key_group=start + g, data=bytes(out)))
            return types.OperatorSnapshot(keyed=keyed, operator_state=b"")

        return self._guard(run)

    def restore(self, schema_version, state):
        def run():
            own = self.SCHEMA_VERSION
            if schema_version != own and schema_version not in self.MIGRATES_FROM:
                raise Err(
                    f"`{self.NAME}` {self.VERSION} writes state schema {own} and migrates from "
                    f"{list(self.MIGRATES_FROM)}; it cannot restore state of schema {schema_version}"
                )
            start = _G.task.key_group_start
            for kg in state.keyed:
                data = memoryview(kg.data)
                if not len(data):
                    continue
                g = kg.key_group - start
                pos = 0

                def u32():
                    nonlocal pos
                    v = _struct.unpack_from("<I", data, pos)[0]
                    pos += 4
                    return v

                def chunk():
                    nonlocal pos
                    n = u32()
                    if pos + n > len(data):
                        raise ValueError("corrupt state blob: truncated")
                    v = bytes(data[pos : pos + n])
                    pos += n
                    return v

                for _ in range(u32()):
                    name = chunk().decode()
                    i = _G.index.get(name)
                    if i is None:
                        raise ValueError(f"the snapshot holds keyed state `{name}`, which `{self.NAME}` does not declare")
                    codec = self.STATES[i][1]
                    for _ in range(u32()):
                        k, vb = chunk(), chunk()
                        if schema_version != own:
                            vb = self.migrate(name, schema_version, vb)
                        _G.tables[i][g][k] = codec.decode(vb)
            if state.operator_state:
                raise ValueError("the Python SDK keeps no per-subtask state")

        self._guard(run)

    def finish(self):
        def run():
            self.on_close(_G.ctx)
            self._flush()

        self._guard(run)


# ---- tumbling windows ---------------------------------------------------------------------
#
# The per-key rules of the Rust SDK's `window::book`, on a key's list of `[start, end, acc]`:
# a window takes records until the watermark reaches its cleanup time, `end - 1 + lateness`;
# it has a timer at `end - 1` (unless the watermark is already there: then each record fires
# it at once) and one at its cleanup time, when it is removed.

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_START = _itemgetter(0)  # a window's start, in a key's list of [start, end, acc]


def _saturate(v):
    return _I64_MIN if v < _I64_MIN else _I64_MAX if v > _I64_MAX else v


class Window:
    """One window, `[start, end)` in ms; complete when the watermark reaches `max_timestamp`."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        self.start, self.end = start, end

    @property
    def max_timestamp(self):
        return self.end - 1

    def __repr__(self):
        return f"Window({self.start}, {self.end})"


class Windows:
    """Tumbling windows of one keyed state; made by `tumbling`. Call `add` from `on_record` and
    `on_timer` from `on_timer_due`. The callbacks must not touch the windows' state."""

    def __init__(self, state, size, offset, lateness, late_port, initial, add, fire):
        self.state, self.size, self.offset, self.lateness = state, size, offset, lateness
        self.late_port, self.add_fn, self.fire = late_port, add, fire
        self.acc = _G.operator.STATES[_G.index[state]][1].acc
        # Every new window starts from its own copy of `initial` (an `add` may change it).
        self.initial = self.acc.encode(initial)

    def add(self, ctx, rec):
        """Adds `rec` (of the current key) to its window; False when it was late."""
        ts = rec.timestamp
        start = ts - (ts - self.offset) % self.size  # Python's % is Euclidean for size > 0
        end = _saturate(start + self.size)
        cleanup = _saturate(end - 1 + self.lateness)
        wm = _G.watermark
        if cleanup <= wm:
            if self.late_port:
                ctx.emit(rec.key, rec.value, self.late_port)
            return False
        table = ctx._table(self.state)
        had = table.get(rec.key)
        open_ = had if had is not None else []
        i = _bisect_left(open_, start, key=_START)
        found = i < len(open_) and open_[i][0] == start
        acc = self.add_fn(open_[i][2] if found else self.acc.decode(self.initial), rec)
        if found:
            open_[i][2] = acc
        else:
            open_.insert(i, [start, end, acc])
            if had is None:
                table[rec.key] = open_
            if end - 1 > wm:
                ctx.register_event_timer(end - 1)
            if cleanup != end - 1:
                ctx.register_event_timer(cleanup)
        # Past its end, within lateness: the record changed a fired window; fire it again.
        if end - 1 <= wm:
            self.fire(ctx, Window(start, end), acc)
        return True

    def on_timer(self, ctx, domain):
        """Fires the current key's windows ending at the timer and removes those past their
        lateness; processing-time timers are not the windows': ignored."""
        if domain != EVENT_TIME:
            return
        table = ctx._table(self.state)
        key = ctx.record.key
        open_ = table.get(key)
        if open_ is None:
            return
        time = ctx.record.timestamp
        for start, end, acc in open_:
            if end - 1 == time:
                self.fire(ctx, Window(start, end), acc)
        kept = [w for w in open_ if _saturate(w[1] - 1 + self.lateness) > time]
        if not kept:
            del table[key]
        elif len(kept) != len(open_):
            table[key] = kept


def tumbling(ctx, state, size_ms, offset_ms=0, lateness_ms=0, late_output=None, *, initial, add, fire):
    """Tumbling event-time windows (call in `on_open`): `size_ms` long, starting at multiples
    of the size plus `offset_ms` (negative timestamps too), kept with an accumulator each in
    the keyed state `state` (declared with codec `weir.windows(acc_codec)`).

    `lateness_ms`: how long after its end a window still takes records (each fires it again);
    `late_output`: a declared side output for late records (else they are dropped);
    `initial`: a new window's accumulator; `add(acc, rec) -> acc`; `fire(ctx, window, acc)`
    (`window.start`, `.end`, `.max_timestamp`; `ctx.record.key` is its key). A key's state is
    removed once the watermark has passed all its windows plus lateness.
    """
    size, offset, lateness = int(size_ms), int(offset_ms), int(lateness_ms)
    if size <= 0:
        raise ValueError(f"a tumbling window's size must be positive, not {size} ms")
    if abs(offset) >= size:
        raise ValueError(f"a tumbling window's offset ({offset} ms) must be smaller than its size ({size} ms)")
    if lateness < 0:
        raise ValueError(f"allowed lateness must be 0 or more, not {lateness} ms")
    op = _G.operator
    if state not in _G.index:
        raise ValueError(f"state `{state}` is not declared in `{op.NAME}`'s STATES")
    if not hasattr(op.STATES[_G.index[state]][1], "acc"):
        raise ValueError(f"windows `{state}`: declare the state with codec weir.windows(acc_codec)")
    late_port = 0
    if late_output is not None:
        if late_output not in op.SIDE_OUTPUTS:
            raise ValueError(
                f"late records go to side output `{late_output}`, which `{op.NAME}` does not declare in SIDE_OUTPUTS"
            )
        late_port = list(op.SIDE_OUTPUTS).index(late_output) + 1
    return Windows(state, size, offset, lateness, late_port, initial, add, fire)
