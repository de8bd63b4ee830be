/* What a pause costs two threads that work together: after IDLE_MS of sleep, the main
 * thread wakes a second thread (a condition variable, as rayon wakes its workers) and
 * both run 100 steps of about 20 µs each, meeting at a spinning barrier after each
 * step. Prints the time of all 100 steps, when the second thread started, and the
 * first 16 steps one by one. With PIN=1 the two threads are pinned to CPUs 0 and 1.
 *
 * On the VMs of sessions 49-50 (kernel.sched_vcpu_pack = 15), after 15 ms of idle or
 * more the woken thread is put on the main thread's CPU and the two share it in 4 ms
 * slices for the first steps: the 100 steps, 4.6-8.8 ms after 5-10 ms of idle (the
 * host's load moves that), took 15-24 ms after 100 ms (the second thread started
 * after 3.1-3.5 ms, then steps of 4-8 ms), and 4.7 ms pinned. That is why a run pins its threads after a pause
 * (`par::Placement` in hmct-quant).
 * docs/performance.md, session 50, quotes it.
 *
 *   gcc -O2 -pthread -o target/idle_wake tools/idle_wake.c && target/idle_wake 100
 *   PIN=1 target/idle_wake 100
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define STEPS 100
#define ROUNDS 8

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int generation;
static atomic_int arrived;
static double worker_started;
static float work_buf[2][1 << 14];

static void step(int id) {
    float *b = work_buf[id];
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < (1 << 14); i++) b[i] = b[i] * 0.999f + 1.0f;
}

static void barrier(int k) {
    atomic_fetch_add(&arrived, 1);
    while (atomic_load(&arrived) < 2 * (k + 1)) {
    }
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *worker(void *arg) {
    (void)arg;
    if (getenv("PIN")) pin(1);
    int seen = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        pthread_mutex_unlock(&lock);
        worker_started = now();
        for (int k = 0; k < STEPS; k++) {
            step(1);
            barrier(k);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int idle_ms = argc > 1 ? atoi(argv[1]) : 100;
    if (getenv("PIN")) pin(0);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    for (int round = 0; round < ROUNDS; round++) {
        usleep(idle_ms * 1000);
        atomic_store(&arrived, 0);
        double start = now(), ends[STEPS];
        pthread_mutex_lock(&lock);
        generation++;
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&lock);
        for (int k = 0; k < STEPS; k++) {
            step(0);
            barrier(k);
            ends[k] = now();
        }
        printf("idle %d ms: %.2f ms for %d steps, second thread started after %.3f ms; "
               "steps:",
               idle_ms, (ends[STEPS - 1] - start) * 1e3, STEPS,
               (worker_started - start) * 1e3);
        for (int k = 0; k < 16; k++)
            printf(" %.2f", (ends[k] - (k ? ends[k - 1] : start)) * 1e3);
        printf("\n");
    }
    return 0;
}
