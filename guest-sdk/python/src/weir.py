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
schemas). Values use bincode-1 codecs (`u64`, `i64`, `string`, `bytes`, `struct(...)`).
Output is buffered and handed to the host once per call. An exception fails the call (the
host restarts the job from its last checkpoint).
"""

import struct as _struct
from types import SimpleNamespace as _Ns

import wit_world
from componentize_py_types import Err
from wit_world.imports import collector, context, types

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

    def emit(self, key, value, port=0):
        """Emits `(key, value)` (bytes) on the main output (port 0) or side output `port`."""
        ts = self.record.timestamp if self.record else 0
        out = _G.out
        out += _struct.pack("<IqII", port, ts, len(key), len(value))
        out += key
        out += value


_HEAD = _struct.Struct("<IqII")

# componentize-py creates the `WitWorld` object anew for every export call, so what must live
# from call to call (task, keyed state, output buffer) lives here, once per instance.
_G = _Ns(task=None, index={}, tables=[], out=bytearray(), ctx=None)


class Operator(wit_world.WitWorld):
    """Base class of a Python operator; subclass it as `WitWorld` in your module.

    Class attributes: NAME, VERSION, SCHEMA_VERSION (default 1), MIGRATES_FROM (older
    schemas), STATES (list of (name, codec): keyed value states), SIDE_OUTPUTS. Methods:
    `on_open(ctx, config)`, `on_record(ctx, rec)`, `on_close(ctx)`,
    `migrate(state, from_schema, data) -> bytes`. componentize-py makes a new object for every
    call: keep state in the declared STATES (or module globals), not on `self`.
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
        pass

    def on_watermark(self, watermark):
        pass

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
