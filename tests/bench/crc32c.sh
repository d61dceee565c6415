#!/usr/bin/env bash
# crc32c: hardware (SSE4.2) path vs the table path, same buffers, same run.
set -eu
"${BUILD:-build}/tests/bench/bench_crc32c"
