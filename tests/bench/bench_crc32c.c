/* bench_crc32c.c: CRC-32C throughput of the hardware and table paths, in
 * GB/s, on buffers of a few sizes. Not a test: prints figures only.
 *
 *   build/tests/bench/bench_crc32c [SECONDS_PER_CASE]   (default 0.5; best of many short runs) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "clock.h"

/* Best rate (GB/s) over many short repetitions of about 4 MiB each, run for
 * secs in all: on a shared machine the best one is the least disturbed. */
static double bench(uint32_t (*fn)(uint32_t, const void *, size_t), const unsigned char *buf,
                    size_t len, double secs, uint32_t *sink) {
    size_t calls = (4u << 20) / len;
    if (calls < 4) calls = 4;
    double best = 0, start = clock_now_s();
    uint32_t c = 0;
    do {
        double t0 = clock_now_s();
        for (size_t i = 0; i < calls; i++) c = fn(c, buf, len);
        double gbs = (double)calls * len / (clock_now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    } while (clock_now_s() - start < secs);
    *sink ^= c;
    return best;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    if (secs <= 0) secs = 0.5;
    size_t sizes[] = { 64, 4096, 1 << 20, 16 << 20 };
    unsigned char *buf = malloc(16 << 20);
    if (!buf) { fprintf(stderr, "bench_crc32c: out of memory\n"); return 1; }
    for (size_t i = 0; i < (16u << 20); i++) buf[i] = (unsigned char)(i * 2654435761u >> 24);
    uint32_t sink = 0;
    bool hw = crc32c_hw_available();
    printf("crc32c: default path %s\n", crc32c_impl());
    printf("%-10s %12s %12s\n", "size", "sse4.2 GB/s", "table GB/s");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        double g_sw = bench(crc32c_sw, buf, sizes[i], secs, &sink);
        if (hw) {
            double g_hw = bench(crc32c_hw, buf, sizes[i], secs, &sink);
            printf("%-10zu %12.2f %12.2f\n", sizes[i], g_hw, g_sw);
        } else {
            printf("%-10zu %12s %12.2f\n", sizes[i], "n/a", g_sw);
        }
    }
    fprintf(stderr, "(checksum sink 0x%08X)\n", sink);
    free(buf);
    return 0;
}
