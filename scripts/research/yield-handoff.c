// The time one thread takes to hand the CPU to another thread of the same CPU: two threads
// pinned to CPU 0 pass a token back and forth, each calling sched_yield() while it waits. This
// is the price of every hop between two pollers that share a core (docs/performance.md,
// "Between two hosts").
//
//   gcc -O2 -pthread scripts/research/yield-handoff.c -o /tmp/yield-handoff && /tmp/yield-handoff
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HANDOFFS 200000L

static _Atomic long token;

static void *player(void *arg) {
    long me = (long)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (err != 0) {
        /* Unpinned, it would measure a hand-off between CPUs instead. */
        fprintf(stderr, "yield-handoff: cannot pin to CPU 0: %s\n", strerror(err));
        exit(1);
    }
    for (long i = 0; i < HANDOFFS; i++) {
        while (atomic_load(&token) % 2 != me)
            sched_yield();
        atomic_fetch_add(&token, 1);
    }
    return NULL;
}

int main(void) {
    pthread_t a, b;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&a, NULL, player, (void *)0L);
    pthread_create(&b, NULL, player, (void *)1L);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    printf("%.3f us per hand-off (two threads on CPU 0, sched_yield)\n", us / (2.0 * HANDOFFS));
    return 0;
}
