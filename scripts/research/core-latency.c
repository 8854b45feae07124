// How long a store on one CPU takes to be seen by a load on another: two threads, pinned to
// CPUs 0 and 1, pass a counter back and forth through two cache lines, each spinning on the
// other's line. Prints the mean one-way time in nanoseconds (half a round trip), measured with
// the time-stamp counter and converted with a 20 ms calibration against CLOCK_MONOTONIC.
//
// On this project's machine (a 2-vCPU KVM guest on AMD EPYC) it prints about 27-75 ns in some
// periods and 225-300 ns (mostly about 270) in others: the host runs the two vCPUs on nearby or on distant cores,
// and every cache line the engine and a guest hand each other costs accordingly. The DMA-data
// rows of the engine bench move with it (see docs/performance.md, and scripts/research/dma-phases.sh).
//
// Not part of the build or of the tests:
//   gcc -O2 -pthread scripts/research/core-latency.c -o /tmp/core-latency && /tmp/core-latency [ROUNDS]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

typedef struct { _Alignas(128) _Atomic uint32_t v; } line_t; /* a 128-byte block each */
static line_t ping, pong;
static uint32_t rounds = 200000;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin to CPU %d (needs 2 CPUs)\n", cpu);
        exit(1);
    }
}

static void *answer(void *unused) {
    (void)unused;
    pin(0);
    for (uint32_t i = 1; i <= rounds; i++) {
        while (atomic_load_explicit(&ping.v, memory_order_acquire) != i) {
        }
        atomic_store_explicit(&pong.v, i, memory_order_release);
    }
    return NULL;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        char *end;
        unsigned long n = strtoul(argv[1], &end, 10);
        if (*argv[1] == '\0' || *end != '\0' || n == 0 || n > UINT32_MAX) {
            fprintf(stderr, "usage: %s [ROUNDS]  (ROUNDS: 1 to %u)\n", argv[0], UINT32_MAX);
            return 2;
        }
        rounds = (uint32_t)n;
    }
    double c0 = now_ns();
    uint64_t t0 = __rdtsc();
    while (now_ns() - c0 < 20e6) {
    }
    double ticks_per_ns = (double)(__rdtsc() - t0) / (now_ns() - c0);

    pthread_t t;
    pthread_create(&t, NULL, answer, NULL);
    pin(1);
    uint64_t start = __rdtsc();
    for (uint32_t i = 1; i <= rounds; i++) {
        atomic_store_explicit(&ping.v, i, memory_order_release);
        while (atomic_load_explicit(&pong.v, memory_order_acquire) != i) {
        }
    }
    uint64_t ticks = __rdtsc() - start;
    pthread_join(t, NULL);
    printf("%.0f\n", (double)ticks / ticks_per_ns / rounds / 2);
    return 0;
}
