// The DMA-data exchange of `dma/64KiB/engine_vs_memcpy` (backend/benches/engine.rs) stripped to
// its bare bones, to show how close to memcpy the exchange itself can get on a machine, without
// the engine's validation, routing, locks and counters: a "worker" thread on CPU 0 copies 64 KiB
// messages into 4 buffers that a "guest" thread on CPU 1 keeps posted, publishing each copy and
// a completion on cache lines the guest polls, as the engine does. It is timed in alternation
// with a plain memcpy of 64 KiB on the guest's CPU (chunks of 256 messages, 20 samples of 8
// chunks each way), and prints the median of the per-sample ratios, as the bench row does.
//
// Not part of the build or of the tests; a measurement to read next to the bench:
//   gcc -O2 -mavx2 -pthread scripts/research/dma-ceiling.c -o /tmp/dma-ceiling && /tmp/dma-ceiling 5
// (the argument is the number of runs; it needs 2 CPUs and AVX2).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#define LEN (64 * 1024) /* message size */
#define SLOTS 256       /* ring size */
#define POSTED 4        /* buffers the guest keeps posted, as in the bench */
#define CHUNK 256       /* messages (and memcpys) per alternation */

/* One index per cache line, one 64-byte message per slot, as in the channel layout. */
typedef struct { _Alignas(64) _Atomic uint32_t v; } index_t;
typedef struct { _Alignas(64) uint64_t w[8]; } slot_t;

static index_t tx_head, rx_head, post_head, completion_head;
static slot_t tx_ring[SLOTS], rx_ring[SLOTS], post_ring[SLOTS], completion_ring[SLOTS];
static char *source, *buffers, *memcpy_src, *memcpy_dst;
static _Atomic int stop;

/* The engine's copy loop (backend/src/engine/vector_copy.rs). */
static void copy_avx2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const void *)(s + i));
        __m256i b = _mm256_loadu_si256((const void *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const void *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const void *)(s + i + 96));
        _mm256_storeu_si256((void *)(d + i), a);
        _mm256_storeu_si256((void *)(d + i + 32), b);
        _mm256_storeu_si256((void *)(d + i + 64), c);
        _mm256_storeu_si256((void *)(d + i + 96), e);
    }
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* Takes a message, copies into the next posted buffer, publishes it, posts a completion. */
static void *worker(void *unused) {
    (void)unused;
    pin(0);
    uint32_t taken = 0, used = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        if (atomic_load_explicit(&tx_head.v, memory_order_acquire) == taken ||
            atomic_load_explicit(&post_head.v, memory_order_acquire) == used) {
            _mm_pause();
            continue;
        }
        uint64_t buffer = post_ring[used % SLOTS].w[0];
        uint64_t cookie = tx_ring[taken % SLOTS].w[1];
        _mm_prefetch((const char *)&post_ring[(used + 1) % SLOTS], _MM_HINT_T0);
        __builtin_prefetch(&rx_ring[used % SLOTS], 1);
        copy_avx2(buffers + buffer * LEN, source, LEN);
        rx_ring[used % SLOTS].w[0] = buffer;
        used++;
        atomic_store_explicit(&rx_head.v, used, memory_order_release);
        completion_ring[taken % SLOTS].w[0] = cookie;
        taken++;
        atomic_store_explicit(&completion_head.v, taken, memory_order_release);
    }
    return NULL;
}

/* The guest: sends while it has credit, re-posts each filled buffer at once, counts completions. */
static uint32_t sent, credits = POSTED, received, completed;

static uint64_t exchange(uint32_t n) {
    uint32_t until_sent = sent + n, until_received = received + n;
    uint64_t start = __rdtsc();
    while (received != until_received || completed != until_sent) {
        while (credits && sent != until_sent) {
            tx_ring[sent % SLOTS].w[1] = sent;
            sent++;
            atomic_store_explicit(&tx_head.v, sent, memory_order_release);
            credits--;
        }
        uint32_t head = atomic_load_explicit(&rx_head.v, memory_order_acquire);
        while (received != head) {
            uint32_t post = atomic_load_explicit(&post_head.v, memory_order_relaxed);
            post_ring[post % SLOTS].w[0] = rx_ring[received % SLOTS].w[0];
            atomic_store_explicit(&post_head.v, post + 1, memory_order_release);
            received++;
            credits++;
        }
        completed = atomic_load_explicit(&completion_head.v, memory_order_acquire);
    }
    return __rdtsc() - start;
}

static uint64_t plain_memcpy(uint32_t n) {
    uint64_t start = __rdtsc();
    for (uint32_t i = 0; i < n; i++) {
        memcpy(memcpy_dst, memcpy_src, LEN);
        __asm__ volatile("" : : "r"(memcpy_dst) : "memory");
    }
    return __rdtsc() - start;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    if (!__builtin_cpu_supports("avx2")) {
        fprintf(stderr, "needs AVX2\n");
        return 1;
    }
    source = aligned_alloc(4096, LEN);
    buffers = aligned_alloc(4096, POSTED * LEN);
    memcpy_src = aligned_alloc(4096, LEN);
    memcpy_dst = aligned_alloc(4096, LEN);
    if (!source || !buffers || !memcpy_src || !memcpy_dst) return 1;
    memset(source, 0x3c, LEN);
    memset(buffers, 0, POSTED * LEN);
    memset(memcpy_src, 0x3c, LEN);
    memset(memcpy_dst, 0, LEN);
    for (int i = 0; i < POSTED; i++) post_ring[i].w[0] = i;
    atomic_store(&post_head.v, POSTED);

    pthread_t w;
    pthread_create(&w, NULL, worker, NULL);
    pin(1);
    for (int r = 0; r < runs; r++) {
        double ratios[20];
        for (int s = 0; s < 20; s++) {
            uint64_t e = 0, m = 0;
            for (int k = 0; k < 8; k++) {
                e += exchange(CHUNK);
                m += plain_memcpy(CHUNK);
            }
            ratios[s] = (double)m / (double)e;
        }
        qsort(ratios, 20, sizeof ratios[0], by_value);
        printf("bare exchange at %.1f%% of memcpy (median of 20 paired samples; %.1f-%.1f)\n",
               50 * (ratios[9] + ratios[10]), 100 * ratios[0], 100 * ratios[19]);
    }
    atomic_store(&stop, 1);
    pthread_join(w, NULL);
    return 0;
}
