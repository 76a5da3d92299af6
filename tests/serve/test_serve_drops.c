/* test_serve_drops.c — streaming clients that go away (docs/served-models.md, "Disconnects"): a `phasescope
 * serve` process on a shipped model, two rounds of 32 concurrent streaming clients that each close their
 * connection after a seeded random number of events (0: right after sending the request, while it waits or
 * its prompt runs; some with a reset instead of a close). After each round the server drops their
 * sequences (GET /health: nothing running, no cache sequences, the cache's bytes as before), still answers a
 * greedy request exactly as before the drops (the same tokens and log-probabilities, bit for bit: it runs
 * alone both times), and its memory is flat: VmRSS after the second round within a small bound of after
 * the first (CHECK_RSS 0: not checked, for sanitizer builds, whose RSS holds ASan's quarantine of freed
 * memory). The server stops on SIGTERM with status 0 (a sanitizer build's LeakSanitizer finding a leak at
 * its exit makes that nonzero). usage: test_serve_drops PHASESCOPE MODEL_DIR [CHECK_RSS] */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_http.h"

static int fails, passes;
#define OK(c)                                                                   \
    do {                                                                        \
        if (c) passes++;                                                        \
        else {                                                                  \
            fails++;                                                            \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);        \
        }                                                                       \
    } while (0)

enum { NC = 32, PROMPT = 8, MAX_TOKENS = 80 };

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *prompt_body(uint64_t seed, int64_t V, int stream) {
    char ids[256] = "";
    for (int t = 0; t < PROMPT; t++) {
        size_t L = strlen(ids);
        snprintf(ids + L, sizeof ids - L, "%s%d", t ? ", " : "", (int)(rng_next(&seed) % (uint64_t)V));
    }
    char *b = malloc(1024);
    snprintf(b, 1024, "{\"prompt\": [%s], \"max_tokens\": %d, \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true%s}",
             ids, MAX_TOKENS, stream ? ", \"stream\": true" : "");
    return b;
}

typedef struct {
    int port;
    char *body;
    int events;  /* close after this many events (-1: after data: [DONE]) */
    int reset;   /* close with a reset (SO_LINGER 0) */
    int got;     /* events read */
    int done;    /* data: [DONE] read */
} dropper;

/* a raw HTTP/1.1 streaming request, read until `events` events arrived, then the socket closed */
static void *drop_main(void *u) {
    dropper *d = u;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)d->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (fd >= 0) close(fd);
        d->got = -1;
        return NULL;
    }
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(d->body), d->body);
    if (write(fd, req, (size_t)n) != n) d->got = -1;
    char rb[4096], tail[8] = "";
    while (d->got >= 0 && (d->events < 0 ? !d->done : d->got < d->events)) {
        ssize_t k = read(fd, rb, sizeof rb - 1);
        if (k <= 0) break;
        rb[k] = '\0';
        /* count "data: " at the start of events (a marker split across reads is stitched with the last bytes) */
        char join[4096 + 8];
        snprintf(join, sizeof join, "%s%s", tail, rb);
        for (char *p = join; (p = strstr(p, "data: ")); p += 6) d->got++;
        d->done |= strstr(join, "data: [DONE]") != NULL;
        size_t jl = strlen(join), keep = jl < 5 ? jl : 5;
        memcpy(tail, join + jl - keep, keep);
        tail[keep] = '\0';
    }
    if (d->reset) {
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
    return NULL;
}

static long vm_rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
}

/* wait until nothing runs and the cache holds no sequence; the health object then (NULL: not reached) */
static json_t *settle(int port) {
    for (int tries = 0; tries < 600; tries++) {
        json_t *h;
        if (tu_http(port, "GET", "/health", NULL, &h) == 200 && json_integer_value(json_object_get(h, "running")) == 0 &&
            json_integer_value(json_object_get(h, "cache_sequences")) == 0)
            return h;
        json_decref(h);
        sleep_ms(50);
    }
    return NULL;
}

/* the greedy reference request: its tokens and log-probabilities as one JSON value */
static json_t *reference(int port, const char *body) {
    json_t *r;
    if (tu_http(port, "POST", "/v1/completions", body, &r) != 200) {
        json_decref(r);
        return NULL;
    }
    json_t *lo = json_incref(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs"));
    json_decref(r);
    return lo;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: test_serve_drops PHASESCOPE MODEL_DIR [CHECK_RSS]\n");
        return 2;
    }
    int check_rss = argc < 4 || atoi(argv[3]);
    char cfgp[4200];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", argv[2]);
    json_t *cfg = json_load_file(cfgp, 0, NULL);
    int64_t V = json_integer_value(json_object_get(cfg, "vocab_size"));
    json_decref(cfg);
    if (V < 2) {
        fprintf(stderr, "%s: no vocab_size\n", cfgp);
        return 1;
    }
    char dir[] = "/tmp/ps_drops.XXXXXX", portf[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(portf, sizeof portf, "%s/port", dir);
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[1], argv[1], "serve", "--model", argv[2], "--port", "0", "--port-file", portf, "--max-connections", "64", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int tries = 0; tries < 600 && !port; tries++) {
        FILE *f = fopen(portf, "r");
        if (f) {
            if (fscanf(f, "%d", &port) != 1) port = 0;
            fclose(f);
        }
        if (!port) sleep_ms(50);
    }
    OK(port > 0);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char *ref_body = prompt_body(7, V, 0);
    json_t *ref0 = port ? reference(port, ref_body) : NULL;
    OK(ref0 != NULL);
    /* round 0: 32 streaming clients that read their answers to the end (the heap reaches what 32 whole
     * answers need at once); rounds 1, 2 (PS_DROP_ROUNDS: more): 32 that drop */
    int rounds = getenv("PS_DROP_ROUNDS") ? atoi(getenv("PS_DROP_ROUNDS")) : 2;
    long rss0 = 0, rss1 = 0, rss = 0;
    json_int_t dropped_before = 0, cache0 = -1, cache = 0;
    for (int round = 0; round <= rounds && port; round++) {
        dropper d[NC];
        pthread_t th[NC];
        uint64_t seed = 1000 + (uint64_t)round;
        for (int i = 0; i < NC; i++) {
            d[i] = (dropper){.port = port, .body = prompt_body(100 * (uint64_t)round + (uint64_t)i, V, 1)};
            d[i].events = round ? (int)(rng_next(&seed) % 13) : -1; /* 0 to 12 of the 80 tokens' events */
            d[i].reset = (int)(rng_next(&seed) % 4 == 0);
        }
        for (int i = 0; i < NC; i++) pthread_create(&th[i], NULL, drop_main, &d[i]);
        int got = 0;
        for (int i = 0; i < NC; i++) {
            pthread_join(th[i], NULL);
            OK(d[i].got >= 0);
            if (!round) OK(d[i].done); /* the whole answer, to data: [DONE] */
            got += d[i].got;
            free(d[i].body);
        }
        json_t *h = settle(port);
        OK(h != NULL); /* nothing runs, the cache holds no sequence: every dropped client's were freed */
        json_t *dr = json_object_get(h, "dropped");
        json_int_t q = json_integer_value(json_array_get(dr, 0)), run = json_integer_value(json_array_get(dr, 1));
        cache = json_integer_value(json_object_get(h, "cache_bytes"));
        if (cache0 < 0) cache0 = cache;
        OK(cache == cache0); /* the cache's pages and tables after each round as after the first */
        json_decref(h);
        /* the server still answers, exactly as before */
        json_t *ref = reference(port, ref_body);
        OK(ref != NULL && json_equal(ref, ref0));
        json_decref(ref);
        rss = vm_rss_kb(pid);
        if (round == 1) rss0 = rss;
        if (round == 2) rss1 = rss;
        printf("round %d: 32 streaming clients %s after %d events in all; the server dropped %lld while queued and %lld while running "
               "(so far); cache bytes %lld; VmRSS %ld kB; the reference answer unchanged\n",
               round, round ? "dropped" : "read to the end", got, (long long)q, (long long)run, (long long)cache, rss);
        if (round) OK(q + run - dropped_before >= 1); /* some clients went away before their answer ended, in each round */
        else OK(q + run == 0);
        dropped_before = q + run;
    }
    if (port && rounds >= 2 && !check_rss) printf("VmRSS not checked (a sanitizer build)\n");
    if (port && rounds >= 2 && check_rss) {
        printf("VmRSS after the second round of drops - after the first: %ld kB (bound 4096 kB)\n", rss1 - rss0);
        OK(rss0 > 0 && rss1 - rss0 < 4096);
    }
    json_decref(ref0);
    free(ref_body);
    kill(pid, SIGTERM);
    int status = 0;
    OK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(portf);
    rmdir(dir);
    curl_global_cleanup();
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
