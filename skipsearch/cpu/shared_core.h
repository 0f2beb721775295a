/* A kernel's work split between the calling thread, on a free core, and helper threads on cores that
 * other processes keep busy, without the caller ever waiting for a helper (skipsearch/cpu/
 * shared_core.py engages it around a decode; docs/cpu-backend.md).
 *
 * Why it exists: when another process keeps one of two cores busy, an OpenMP thread on that core is
 * descheduled for whole time slices, and a static split of every product waits for it: the step
 * took 8x its idle time (docs/cpu-backend.md, "Threads and shared cores under load"). One thread on the free core does not wait,
 * but one core reads memory at about half the rate of two, so the step took 1.8x. The busy core
 * still lends a share of its time: a helper that takes pieces of the work when it runs adds that
 * share, provided the caller never waits for a piece the helper holds while descheduled.
 *
 * How: a kernel call is a job of `pieces` independent pieces (e.g. a product's output columns). The
 * caller and the helpers claim pieces from one counter. A helper computes its piece into its own
 * scratch and publishes it only if the caller has not taken it back: the caller, once no piece is
 * left to claim, waits at most STEAL_AFTER for each piece a helper holds, then computes it itself.
 * Publication is one compare-and-swap on the piece's state word, so exactly one of the two stores a
 * piece's outputs, and both compute the same operations: the results are the bits a single thread
 * computes, whichever thread computed each piece (tested). A helper descheduled mid-piece finds,
 * when it runs again, that its piece was taken back and drops its result; what it may still read
 * meanwhile is the job's inputs, which live in a buffer this header owns (`shared_inputs`), and its
 * weights, which must outlive the engagement: shared_core_disengage waits for every helper to be
 * out of its piece, and the Python side engages only around decodes that hold their model.
 *
 * The state: `claim` packs the job's generation (low 32 bits), its piece count and the next piece to
 * claim; a piece's state word packs the generation that last settled it and how (PUBLISHING, DONE
 * by a helper, or TAKEN by the caller). Only the thread that engaged the helpers uses them; any
 * other caller, a job of more than MAX_PIECES pieces, or a process without helpers runs the
 * kernel's own path.
 *
 * The including kernel defines SHARED_SCRATCH_BYTES (a piece's outputs) before including this.
 */
#pragma once
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELPERS 8
#define MAX_PIECES 16384
#define ARGS_BYTES 128
#define STEAL_AFTER 20e-6 /* seconds the caller waits for a helper's piece before computing it itself */
#define SPIN_FOR 2e-3     /* seconds a helper spins without work before it sleeps */

enum { PUBLISHING = 1, DONE = 2, TAKEN = 3 };

/* A piece into the thread's scratch, and a piece's scratch into the job's outputs. */
typedef void (*PieceCompute)(const void *args, int64_t piece, void *scratch);
typedef void (*PieceStore)(const void *args, int64_t piece, const void *scratch);

typedef struct {
    uint64_t generation;
    PieceCompute compute;
    PieceStore store;
    char args[ARGS_BYTES];
} SharedJob;

static SharedJob shared_job;
static _Atomic uint64_t shared_claim; /* generation << 32 | pieces << 16 | next */
static _Atomic uint64_t shared_state[MAX_PIECES];
static _Atomic uint32_t shared_wake; /* the futex word helpers sleep on */
static _Atomic int shared_engaged, shared_sleepers;
static _Atomic int shared_in_piece[MAX_HELPERS];
static _Atomic long shared_helper_pieces, shared_taken_pieces; /* counts, for the experiments */
static _Atomic long shared_hold_us; /* the tests' stand-in for a descheduled helper (shared_core_hold) */
static pthread_t shared_owner, shared_threads[MAX_HELPERS];
static int shared_helpers;
static pid_t shared_pid; /* the process the helpers run in: a fork's child has none of them */
static uint64_t shared_generation;
static cpu_set_t shared_owner_mask; /* the caller's affinity before engaging, restored after */
static void *shared_buffer;
static size_t shared_buffer_bytes;

static double shared_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int shared_pin(pthread_t thread, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(thread, sizeof set, &set);
}

/* Whether the calling thread runs this job with helpers. */
static int shared_active(int64_t pieces) {
    return atomic_load_explicit(&shared_engaged, memory_order_relaxed) && pieces <= MAX_PIECES &&
           pthread_equal(pthread_self(), shared_owner);
}

/* Wait until no helper is inside a piece (one that took a piece back may still be reading). */
static void shared_quiesce(void) {
    for (int h = 0; h < shared_helpers; h++)
        while (atomic_load(&shared_in_piece[h])) _mm_pause();
}

/* A buffer of at least `bytes` for a job's inputs, 64-byte aligned, kept across jobs: a helper late
 * for an earlier job may still read the buffer, so it is replaced only once no helper is in a piece. */
static void *shared_inputs(size_t bytes) {
    if (bytes <= shared_buffer_bytes) return shared_buffer;
    shared_quiesce();
    size_t size = (bytes * 2 + 63) / 64 * 64;
    void *bigger = aligned_alloc(64, size);
    if (!bigger) return NULL;
    free(shared_buffer);
    shared_buffer = bigger, shared_buffer_bytes = size;
    return shared_buffer;
}

static void *shared_helper(void *arg) {
    int index = (int)(intptr_t)arg;
    char scratch[SHARED_SCRATCH_BYTES] __attribute__((aligned(64)));
    double idle_since = shared_seconds();
    for (;;) {
        uint64_t seen = atomic_load(&shared_claim);
        int64_t pieces = (int64_t)(seen >> 16 & 0xFFFF), next = (int64_t)(seen & 0xFFFF);
        if (next >= pieces) {
            if (atomic_load_explicit(&shared_engaged, memory_order_relaxed) && shared_seconds() - idle_since < SPIN_FOR) {
                _mm_pause();
                continue;
            }
            uint32_t word = atomic_load(&shared_wake);
            atomic_fetch_add(&shared_sleepers, 1);
            if (atomic_load(&shared_claim) == seen) syscall(SYS_futex, &shared_wake, FUTEX_WAIT_PRIVATE, word, NULL, NULL, 0);
            atomic_fetch_sub(&shared_sleepers, 1);
            idle_since = shared_seconds();
            continue;
        }
        atomic_store(&shared_in_piece[index], 1);
        SharedJob job = shared_job; /* valid if the claim below succeeds: rewritten only once all pieces are claimed */
        if (!atomic_compare_exchange_strong(&shared_claim, &seen, seen + 1)) {
            atomic_store(&shared_in_piece[index], 0);
            continue;
        }
        long hold = atomic_exchange(&shared_hold_us, 0);
        if (hold) usleep((useconds_t)hold);
        job.compute(job.args, next, scratch);
        uint64_t state = atomic_load(&shared_state[next]);
        if (state >> 2 < job.generation &&
            atomic_compare_exchange_strong(&shared_state[next], &state, job.generation << 2 | PUBLISHING)) {
            job.store(job.args, next, scratch);
            atomic_store_explicit(&shared_state[next], job.generation << 2 | DONE, memory_order_release);
            atomic_fetch_add_explicit(&shared_helper_pieces, 1, memory_order_relaxed);
        }
        atomic_store(&shared_in_piece[index], 0);
        idle_since = shared_seconds();
    }
    return NULL;
}

/* Run `pieces` pieces of a job (`args`, copied) on the caller and the helpers; returns once every
 * piece's outputs are stored. Only for a caller for which shared_active(pieces) holds. */
static void shared_run(const void *args, size_t args_bytes, int64_t pieces, PieceCompute compute, PieceStore store) {
    uint64_t generation = ++shared_generation;
    shared_job.generation = generation, shared_job.compute = compute, shared_job.store = store;
    memcpy(shared_job.args, args, args_bytes);
    uint64_t first = (generation & 0xFFFFFFFFu) << 32 | (uint64_t)pieces << 16;
    atomic_store(&shared_claim, first); /* sequentially consistent: a helper going to sleep sees it or is woken */
    if (atomic_load(&shared_sleepers)) {
        atomic_fetch_add(&shared_wake, 1);
        syscall(SYS_futex, &shared_wake, FUTEX_WAKE_PRIVATE, MAX_HELPERS, NULL, NULL, 0);
    }
    char scratch[SHARED_SCRATCH_BYTES] __attribute__((aligned(64)));
    uint8_t mine[MAX_PIECES];
    memset(mine, 0, (size_t)pieces);
    for (uint64_t seen = atomic_load(&shared_claim); (int64_t)(seen & 0xFFFF) < pieces;) {
        if (!atomic_compare_exchange_weak(&shared_claim, &seen, seen + 1)) continue;
        int64_t piece = (int64_t)(seen & 0xFFFF);
        compute(args, piece, scratch);
        store(args, piece, scratch);
        mine[piece] = 1;
        seen = atomic_load(&shared_claim);
    }
    for (int64_t piece = 0; piece < pieces; piece++) {
        if (mine[piece]) continue;
        double since = 0;
        for (;;) {
            uint64_t state = atomic_load_explicit(&shared_state[piece], memory_order_acquire);
            if (state == (generation << 2 | DONE)) break;
            if (state == (generation << 2 | PUBLISHING)) {
                _mm_pause();
                continue;
            }
            double now = shared_seconds();
            if (since == 0) since = now;
            if (now - since < STEAL_AFTER) {
                _mm_pause();
                continue;
            }
            if (atomic_compare_exchange_strong(&shared_state[piece], &state, generation << 2 | TAKEN)) {
                compute(args, piece, scratch);
                store(args, piece, scratch);
                atomic_fetch_add_explicit(&shared_taken_pieces, 1, memory_order_relaxed);
                break;
            }
        }
    }
}

/* Engage `helpers` helper threads pinned to `helper_cpus` (started on first use, asleep between
 * engagements) for the calling thread, which is pinned to `caller_cpu` until shared_core_disengage:
 * unpinned, the scheduler may put the caller on a busy core and the helper on the free one. 0 on
 * success; 1 where the counts are out of range, a thread cannot start or the caller cannot be pinned. */
int shared_core_engage(int caller_cpu, const int *helper_cpus, int helpers) {
    if (shared_helpers && shared_pid != getpid()) { /* forked: the helpers stayed in the parent */
        shared_helpers = 0;
        for (int h = 0; h < MAX_HELPERS; h++) atomic_store(&shared_in_piece[h], 0);
    }
    if (helpers < 1 || helpers > MAX_HELPERS || (shared_helpers && helpers != shared_helpers)) return 1;
    if (pthread_getaffinity_np(pthread_self(), sizeof shared_owner_mask, &shared_owner_mask) ||
        shared_pin(pthread_self(), caller_cpu))
        return 1;
    for (int h = shared_helpers; h < helpers; h++) {
        if (pthread_create(&shared_threads[h], NULL, shared_helper, (void *)(intptr_t)h)) {
            pthread_setaffinity_np(pthread_self(), sizeof shared_owner_mask, &shared_owner_mask);
            return 1;
        }
        shared_helpers = h + 1, shared_pid = getpid();
    }
    for (int h = 0; h < helpers; h++) shared_pin(shared_threads[h], helper_cpus[h]);
    shared_owner = pthread_self();
    atomic_store(&shared_engaged, 1);
    return 0;
}

/* Stop using the helpers (they sleep), once none is inside a piece, and restore the caller's affinity. */
void shared_core_disengage(void) {
    atomic_store(&shared_engaged, 0);
    shared_quiesce();
    pthread_setaffinity_np(pthread_self(), sizeof shared_owner_mask, &shared_owner_mask);
}

/* The next piece a helper claims, it holds `us` microseconds before computing it, as a helper the
 * scheduler deschedules would: for the tests of taking pieces back. */
void shared_core_hold(long us) { atomic_store(&shared_hold_us, us); }

/* The pieces helpers published and the pieces the caller took back from them, since the library loaded. */
void shared_core_counts(long *helper_pieces, long *taken_pieces) {
    *helper_pieces = atomic_load(&shared_helper_pieces);
    *taken_pieces = atomic_load(&shared_taken_pieces);
}
