// J1 on Flink, for `examples/bench/flink/run.sh`: record i has key i mod K and value i; hash
// partitioned (keyBy) into a keyed counter (ValueState<Long> on the hashmap backend) that emits
// (key, count) for every record; a discarding sink. The shape of examples/bench/j1.toml.
//
// Usage: J1 N K PARALLELISM CHECKPOINT_MS   (CHECKPOINT_MS 0 = off)
// Prints one line: `flink-j1 p=P checkpoint_ms=C records=N net_seconds=S records_per_s=R
// wall_seconds=W wall_records_per_s=RW`: the rate over the job's net runtime (submission to end,
// as Weir's rate covers an attempt from deployment to end), and over the wall clock of
// `execute` (the mini-cluster's start-up included).

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

public class J1 {
    /** Counts the records of each key and emits (key, count) for each. */
    public static class Counter extends KeyedProcessFunction<Long, Tuple2<Long, Long>, Tuple2<Long, Long>> {
        private transient ValueState<Long> count;

        @Override
        public void open(OpenContext ctx) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(Tuple2<Long, Long> r, Context ctx, Collector<Tuple2<Long, Long>> out)
                throws Exception {
            Long c = count.value();
            long n = (c == null ? 0 : c) + 1;
            count.update(n);
            out.collect(Tuple2.of(r.f0, n));
        }
    }

    public static void main(String[] args) throws Exception {
        long n = Long.parseLong(args[0]);
        long keys = Long.parseLong(args[1]);
        int p = Integer.parseInt(args[2]);
        long checkpointMs = Long.parseLong(args[3]);
        Configuration conf = new Configuration();
        conf.setString("state.backend.type", "hashmap");
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(p);
        if (checkpointMs > 0) {
            env.enableCheckpointing(checkpointMs);
        }
        env.fromSequence(0, n - 1)
                .map(i -> Tuple2.of(i % keys, i))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .keyBy(t -> t.f0)
                .process(new Counter())
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .sinkTo(new DiscardingSink<>());
        long start = System.nanoTime();
        JobExecutionResult res = env.execute("j1");
        double secs = (System.nanoTime() - start) / 1e9;
        double net = res.getNetRuntime() / 1000.0;
        System.out.printf(
                "flink-j1 p=%d checkpoint_ms=%d records=%d net_seconds=%.3f records_per_s=%.0f "
                        + "wall_seconds=%.3f wall_records_per_s=%.0f%n",
                p, checkpointMs, n, net, n / net, secs, n / secs);
    }
}
