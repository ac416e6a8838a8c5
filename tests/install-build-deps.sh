#!/usr/bin/env bash
# Installs what building Weir needs beyond rustup on a fresh Debian machine: protoc and its
# well-known types (the etcd client compiles etcd's protobuf definitions). Idempotent.
set -euo pipefail
if ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends protobuf-compiler libprotobuf-dev >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends protobuf-compiler libprotobuf-dev >/dev/null; }
fi
