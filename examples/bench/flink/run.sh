#!/usr/bin/env bash
# J1 on Apache Flink 2.3 next to Weir, on this machine (the comparison #15 asks for).
#
#   bash examples/bench/flink/run.sh [ROUNDS]     (default 3; needs Java 17 and pip)
#
# Flink's jars come from the PyPI wheel `apache-flink-libraries` (cached in
# ~/.cache/weir/flink-2.3.0); J1.java is compiled against them and runs on Flink's local
# mini-cluster (hashmap state backend). Each round runs Weir's `weir bench j1 --runs 1` and then
# Flink's J1 at p = 1 and 2 with checkpoints off, every 1 s and every 100 ms, N = 20 M, K = 10 000.
# Flink's rate is N over the job's net runtime (submission to end, as Weir's covers the attempt
# from deployment to end; the JVM and mini-cluster start-up are left out); its wall-clock rate is
# printed too.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS="${1:-3}"
N=20000000
K=10000
CACHE="${HOME}/.cache/weir/flink-2.3.0"
command -v javac >/dev/null || { echo "needs a JDK 17 (apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
if [ ! -d "$CACHE/pyflink/lib" ]; then
    mkdir -p "$CACHE"
    python3 -m pip download --no-deps -q -d "$CACHE" apache-flink-libraries==2.3.0
    (cd "$CACHE" && python3 -m zipfile -e apache_flink_libraries-2.3.0-*.whl .)
fi
CP=$(ls "$CACHE"/pyflink/lib/*.jar | tr '\n' ':')
mkdir -p "$CACHE/classes"
javac -cp "$CP" -d "$CACHE/classes" examples/bench/flink/J1.java
bash examples/bench/run.sh --help >/dev/null # builds weir and the guests
for round in $(seq 1 "$ROUNDS"); do
    echo "# round $round"
    target/release/weir bench j1 --runs 1 | grep '^| [12] '
    for p in 1 2; do
        for c in 0 1000 100; do
            java -cp "$CACHE/classes:$CP" J1 "$N" "$K" "$p" "$c" 2>/dev/null | grep '^flink-j1'
        done
    done
done
