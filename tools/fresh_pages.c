/* What writing to memory a process has just been given costs: maps SIZE_MB of new
 * anonymous memory and writes one byte per 4 KiB page (each write faults in a zeroed
 * page), then unmaps it and does the same again, three times. A capture of every
 * activation (`Engine::capture`) writes its values into such memory: nothing of it is
 * recycled, since all of it is kept. docs/performance.md, session 49, quotes it.
 *
 *   gcc -O2 -o target/fresh_pages tools/fresh_pages.c && target/fresh_pages [SIZE_MB]
 *
 * SIZE_MB defaults to 5342, what the PP-OCRv4 detector's eight float captures hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 5342;
    size_t n = mb << 20;
    for (int round = 1; round <= 3; round++) {
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        double t0 = now();
        for (size_t i = 0; i < n; i += 4096) p[i] = 1;
        double t1 = now();
        printf("round %d: first writes to %zu MB of new pages %.2f s, %.2f GB/s\n", round, mb,
               t1 - t0, n / 1e9 / (t1 - t0));
        munmap(p, n);
    }
    return 0;
}
