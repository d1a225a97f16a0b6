/* minirt native kernels: thread pool, CPU feature detection, ISA dispatch.
 *
 * The kernel bodies live in kernels_impl.h, which is compiled here once for
 * the baseline ISA of the target architecture and, on x86-64, once more with
 * __attribute__((target("avx2,fma"))) (on aarch64 the int8 GEMM has an SDOT
 * microkernel under target("arch=armv8.2-a+dotprod"), see qgemm.h; on 32-bit ARM
 * the float kernels once more for NEON + VFPv4, below).  Nothing in this file or in the
 * baseline copy uses instructions beyond the compiler's default target, so
 * the library loads and runs on any CPU of its architecture; the AVX2 copy
 * is only ever called after __builtin_cpu_supports() said yes.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1 /* sched_getcpu, CPU_SET, pthread_attr_setaffinity_np (pool_pin) */
#endif
#include "kernels.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if (defined(__aarch64__) || defined(__arm__)) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__x86_64__)
/* for the *_impl.h files included below (each compiled per ISA level): max / min in the GEMM epilogue,
 * FN(conv_cv_transpose12), AVX-512 masked loads / stores (gemm_impl.h), dw_cb_clamp (dwconv_impl.h) */
#include <immintrin.h>
#include <cpuid.h> /* (__get_cpuid_count: AMX) */
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h> /* (arch_prctl: the AMX tile permission) */
#endif

#define MRT_MAX_THREADS 64

/* The guard behind minirt/native/__init__.py's check_geometry (which refuses such geometries first, with
 * a message): whether a window geometry's fields leave their range or a size derived from them (input,
 * output, weights, im2col columns, window extent, strided phase planes) reaches MRT_GEOMETRY_MAX elements,
 * computed without overflow.  The conv entry points return -2 (bad sizes) for such a geometry instead of
 * sizing scratch memory from a wrapped product. */
/* The kernels compute sizes in long, and byte counts reach 8x an element count: 2^59 where long has 64
 * bits, 2^27 where it has 32 (32-bit ARM), as check_geometry's bound in minirt/native/__init__.py. */
#define MRT_GEOMETRY_MAX (1L << (sizeof(long) * 8 - 5))
static int geometry_overflows(const mrt_conv_geometry *g) {
    const long f[16] = {g->n, g->c, g->h, g->w, g->m, g->group, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw,
                        g->pt, g->pl, g->oh, g->ow};
    for (int i = 0; i < 16; ++i)
        if (f[i] < 0) return 1;
    if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1) return 1;
    const long m = g->m > g->c ? g->m : g->c;
    const long ext_h = ((long)g->kh - 1) * g->dh + 1, ext_w = ((long)g->kw - 1) * g->dw + 1;
    const long sizes[6][5] = {
        {g->n, g->c, g->h, g->w, 1},
        {g->n, m, g->oh, g->ow, 1},
        {m, g->c, g->kh, g->kw, 1},
        {g->c, g->kh, g->kw, g->oh, g->ow},
        {ext_h, ext_w, 1, 1, 1},
        {g->c, g->sh, g->sw, g->ow + (long)g->kw * g->dw, g->oh + (long)g->kh * g->dh},
    };
    for (int s = 0; s < 6; ++s) {
        long p = 1;
        for (int i = 0; i < 5; ++i)
            if (__builtin_mul_overflow(p, sizes[s][i], &p) || p >= MRT_GEOMETRY_MAX) return 1;
    }
    return 0;
}

/* Below this many "units" (roughly multiply-adds) per thread, waking a
 * worker costs more than it saves. */
#define MRT_MIN_WORK_PER_THREAD 32768L
/* ... and below this many times that in all, a job runs on the caller alone when the workers it would
 * take are asleep (they sleep after MRT_SPIN idle pauses, ~0.1 ms): waking one is a futex call on the
 * caller and a scheduler wake-up on the other CPU, which on a 2-vCPU VM outlasted the parallel half of
 * such a job.  Silero VAD at 2 threads ran its ~0.05 ms of small convolutions and LSTM products at 1.8x
 * its 1-thread time, its workers asleep between runs and woken several times a run (D142). */
#define MRT_WAKE_MIN_WORK 16L

/* ------------------------------------------------------------------ thread pool
 *
 * A fixed set of workers started on first use and kept for the life of the
 * process.  A job is [0, n) items, claimed in chunks from an atomic counter
 * by the caller and by the workers that join it, so a worker that the OS
 * does not schedule in time (an oversubscribed machine, another runtime's
 * spinning threads) costs nothing: the caller runs the remaining chunks
 * itself, closes the job, and waits only for workers that already joined.
 * One job runs at a time: a caller that finds the pool busy (another Python
 * thread running a session concurrently, since cffi releases the GIL) runs
 * its job on its own thread.
 */
typedef void (*mrt_task_fn)(void *ctx, long begin, long end);

/* The job handshake takes no lock (a worker that blocked on a mutex the caller still held, just
 * after seeing a new job, slept in the kernel: measured ~28 futex calls per MobileNet run at 2
 * threads, one per layer).  pool_generation says which job is open: odd while job (g + 1) / 2 is
 * open, even once it is closed.  The caller writes the job's fields, then opens it (release);
 * a worker that sees an odd generation announces itself (pool_active + 1) and only then checks
 * that the same generation is still open, so either it joins before the caller closes (and the
 * caller waits for it) or it sees the job closed and leaves: both sides use sequentially
 * consistent atomics for this (store, then load the other's variable).  The fields of the job are
 * rewritten only after pool_active is back to 0.  Sleeping (after MRT_SPIN pauses) goes through
 * pool_lock and two condition variables, with the same store-then-load rule on pool_sleepers and
 * pool_caller_waits, so a wake-up is never lost. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_dispatch = PTHREAD_MUTEX_INITIALIZER;
static int pool_workers;                       /* workers started (ids 1..pool_workers; under pool_lock) */
static unsigned long pool_generation;          /* odd: a job is open (atomic) */
static unsigned long pool_start_gen[MRT_MAX_THREADS];
/* the current job (written by the caller while no worker is inside, before the job opens) */
static mrt_task_fn pool_fn;
static void *pool_ctx;
static long pool_n, pool_chunks;
/* The job's chunks are dealt in contiguous ranges, one per participant (participant p: chunks
 * [p * chunks / parts, (p + 1) * chunks / parts); the caller is 0, worker `id` is id), each claimed
 * from its own counter.  A participant runs its own range first and then helps with the others', so
 * a thread the OS schedules late still costs nothing; but on a machine that runs every participant,
 * participant p computes the same part of every job.  Kernels order their items so that equal parts
 * of consecutive layers cover the same rows of the image: a thread then mostly reads activations it
 * wrote itself, from its own cache.  (Dealt from one shared counter, the chunks went to threads at
 * random: on a 2-vCPU Xeon VM, where a line written by the other core costs ~80 ns, MobileNetV2's
 * depthwise -> pointwise pair ran slower at 2 threads than at 1, 131 -> 142 us.) */
struct pool_range {
    long next; /* next unclaimed chunk of the range (atomic) */
    long end;  /* one past its last chunk */
    char pad[64 - 2 * sizeof(long)]; /* one cache line per range: the counters are written concurrently */
};
static struct pool_range pool_ranges[MRT_MAX_THREADS] __attribute__((aligned(64)));
static int pool_parts;  /* participants wanted, caller included */
static int pool_active; /* workers inside the job (atomic) */
static int pool_sleepers;     /* workers asleep or about to sleep on pool_wake (atomic) */
static int pool_caller_waits; /* the caller sleeps or is about to sleep on pool_done (atomic) */

/* Spin this many pause iterations (tens of microseconds) for the next job or
 * for joined workers to finish before sleeping on a condition variable: the
 * kernels of one model run back to back with a few microseconds of Python
 * between them, and a futex wake-up costs more than that.  Bounded, unlike
 * OpenBLAS's busy-waiting workers, so an idle process stops burning CPU. */
#define MRT_SPIN 2000
/* ... and every MRT_SPIN_YIELD-th of those iterations is a sched_yield instead of a pause: on an
 * idle machine it returns at once (nothing else wants the CPU), but when another thread waits for
 * this CPU (another process, or our own caller when there are more threads than free cores) the
 * spinner lets it run instead of burning its time slice.  Measured (MobileNet, 2 threads, the
 * process pinned to one CPU, docs/decisions.md D34): 2.16 ms with pauses only, 1.45 ms with a
 * yield every 8th step, 1.44 ms at 1 thread; unchanged on an idle machine. */
#define MRT_SPIN_YIELD 8

static inline void mrt_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Iteration i of a spin-wait (see MRT_SPIN_YIELD). */
static inline void mrt_spin_step(int i) {
    if (i % MRT_SPIN_YIELD == MRT_SPIN_YIELD - 1)
        sched_yield();
    else
        mrt_pause();
}

/* The chunks a job's n items are claimed in: mrt_chunks(n, parts) of them, chunk c is items
 * [mrt_chunk_begin(n, chunks, c), mrt_chunk_begin(n, chunks, c + 1)).  A few per thread, so
 * late or slow threads leave less behind; their sizes differ by at most one item, so a count of
 * items that is not a multiple of the chunk size leaves no thread a chunk short (49 items as
 * chunks of 7 went 4 to one thread and 3 to the other).  8 or 16 per thread measured no better
 * (MobileNet at 2 threads). */
static inline long mrt_chunks(long n, int parts) { return n < 4L * parts ? n : 4L * parts; }
static inline long mrt_chunk_begin(long n, long chunks, long c) { return n / chunks * c + (n % chunks) * c / chunks; }

/* ------------------------------------------------------------------ cancellation (issue 22)
 *
 * A thread that runs a cancellable run watches its mrt_cancel (mrt_watch_cancel); the kernels it calls
 * read it between their work items (mrt_parallel_for) and a replayed program between its calls, and
 * stop early once it says so: a kernel's output is then incomplete, and the caller, which reads the
 * same flag after the call, discards the run (RunTerminated).  A thread that watches nothing pays one
 * thread-local load per parallel loop. */
static __thread mrt_cancel *tls_cancel;

void mrt_watch_cancel(mrt_cancel *c) { tls_cancel = c; }

static int mrt_cancelled(const mrt_cancel *c) {
    if (!c) return 0;
    if (__atomic_load_n(&c->terminate, __ATOMIC_RELAXED)) return 1;
    if (c->deadline_ns > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts); /* (the clock of Python's time.monotonic) */
        if ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec > c->deadline_ns) return 1;
    }
    return 0;
}

/* the job's cancellation (the caller's watched one), read by every participant between chunks */
static mrt_cancel *pool_cancel;

/* Participant `self` of `parts` runs chunks of the open job: its own range, then the others'. */
static void pool_run_items(mrt_task_fn fn, void *ctx, long n, long chunks, int self, int parts) {
    mrt_cancel *cancel = pool_cancel;
    /* (a worker watches the caller's cancellation for the job: a kernel the item runs inside, on one
     * thread, splits its own work and checks too) */
    mrt_cancel *own = tls_cancel;
    tls_cancel = cancel;
    for (int k = 0; k < parts; ++k) {
        struct pool_range *r = &pool_ranges[(self + k) % parts];
        for (;;) {
            long c = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
            if (c >= r->end) break;
            if (mrt_cancelled(cancel)) goto done;
            fn(ctx, mrt_chunk_begin(n, chunks, c), mrt_chunk_begin(n, chunks, c + 1));
        }
    }
done:
    tls_cancel = own;
}

/* A watched cancellable run's work split this many times at most, each piece after a check: a long
 * kernel stops within a thousandth of its time (and the checks, a load and a vDSO clock read each,
 * cost nothing next to the pieces). */
#define MRT_CANCEL_PIECES 1024

/* The chunks of a job of n items for `parts` participants (mrt_chunks), or, when a cancellation is
 * watched, up to MRT_CANCEL_PIECES of them: a check between each. */
static inline long mrt_job_chunks(long n, int parts, const mrt_cancel *cancel) {
    const long chunks = mrt_chunks(n, parts);
    return cancel && chunks < n ? (n < MRT_CANCEL_PIECES ? n : MRT_CANCEL_PIECES) : chunks;
}

/* fn over [0, n) on the calling thread: in one call, or, when a cancellation is watched, in pieces with a
 * check before each. */
static void run_on_caller(mrt_task_fn fn, void *ctx, long n, const mrt_cancel *cancel) {
    if (!cancel) {
        fn(ctx, 0, n);
        return;
    }
    const long pieces = n < MRT_CANCEL_PIECES ? n : MRT_CANCEL_PIECES;
    for (long c = 0; c < pieces; ++c) {
        if (mrt_cancelled(cancel)) return;
        fn(ctx, mrt_chunk_begin(n, pieces, c), mrt_chunk_begin(n, pieces, c + 1));
    }
}

/* Leave a job: the last worker out wakes a caller that sleeps waiting for it. */
static void pool_leave(void) {
    if (__atomic_sub_fetch(&pool_active, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&pool_caller_waits, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool_lock);
        pthread_cond_signal(&pool_done);
        pthread_mutex_unlock(&pool_lock);
    }
}

static void *pool_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    unsigned long seen = pool_start_gen[id];
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "minirt-worker"); /* (top -H, perf, /proc/<pid>/task/<tid>/comm) */
#endif
    for (;;) {
        unsigned long gen = __atomic_load_n(&pool_generation, __ATOMIC_ACQUIRE);
        for (int i = 0; i < MRT_SPIN && (gen == seen || !(gen & 1)); ++i) {
            mrt_spin_step(i);
            gen = __atomic_load_n(&pool_generation, __ATOMIC_ACQUIRE);
        }
        if (gen == seen || !(gen & 1)) { /* no new open job: sleep until the next one opens */
            pthread_mutex_lock(&pool_lock);
            __atomic_add_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            for (;;) {
                gen = __atomic_load_n(&pool_generation, __ATOMIC_SEQ_CST);
                if (gen != seen && (gen & 1)) break;
                pthread_cond_wait(&pool_wake, &pool_lock);
            }
            __atomic_sub_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool_lock);
        }
        seen = gen;
        if (id >= __atomic_load_n(&pool_parts, __ATOMIC_RELAXED)) continue;
        __atomic_add_fetch(&pool_active, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&pool_generation, __ATOMIC_SEQ_CST) != gen) { /* closed before we joined */
            pool_leave();
            continue;
        }
        pool_run_items(pool_fn, pool_ctx, pool_n, pool_chunks, id, __atomic_load_n(&pool_parts, __ATOMIC_RELAXED));
        pool_leave();
    }
    return NULL;
}

/* Worker `id` runs on one CPU of those this thread may use: the id-th after the CPU the creating thread
 * runs on (D131).  Left to the scheduler, a worker created or woken while the caller ran was often placed
 * on the caller's CPU and stayed there for milliseconds (a busy task is "cache hot" and not moved), so a
 * session's first run at 2 threads cost 1.7-2.2x a steady one on a 2-vCPU VM (pinned: 1.2-1.3x in some
 * measurements, not all: D131; steady runs unchanged); the caller is not pinned, so the scheduler moves it
 * off the worker's CPU instead.
 * onnxruntime pins its workers the same way by default.  Nothing is pinned with fewer than 2 CPUs, or
 * with MINIRT_PIN_THREADS=0 in the environment (a process that manages affinity itself). */
#if defined(__linux__) && !defined(__ANDROID__) /* (bionic has no pthread_attr_setaffinity_np) */
#define MRT_PIN 1
static pthread_t pool_thread[MRT_MAX_THREADS]; /* worker id's thread (ids 1..pool_workers) */
static int pool_cpu[MRT_MAX_THREADS];          /* the CPU worker id is pinned to, -1: not pinned */
static cpu_set_t pool_allowed;                 /* the CPUs the workers were pinned among */
#endif

/* The CPU `id` places after `here` among the allowed ones (in order, wrapping), or -1. */
static int pool_cpu_after(int here, int id) {
#if defined(MRT_PIN)
    const int n = CPU_COUNT(&pool_allowed);
    int k = 0, at = 0;
    for (int c = 0; c < CPU_SETSIZE && k < n; ++c)
        if (CPU_ISSET(c, &pool_allowed)) {
            if (c == here) at = k;
            ++k;
        }
    const int want = (at + id) % n;
    k = 0;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &pool_allowed) && k++ == want) return c;
#else
    (void)here;
    (void)id;
#endif
    return -1;
}

#if defined(MRT_PIN)
/* The set of CPU c alone. */
static cpu_set_t pool_one_cpu(int c) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    return one;
}
#endif

/* The CPU worker `id` is to be created on (its attribute set so), or -1: not pinned. */
static int pool_pin(pthread_attr_t *attr, int id) {
#if defined(MRT_PIN)
    const char *env = getenv("MINIRT_PIN_THREADS");
    if (env && env[0] == '0') return -1;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    const int n = CPU_COUNT(&allowed);
    if (n < 2) return -1;
    pool_allowed = allowed;
    const int here = sched_getcpu();
    const int c = pool_cpu_after(here, id); /* the allowed CPUs in order, counted on from the caller's */
    if (c < 0) return -1;
    const cpu_set_t one = pool_one_cpu(c);
    return pthread_attr_setaffinity_np(attr, sizeof one, &one) == 0 ? c : -1;
#else
    (void)attr;
    (void)id;
    return -1;
#endif
}

/* Called by the caller with pool_dispatch held, before a job opens: a pinned worker of the job that
 * shares the caller's CPU now (the caller moved there: it is not pinned) is moved to the CPU after the
 * caller's, so that the job does not run its two halves on one CPU (a first run at 2 threads cost 1.7-2.7x
 * a steady one when that happened, D131).  One sched_getcpu per job; a syscall only when they meet. */
static void pool_unshare_cpu(int parts) {
#if defined(MRT_PIN)
    const int here = sched_getcpu();
    if (here < 0) return;
    for (int id = 1; id < parts; ++id) {
        if (pool_cpu[id] != here) continue;
        const int c = pool_cpu_after(here, id);
        if (c < 0 || c == here) continue;
        const cpu_set_t one = pool_one_cpu(c);
        if (pthread_setaffinity_np(pool_thread[id], sizeof one, &one) == 0) pool_cpu[id] = c;
    }
#else
    (void)parts;
#endif
}

/* Called with pool_dispatch held: make sure workers 1..want-1 exist; returns
 * how many threads (caller included) can take part. */
static int pool_ensure(int want) {
    pthread_mutex_lock(&pool_lock);
    while (pool_workers + 1 < want) {
        int id = pool_workers + 1;
        pthread_t t;
        pthread_attr_t attr;
        /* the worker's first job is one that opens after this (a job is never open here) */
        pool_start_gen[id] = __atomic_load_n(&pool_generation, __ATOMIC_RELAXED);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int cpu = pool_pin(&attr, id);
        int rc = pthread_create(&t, &attr, pool_worker, (void *)(intptr_t)id);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
#if defined(MRT_PIN)
        pool_thread[id] = t;
        pool_cpu[id] = cpu;
#else
        (void)cpu;
#endif
        pool_workers = id;
    }
    int have = pool_workers + 1;
    pthread_mutex_unlock(&pool_lock);
    return have < want ? have : want;
}

static void pool_atfork_child(void) {
    /* Only the forking thread survives in the child: forget the workers. */
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&pool_dispatch, NULL);
    pthread_cond_init(&pool_wake, NULL);
    pthread_cond_init(&pool_done, NULL);
    pool_workers = 0;
    pool_active = 0;
    pool_sleepers = 0;
    pool_caller_waits = 0;
    if (pool_generation & 1) pool_generation++; /* forked in the middle of a job: it is not ours */
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) { pthread_atfork(NULL, NULL, pool_atfork_child); }

/* Run fn over [0, n) with up to nthreads threads; `unit` is the work of one
 * item (to decide whether threads pay off). */
static void mrt_parallel_for(long n, long unit, int nthreads, mrt_task_fn fn, void *ctx) {
    if (n <= 0) return;
    mrt_cancel *cancel = tls_cancel;
    long total = n * (unit > 0 ? unit : 1);
    long by_work = total / MRT_MIN_WORK_PER_THREAD;
    int parts = nthreads;
    if (parts > MRT_MAX_THREADS) parts = MRT_MAX_THREADS;
    if (parts > n) parts = (int)n;
    if (parts > by_work) parts = by_work < 1 ? 1 : (int)by_work;
    if (parts > 1 && by_work < MRT_WAKE_MIN_WORK && __atomic_load_n(&pool_sleepers, __ATOMIC_RELAXED) >= parts - 1) {
        /* the job's own chunks, one after the other: fn sees the ranges it would see with the workers (a
         * kernel whose sums follow its ranges gives the same bits whether or not a worker was awake) */
        const long chunks = mrt_job_chunks(n, parts, cancel);
        for (long c = 0; c < chunks; ++c) {
            if (mrt_cancelled(cancel)) return;
            fn(ctx, mrt_chunk_begin(n, chunks, c), mrt_chunk_begin(n, chunks, c + 1));
        }
        return;
    }
    if (parts <= 1 || pthread_mutex_trylock(&pool_dispatch) != 0) {
        run_on_caller(fn, ctx, n, cancel);
        return;
    }
    pthread_once(&pool_once, pool_init);
    parts = pool_ensure(parts);
    if (parts <= 1) {
        pthread_mutex_unlock(&pool_dispatch);
        run_on_caller(fn, ctx, n, cancel);
        return;
    }
    pool_unshare_cpu(parts);
    const long chunks = mrt_job_chunks(n, parts, cancel);
    /* no worker is inside (the last job ended with pool_active at 0): the fields are ours */
    pool_cancel = cancel;
    pool_fn = fn;
    pool_ctx = ctx;
    pool_n = n;
    pool_chunks = chunks;
    for (int p = 0; p < parts; ++p) {
        __atomic_store_n(&pool_ranges[p].next, chunks * p / parts, __ATOMIC_RELAXED);
        pool_ranges[p].end = chunks * (p + 1) / parts;
    }
    __atomic_store_n(&pool_parts, parts, __ATOMIC_RELAXED);
    const unsigned long open = __atomic_load_n(&pool_generation, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&pool_generation, open, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool_sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool_lock);
        pthread_cond_broadcast(&pool_wake);
        pthread_mutex_unlock(&pool_lock);
    }

    pool_run_items(fn, ctx, n, chunks, 0, parts);

    /* close: from here no worker joins; wait for those inside */
    __atomic_store_n(&pool_generation, open + 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < MRT_SPIN && __atomic_load_n(&pool_active, __ATOMIC_SEQ_CST) > 0; ++i) mrt_spin_step(i);
    if (__atomic_load_n(&pool_active, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool_lock);
        __atomic_store_n(&pool_caller_waits, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&pool_active, __ATOMIC_SEQ_CST) > 0) pthread_cond_wait(&pool_done, &pool_lock);
        __atomic_store_n(&pool_caller_waits, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&pool_lock);
    }
    pthread_mutex_unlock(&pool_dispatch);
}

/* The memory bound over the kernels' own scratch (issue 22): no scratch block above scratch_limit
 * bytes (the session's max_tensor_bytes, set by Python before its runs: mrt_set_scratch_limit) is
 * allocated; the request fails as running out of memory would, and its size is kept for the error
 * message (mrt_scratch_refused).  One value per process: concurrent sessions with different bounds
 * share the last one set. */
static size_t scratch_limit = (size_t)-1;
static size_t scratch_refused;

void mrt_set_scratch_limit(size_t bytes) { __atomic_store_n(&scratch_limit, bytes, __ATOMIC_RELAXED); }

size_t mrt_scratch_refused(void) { return __atomic_exchange_n(&scratch_refused, 0, __ATOMIC_RELAXED); }

static int scratch_allowed(size_t bytes) {
    if (bytes <= __atomic_load_n(&scratch_limit, __ATOMIC_RELAXED)) return 1;
    __atomic_store_n(&scratch_refused, bytes, __ATOMIC_RELAXED);
    return 0;
}

/* malloc for a kernel's scratch, under the bound */
static void *mrt_scratch_malloc(size_t bytes) { return scratch_allowed(bytes) ? malloc(bytes) : NULL; }

/* Grow a per-thread scratch buffer to at least ``bytes`` (64-byte aligned);
 * it is kept for the life of the thread (no allocation in the steady state).
 * Returns NULL when memory runs out (the old buffer stays valid). */
static void *tls_grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        void *p = NULL;
        size_t want = bytes + 4096;
        if (posix_memalign(&p, 64, want) != 0) return NULL;
        free(*buf);
        *buf = p;
        *cap = want;
    }
    return *buf;
}

/* Scratch for GEMM packing. */
static __thread void *tls_pack;
static __thread size_t tls_pack_cap;

static void *mrt_pack_buffer(size_t bytes) { return tls_grow(&tls_pack, &tls_pack_cap, bytes); }

/* A second scratch for whole-layer buffers (the quantized input and im2col of
 * an int8 convolution) that live across the GEMM jobs, which use
 * mrt_pack_buffer on the same thread. */
static __thread void *tls_scratch;
static __thread size_t tls_scratch_cap;

static void *mrt_scratch_buffer(size_t bytes) {
    /* (under the bound, unlike mrt_pack_buffer's blocks, which the GEMM's tile sizes bound) */
    if (bytes > tls_scratch_cap && !scratch_allowed(bytes)) return NULL;
    return tls_grow(&tls_scratch, &tls_scratch_cap, bytes);
}

/* A third, for the partial sums of a convolution split along K between threads (gemm_impl.h,
 * FN(conv_cv_split_k)), which has another way without it: over the bound it is NULL, and the refusal
 * is not recorded as the reason of a failure. */
static __thread void *tls_partials;
static __thread size_t tls_partials_cap;

static void *mrt_partials_buffer(size_t bytes) {
    if (bytes > tls_partials_cap && bytes > __atomic_load_n(&scratch_limit, __ATOMIC_RELAXED)) return NULL;
    return tls_grow(&tls_partials, &tls_partials_cap, bytes);
}

/* A rectangle of output pixels of the channel-vector convolution (gemm_impl.h, FN(conv_cv)):
 * rows x cols pixels; pixel (r, j) reads row k of its implicit B at B + brow[k] + r * in_row +
 * j * in_col, and is written at out + r * out_row + j of each output channel's row. */
typedef struct {
    const float *B;
    const long *brow;
    int rows, cols;
    long in_row, in_col, out, out_row;
} mrt_cv_region;
/* regions of one FN(conv_cv) call at most: a convolution's inside and its four borders */
#define MRT_CV_MAX_REGIONS 5

/* The int8 depthwise conv's arguments inside the library (mrt_qdwconv2d gathers them from its
 * mrt_conv_geometry / mrt_quant / mrt_epilogue): the input, the per-channel quantization, the
 * weights as floats, the epilogue and the output in one place for the kernels of every ISA. */
typedef struct {
    const float *x;
    const uint8_t *xq;
    const float *x_scale, *x_zero; /* per channel; x_zero integer valued in [0, 255] */
    const float *w, *scale, *bias, *res;
    float *y;
    uint8_t *yq;
    float y_scale;
    int y_zero;
    int act;
    float a0, a1, post_a, post_b;
} q_dw_params;

/* The one-product float GEMM with positional arguments, for the kernels that run GEMMs of their own
 * (layout_impl.h); defined with the entry points below. */
static void sgemm_one(int M, int N, int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc,
                      const float *bias, int bias_mode, const float *res, long ldr, int act, float a0, float a1,
                      int nthreads);

/* RoiAlign's per-RoI geometry and per-axis bilinear taps (used by roialign_impl.h of every ISA; here,
 * compiled once at the baseline ISA, so that every ISA samples at the same positions with the same
 * weights).  onnxruntime's float arithmetic, in its order of operations. */
typedef struct {
    int lo, hi;    /* the two taps along the axis */
    float wl, wh;  /* their weights (1 - frac, frac); both 0 for a sample outside the map */
} roi_tap;
typedef struct {
    float start_h, start_w, bin_h, bin_w;
    int gh, gw;  /* samples per bin along y / x: <= 0 means none (then the RoI's output is 0) */
    float count; /* max(gh * gw, 1): the avg divisor */
} roi_geom;

/* samples per bin along an axis of `size` pixels split into `bins`: the sampling ratio, or ceil(size /
 * bins); 0 for none (an empty or negative RoI, NaN), -1 for more than 65536 */
static int roi_grid(float size, int bins, int ratio) {
    if (ratio > 0) return ratio > 65536 ? -1 : ratio;
    const float g = ceilf(size / (float)bins);
    if (!(g > 0.0f)) return 0;
    return g > 65536.0f ? -1 : (int)g;
}

static void roi_geometry(const mrt_roi_align_shape *s, const float *roi, roi_geom *g) {
    const float off = s->half_pixel ? 0.5f : 0.0f, scale = s->spatial_scale;
    const float x1 = roi[0] * scale - off, y1 = roi[1] * scale - off;
    const float x2 = roi[2] * scale - off, y2 = roi[3] * scale - off;
    float rw = x2 - x1, rh = y2 - y1;
    if (!s->half_pixel) { /* legacy: RoIs of at least one pixel */
        rw = rw < 1.0f ? 1.0f : rw;
        rh = rh < 1.0f ? 1.0f : rh;
    }
    g->start_h = y1;
    g->start_w = x1;
    g->bin_h = rh / (float)s->oh;
    g->bin_w = rw / (float)s->ow;
    g->gh = roi_grid(rh, s->oh, s->sampling_ratio);
    g->gw = roi_grid(rw, s->ow, s->sampling_ratio);
    const long cnt = (long)g->gh * g->gw;
    g->count = (float)(cnt > 1 ? cnt : 1);
}

/* The taps of the g samples of each of `bins` bins along an axis of `len` pixels: sample i of bin p at
 * start + p * bin + (i + 0.5) * bin / g, into t[p * g + i].  Outside [-1, len] (or NaN): no weight;
 * otherwise clamped to the map as onnxruntime does (below 0 -> 0, at or past the last pixel -> it). */
static void roi_axis_taps(float start, float bin, int bins, int g, int len, roi_tap *t) {
    for (int p = 0; p < bins; ++p)
        for (int i = 0; i < g; ++i) {
            roi_tap *o = t + (long)p * g + i;
            float v = start + (float)p * bin + ((float)i + 0.5f) * bin / (float)g;
            if (!(v >= -1.0f && v <= (float)len)) {
                o->lo = o->hi = 0;
                o->wl = o->wh = 0.0f;
                continue;
            }
            if (v <= 0.0f) v = 0.0f;
            int lo = (int)v, hi;
            if (lo >= len - 1) {
                hi = lo = len - 1;
                v = (float)lo;
            } else {
                hi = lo + 1;
            }
            const float l = v - (float)lo;
            o->lo = lo;
            o->hi = hi;
            o->wl = 1.0f - l;
            o->wh = l;
        }
}

/* ------------------------------------------------------------------ kernel bodies */

#define FN_PASTE(a, b) a##b
#define FN_EXPAND(a, b) FN_PASTE(a, b)
#define FN(name) FN_EXPAND(name, MRT_SUFFIX)

/* The depthwise epilogue's SiLU / Sigmoid pass (FN(dw_act_rows)) at 16 lanes on an AVX-512 machine,
 * whose depthwise layers mostly run the AVX2 tasks (dwconv2d_avx512_dispatch): the exponentials
 * and divisions of 8 lanes cost as much as the convolution itself there (MobileViT's 192-channel
 * 3x3 + SiLU at 64 x 64: 1.29x -> 0.98x onnxruntime, D83).  Set by mrt_select_isa (NULL: each copy its own). */
static void (*dw_act_rows_wide)(float *y, long n, int act, float a0, float a1) = NULL;

#define MRT_SUFFIX _base
#define MRT_TARGET
#define MRT_VL 4
#include "float_copy.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MRT_HAVE_AVX2_BUILD 1
#define MRT_SUFFIX _avx2
#define MRT_TARGET __attribute__((target("avx2,fma")))
#define MRT_VL 8
#include "float_copy.h"

/* AVX-512: the GEMM, the pooling (its stride-2 max pool on 16 lanes) and the depthwise conv (large
 * kernels only, see dwconv2d_avx512_dispatch) differ; the other kernels use the AVX2 copies. */
#define MRT_SUFFIX _avx512
#define MRT_TARGET __attribute__((target("avx512f,avx2,fma")))
/* the depthwise epilogue's row activation: the AVX2 copy (no kernels_impl.h at this level) */
static inline MRT_TARGET void act_row_avx512(float *restrict y, long n, int act, float a0, float a1) {
    act_row_avx2(y, n, act, a0, a1);
}
#define MRT_VL 16
#include "pool_impl.h"
#include "gemm_impl.h"
#include "rowops_impl.h"
#include "sdpa_impl.h"
#include "rnn_impl.h"
#include "dwconv_impl.h"
#include "winograd_impl.h"
#undef MRT_VL
#undef MRT_SUFFIX
#undef MRT_TARGET
#endif

/* 32-bit ARM (armhf: Raspberry Pi OS 32-bit, Debian armhf).  Debian's baseline is ARMv7-A with
 * VFPv3-D16 and no NEON, so the _base copy above is scalar VFP code; this second copy of the float
 * kernels is compiled for NEON with VFPv4 (fused multiply-add: every Pi from the Pi 2 on) and only
 * ever called after getauxval(AT_HWCAP) reported both (mrt_select_isa).  Two notes:
 * - GCC lowers float vector-extension arithmetic to NEON on 32-bit ARM only under
 *   -funsafe-math-optimizations (NEON's float unit flushes denormals to zero, so it is not IEEE
 *   754); without it this copy would be the scalar code again.  Hence the optimize pragma, for this
 *   copy alone, with the parts of that option that change results switched back off: reassociation
 *   would fold the (t + 1.5 * 2^23) - 1.5 * 2^23 rounding of the exp and requantization code into t
 *   (softmax and sigmoid went wrong by 0.05), reciprocals and signed zeros would differ from the other
 *   copies.  What stays is NEON itself: denormal inputs and results of its float operations are zero.
 * - A pragma rather than MRT_TARGET, so that every function the headers define here (helpers
 *   without MRT_TARGET included) is compiled for NEON and can be inlined into the kernels.
 * ARMv6 builds (Raspberry Pi OS's own toolchain for the Pi Zero / 1) have no NEON: the baseline only. */
#if defined(__arm__) && !defined(__aarch64__) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__ARM_ARCH) && __ARM_ARCH >= 7 && !defined(__ARM_NEON)
#define MRT_HAVE_NEON32_BUILD 1
#pragma GCC push_options
#pragma GCC target("fpu=neon-vfpv4")
#pragma GCC optimize("unsafe-math-optimizations", "no-associative-math", "no-reciprocal-math", "signed-zeros")
#define MRT_SUFFIX _neon32
#define MRT_TARGET
#define MRT_VL 4
#include "float_copy.h"
#pragma GCC pop_options
#endif

#include "qgemm.h"
#include "qdwconv_vnni.h"
#include "qwinograd_avx2.h"

/* ------------------------------------------------------------------ dispatch */

typedef struct {
    void (*dwconv2d)(const float *, const float *, const float *, const float *, float *, int, int, int, int, int, int,
                     int, int, int, int, int, int, int, int, int, float, float, int);
    void (*pool2d)(int, const float *, float *, int, int, int, int, int, int, int, int, int, int, int, int, int, int,
                   int, int, int, float, int);
    void (*bias_act)(float *, const float *, const float *, int, int, long, int, float, float, int);
    void (*im2col)(const float *, float *, long, int, int, int, int, int, int, int, int, int, int, int, int, int, int);
    void (*sgemm)(int, int, int, int, const float *, long, long, const float *, long, long, int, float *, long, long,
                  const float *, int, const float *, long, long, int, float, float, int, int);
    void (*sgemm_conv)(int, int, int, const float *, const float *, const long *, int, int, int, float *, long,
                       const float *, const float *, int, float, float, int, int);
    void (*qdwconv2d)(const q_dw_params *, int, int, int, int, int, int, int, int, int, int, int, int, int, int,
                      int);
    /* the channel-vector implicit convolution (gemm_impl.h, FN(conv_cv)) and its weight packing */
    void (*conv_cv)(int, int, const float *, const mrt_cv_region *, int, float *, long, const float *, const float *,
                    int, float, float, int, int);
    void (*conv_cv_pack_w)(const float *, int, int, int, float *);
    long (*conv_cv_packed_floats)(int, int, int);
    /* products with B packed once (gemm_impl.h, FN(sgemm_pb)) and that packing */
    void (*sgemm_pb)(int, int, int, const float *, long, const float *, float *, long, const float *, int,
                     const float *, long, int, float, float, int);
    void (*sgemm_pack_b_all)(const float *, long, int, int, int, float *);
    long (*sgemm_packed_b_floats)(int, int);
    /* the Winograd F(2x2, 3x3) convolution (winograd_impl.h) */
    int (*conv_winograd)(const mrt_conv_geometry *, const float *, const float *, const float *, int, float, float,
                         const float *, float *, int);
} mrt_impl;

#ifdef MRT_HAVE_AVX2_BUILD
/* Depthwise at the AVX-512 level: 16 lanes pay on the channel-blocked path
 * (every tap one FMA over 16 channels), on the direct stride-2 path (rows
 * of 16 output columns and more, dw_use_direct_s2) and for kernels of 5x5
 * and up; 3x3 layers on the plane path (outputs in planes whose 16-channel
 * blocks would alias in L1, see dw_use_blocked) are bound by copies and
 * per-row costs, and with rows narrower than 16 columns waste half a
 * vector, so they keep the AVX2 code (docs/decisions.md, D44). */
static void dwconv2d_avx512_dispatch(const float *x, const float *w, const float *bias, const float *z, float *y,
                                     int n, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw,
                                     int pt, int pl, int oh, int ow, int act, float a0, float a1, int nthreads) {
    if (kh * kw >= 25 || dw_use_blocked_avx512(oh, ow) || dw_use_direct_s2_avx512(kh, kw, sh, sw, dh, dw, pl, ow))
        dwconv2d_avx512(x, w, bias, z, y, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, a0, a1, nthreads);
    else
        dwconv2d_avx2(x, w, bias, z, y, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, a0, a1, nthreads);
}
/* The int8 depthwise conv (the same code on integer values) runs the plane path only (dw_run), so
 * it keeps the plane path's choice: 16 lanes for 5x5 and up. */
static void qdwconv2d_avx512_dispatch(const q_dw_params *q, int n, int c, int h, int wd, int kh, int kw, int sh,
                                      int sw, int dh, int dw, int pt, int pl, int oh, int ow, int nthreads) {
    if (kh * kw >= 25)
        qdwconv2d_avx512(q, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, nthreads);
    else
        qdwconv2d_avx2(q, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, nthreads);
}
#endif

static const mrt_impl impl_base = {dwconv2d_base,  pool2d_base,         bias_act_base,
                                   im2col_base,    sgemm_base,          sgemm_conv_base,
                                   qdwconv2d_base, conv_cv_base,        conv_cv_pack_w_base,
                                   conv_cv_packed_floats_base, sgemm_pb_base, sgemm_pack_b_all_base,
                                   sgemm_packed_b_floats_base, conv_winograd_base};
#ifdef MRT_HAVE_AVX2_BUILD
static const mrt_impl impl_avx2 = {dwconv2d_avx2,  pool2d_avx2,         bias_act_avx2,
                                   im2col_avx2,    sgemm_avx2,          sgemm_conv_avx2,
                                   qdwconv2d_avx2, conv_cv_avx2,        conv_cv_pack_w_avx2,
                                   conv_cv_packed_floats_avx2, sgemm_pb_avx2, sgemm_pack_b_all_avx2,
                                   sgemm_packed_b_floats_avx2, conv_winograd_avx2};
static const mrt_impl impl_avx512 = {dwconv2d_avx512_dispatch,  pool2d_avx512,         bias_act_avx2,
                                     im2col_avx2,               sgemm_avx512,        sgemm_conv_avx512,
                                     qdwconv2d_avx512_dispatch, conv_cv_avx512,      conv_cv_pack_w_avx512,
                                     conv_cv_packed_floats_avx512, sgemm_pb_avx512, sgemm_pack_b_all_avx512,
                                   sgemm_packed_b_floats_avx512, conv_winograd_avx512};
#endif
#ifdef MRT_HAVE_NEON32_BUILD
static const mrt_impl impl_neon32 = {dwconv2d_neon32,  pool2d_neon32,         bias_act_neon32,
                                     im2col_neon32,    sgemm_neon32,          sgemm_conv_neon32,
                                     qdwconv2d_neon32, conv_cv_neon32,        conv_cv_pack_w_neon32,
                                     conv_cv_packed_floats_neon32, sgemm_pb_neon32, sgemm_pack_b_all_neon32,
                                     sgemm_packed_b_floats_neon32, conv_winograd_neon32};
#endif

static const mrt_impl *impl = &impl_base;
static int impl_isa = MRT_ISA_BASELINE;

static unsigned detect_features(void) {
    unsigned f = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) f |= MRT_FEAT_AVX2;
    if (__builtin_cpu_supports("fma")) f |= MRT_FEAT_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= MRT_FEAT_AVX512F;
    if (__builtin_cpu_supports("avx512vnni")) f |= MRT_FEAT_AVX512VNNI;
    {
        unsigned a, b, c, d;
        /* CPUID.(7, 0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8 */
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1)) f |= MRT_FEAT_AMX;
    }
#elif defined(__aarch64__)
    f |= MRT_FEAT_NEON; /* Advanced SIMD is part of the AArch64 baseline */
#if defined(__linux__)
    {
        unsigned long hw = getauxval(AT_HWCAP);
        if (hw & (1UL << 20)) f |= MRT_FEAT_ASIMDDP; /* HWCAP_ASIMDDP: ARMv8.2 dot product (Pi 5) */
    }
#endif
#elif defined(__arm__) && defined(__linux__)
    /* 32-bit ARM: NEON is optional in ARMv7 (Debian armhf's baseline has none); VFPv4 brings the fused
     * multiply-add, reported as MRT_FEAT_FMA.  Every Pi from the Pi 2 on has both. */
    {
        unsigned long hw = getauxval(AT_HWCAP);
        if (hw & (1UL << 12)) f |= MRT_FEAT_NEON; /* HWCAP_NEON */
        if (hw & (1UL << 16)) f |= MRT_FEAT_FMA;  /* HWCAP_VFPv4 */
    }
#elif defined(__ARM_NEON)
    f |= MRT_FEAT_NEON;
#endif
    return f;
}

int mrt_abi_version(void) { return MRT_ABI_VERSION; }

unsigned mrt_cpu_features(void) { return detect_features(); }

/* MADV_POPULATE_WRITE (Linux 5.14) faults the range in within one call, without a trap per page (on a
 * virtual machine each costs several microseconds: magika's 8 MB arena, 2,100 faults, made its first
 * run ~6 ms slower than the next).  Older kernels reject the advice (EINVAL): the pages are then
 * written one by one here, which costs what the run would have paid. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* Write the byte at address a with its own value: its page is faulted in for writing, the memory
 * unchanged (a program's buffers hold the recording run's results when they are prefaulted). */
static void mrt_touch(uintptr_t a) {
    volatile char *c = (volatile char *)a;
    *c = *c;
}

int mrt_prefault(void *p, long n) {
    if (!p || n <= 0) return 0;
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t lo = (uintptr_t)p, hi = lo + (uintptr_t)n;
#if defined(__linux__)
    const uintptr_t alo = (lo + page - 1) / page * page, ahi = hi / page * page;
    if (ahi > alo && madvise((void *)alo, ahi - alo, MADV_POPULATE_WRITE) == 0) {
        mrt_touch(lo); /* the partial pages at the ends */
        mrt_touch(hi - 1);
        return 1;
    }
#endif
    for (uintptr_t q = lo; q < hi; q = (q / page + 1) * page) mrt_touch(q);
    mrt_touch(hi - 1);
    return 0;
}

#ifdef MRT_HAVE_AMX_BUILD
/* Whether Linux lets this process use the AMX tile data (XTILEDATA, state component 18): asked once
 * with arch_prctl(ARCH_REQ_XCOMP_PERM); a kernel before 5.16, or one that refuses, says no and the
 * int8 GEMMs keep the VNNI microkernels.  The permission covers every thread of the process. */
static int amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) {
        enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
        unsigned long bits = 0;
        permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
                    syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) == 0 && (bits >> XFEATURE_XTILEDATA & 1);
    }
    return permitted;
}
#endif

int mrt_select_isa(int isa) {
    unsigned f = detect_features();
    int avx2_ok = 0;
#ifdef MRT_HAVE_AVX2_BUILD
    avx2_ok = (f & MRT_FEAT_AVX2) && (f & MRT_FEAT_FMA);
#endif
    int avx512_ok = avx2_ok && (f & MRT_FEAT_AVX512F);
    (void)f;
    q_use_vnni = 0;
    q_use_avx2 = 0;
    q_use_amx = 0;
    q_use_neon = 0;
    q_use_dotprod = 0;
    q_act_row = act_row_base;
    dw_act_rows_wide = NULL;
#ifdef MRT_HAVE_NEON_BUILD
    /* aarch64: the float kernels are the baseline code (NEON is the AArch64
     * baseline, and explicit intrinsics did not beat what GCC makes of the
     * vector-extension GEMM: docs/decisions.md, D18); the levels differ in the
     * int8 GEMM.  "best" takes the dot product when the CPU reports it. */
    if (isa == MRT_ISA_BEST || isa == MRT_ISA_NEON || isa == MRT_ISA_DOTPROD) {
        impl = &impl_base;
        q_use_neon = 1;
        if ((isa == MRT_ISA_BEST || isa == MRT_ISA_DOTPROD) && (f & MRT_FEAT_ASIMDDP)) {
            q_use_dotprod = 1;
            impl_isa = MRT_ISA_DOTPROD;
        } else {
            impl_isa = MRT_ISA_NEON;
        }
        return impl_isa;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    /* 32-bit ARM: "neon" (and "best", and "dotprod", which 32-bit builds do not have) takes the NEON copy
     * of the float kernels when the CPU has NEON and VFPv4; the int8 GEMM is the portable one at every
     * level.  Otherwise, and for "baseline", the scalar VFP code. */
    if ((isa == MRT_ISA_BEST || isa == MRT_ISA_NEON || isa == MRT_ISA_DOTPROD) && (f & MRT_FEAT_NEON) &&
        (f & MRT_FEAT_FMA)) {
        impl = &impl_neon32;
        impl_isa = MRT_ISA_NEON;
        q_act_row = act_row_neon32;
        return impl_isa;
    }
#endif
    if ((isa == MRT_ISA_BEST || isa == MRT_ISA_AVX512 || isa == MRT_ISA_AVX512_VNNI) && avx512_ok) {
#ifdef MRT_HAVE_AVX2_BUILD
        impl = &impl_avx512;
        impl_isa = MRT_ISA_AVX512;
        dw_act_rows_wide = dw_act_rows_avx512;
        q_use_avx2 = 1;
        q_act_row = act_row_fast_avx512;
        q_use_vnni = (f & MRT_FEAT_AVX512VNNI) != 0;
#ifdef MRT_HAVE_AMX_BUILD
        q_use_amx = isa != MRT_ISA_AVX512_VNNI && q_use_vnni && (f & MRT_FEAT_AMX) && amx_permitted();
#endif
#endif
    } else if ((isa == MRT_ISA_BEST || isa == MRT_ISA_AVX2 || isa == MRT_ISA_AVX512) && avx2_ok) {
#ifdef MRT_HAVE_AVX2_BUILD
        impl = &impl_avx2;
        impl_isa = MRT_ISA_AVX2;
        q_use_avx2 = 1;
        q_act_row = act_row_fast_avx2;
#endif
    } else {
        impl = &impl_base;
        impl_isa = MRT_ISA_BASELINE;
    }
    return impl_isa;
}

int mrt_current_isa(void) { return impl_isa; }

int mrt_max_threads(void) { return MRT_MAX_THREADS; }

int mrt_start_threads(int nthreads) {
    if (nthreads > MRT_MAX_THREADS) nthreads = MRT_MAX_THREADS;
    if (nthreads <= 1) return 1;
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool_dispatch); /* (pool_ensure's precondition: no job is being set up) */
    const int have = pool_ensure(nthreads);
    pthread_mutex_unlock(&pool_dispatch);
    return have;
}

/* ------------------------------------------------------------------ entry points */

void mrt_qdwconv2d(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const void *x,
                   const float *res, void *y, int nthreads) {
    if (g->oh <= 0 || g->ow <= 0 || g->n <= 0 || g->c <= 0) return;
    q_dw_params p = {0};
    if (q->x_u8) p.xq = (const uint8_t *)x;
    else p.x = (const float *)x;
    p.x_scale = q->x_scales; p.x_zero = q->x_zeros; p.w = q->w; p.scale = q->scale;
    p.bias = e->bias; p.res = res;
    if (q->y_u8) {
        p.yq = (uint8_t *)y;
        p.y_scale = q->y_scale; p.y_zero = q->y_zero;
    } else {
        p.y = (float *)y;
    }
    p.act = e->act; p.a0 = e->a0; p.a1 = e->a1; p.post_a = e->post_a; p.post_b = e->post_b;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_dw_vnni(&p, g->n, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh, g->ow,
                  nthreads))
        return;
#endif
    impl->qdwconv2d(&p, g->n, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh, g->ow,
                    nthreads);
}

void mrt_dwconv2d_f32(const mrt_conv_geometry *g, const float *w, const mrt_epilogue *e, const float *x,
                      const float *res, float *y, int nthreads) {
    impl->dwconv2d(x, w, e->bias, res, y, g->n, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt,
                   g->pl, g->oh, g->ow, e->act, e->a0, e->a1, nthreads);
}

/* The n * c planes of a pooling geometry, for the kernels taking an int count of planes: 0 when the
 * product does not fit (the caller validated the sizes; this keeps a wrong one from wrapping around). */
static int pool_planes(const mrt_conv_geometry *g) {
    const long nc = (long)g->n * g->c;
    return nc < 0 || nc > 0x7fffffffL ? 0 : (int)nc;
}

void mrt_maxpool2d_f32(const mrt_conv_geometry *g, const float *x, float *y, int nthreads) {
    impl->pool2d(1, x, y, pool_planes(g), g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh,
                 g->ow, 0, 0, 0, 0, 0.0f, nthreads);
}

void mrt_avgpool2d_f32(const mrt_conv_geometry *g, const int *count_box, float scale, const float *x, float *y,
                       int nthreads) {
    impl->pool2d(0, x, y, pool_planes(g), g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh,
                 g->ow, count_box[0], count_box[1], count_box[2], count_box[3], scale, nthreads);
}

void mrt_bias_act_f32(const mrt_epilogue *e, float *y, const float *res, int n, int c, long plane, int nthreads) {
    impl->bias_act(y, e->bias, res, n, c, plane, e->act, e->a0, e->a1, nthreads);
}

void mrt_im2col_f32(const mrt_conv_geometry *g, const float *x, float *cols, int nthreads) {
    impl->im2col(x, cols, (long)g->oh * g->ow, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt,
                 g->pl, g->oh, g->ow, nthreads);
}

static void sgemm_one(int M, int N, int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc,
                      const float *bias, int bias_mode, const float *res, long ldr, int act, float a0, float a1,
                      int nthreads) {
    impl->sgemm(1, M, N, K, A, lda, 0, B, ldb, 0, 0, C, ldc, 0, bias, bias_mode, res, ldr, 0, act, a0, a1, nthreads,
                0); /* (bands of a transposed conv: their widths may follow the threads) */
}

void mrt_sgemm_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *B, float *C,
                   const float *res, int nthreads) {
    impl->sgemm(s->batch, s->M, s->N, s->K, A, s->lda, s->sa, B, s->ldb, s->sb, s->transb, C, s->ldc, s->sc, e->bias,
                s->bias_mode, res, s->ldr, s->sr, e->act, e->a0, e->a1, nthreads, 1);
}

long mrt_sgemm_packed_b_floats(int K, int N) { return impl->sgemm_packed_b_floats(K, N); }

void mrt_sgemm_pack_b_f32(const float *B, long ldb, int transb, int K, int N, float *out) {
    impl->sgemm_pack_b_all(B, ldb, transb, K, N, out);
}

void mrt_sgemm_pb_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *bpack, float *C,
                      const float *res, int nthreads) {
    impl->sgemm_pb(s->M, s->N, s->K, A, s->lda, bpack, C, s->ldc, e->bias, s->bias_mode, res, s->ldr, e->act, e->a0,
                   e->a1, nthreads);
}

void mrt_sgemv_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *B, float *C,
                   int nthreads) {
    const int M = s->M, N = s->N, K = s->K, transb = s->transb, act = e->act;
    const long lda = s->lda, ldb = s->ldb, ldc = s->ldc;
    const float *bias = e->bias;
    const float a0 = e->a0, a1 = e->a1;
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) {
        sgemv_avx512(M, N, K, A, lda, B, ldb, transb, C, ldc, bias, act, a0, a1, nthreads);
        return;
    }
    if (impl_isa == MRT_ISA_AVX2) {
        sgemv_avx2(M, N, K, A, lda, B, ldb, transb, C, ldc, bias, act, a0, a1, nthreads);
        return;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        sgemv_neon32(M, N, K, A, lda, B, ldb, transb, C, ldc, bias, act, a0, a1, nthreads);
        return;
    }
#endif
    sgemv_base(M, N, K, A, lda, B, ldb, transb, C, ldc, bias, act, a0, a1, nthreads);
}

void mrt_softmax_f32(const float *x, float *y, long rows, long n, int log, int nthreads) {
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) {
        softmax_rows_avx512(x, y, rows, n, log, nthreads);
        return;
    }
    if (impl_isa == MRT_ISA_AVX2) {
        softmax_rows_avx2(x, y, rows, n, log, nthreads);
        return;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        softmax_rows_neon32(x, y, rows, n, log, nthreads);
        return;
    }
#endif
    softmax_rows_base(x, y, rows, n, log, nthreads);
}

int mrt_sdpa_f32(const mrt_sdpa_shape *s, const float *q, const float *k, const float *v, const float *mask, float *out,
                 int nthreads) {
    if (s->bh < 0 || s->sq < 0 || s->sk < 1 || s->d < 1 || s->dv < 0 || s->mask_b < 0 || s->mask_r < 0) return -2;
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) return sdpa_avx512(s, q, k, v, mask, out, nthreads);
    if (impl_isa == MRT_ISA_AVX2) return sdpa_avx2(s, q, k, v, mask, out, nthreads);
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) return sdpa_neon32(s, q, k, v, mask, out, nthreads);
#endif
    return sdpa_base(s, q, k, v, mask, out, nthreads);
}

/* LayerNormalization (per_row 0), InstanceNormalization (per_row 1) and RMS normalization (2) rows:
 * rowops_impl.h */
static void layernorm_dispatch(const float *x, const float *scale, const float *bias, float *y, long rows, long n,
                               int per_row, float eps, int nthreads) {
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) {
        layernorm_rows_avx512(x, scale, bias, y, rows, n, per_row, eps, nthreads);
        return;
    }
    if (impl_isa == MRT_ISA_AVX2) {
        layernorm_rows_avx2(x, scale, bias, y, rows, n, per_row, eps, nthreads);
        return;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        layernorm_rows_neon32(x, scale, bias, y, rows, n, per_row, eps, nthreads);
        return;
    }
#endif
    layernorm_rows_base(x, scale, bias, y, rows, n, per_row, eps, nthreads);
}

void mrt_layernorm_f32(const float *x, const float *scale, const float *bias, float *y, long rows, long n, float eps,
                       int nthreads) {
    layernorm_dispatch(x, scale, bias, y, rows, n, 0, eps, nthreads);
}

void mrt_instancenorm_f32(const float *x, const float *scale, const float *bias, float *y, long rows, long n, float eps,
                          int nthreads) {
    layernorm_dispatch(x, scale, bias, y, rows, n, 1, eps, nthreads);
}

void mrt_rmsnorm_f32(const float *x, const float *scale, float *y, long rows, long n, float eps, int nthreads) {
    layernorm_dispatch(x, scale, NULL, y, rows, n, 2, eps, nthreads);
}

int mrt_qgemm_isa(void) { return q_use_amx ? 4 : q_use_vnni ? 1 : q_use_dotprod ? 2 : q_use_avx2 ? 3 : 0; }

/* ------------------------------------------------------------------ whole float convolution
 *
 * mrt_conv2d_f32: im2col + GEMM (+ fused epilogue) for a whole batch in one call.  Images
 * are processed in chunks of `nb`: a chunk's columns go side by side into one
 * (c*kh*kw) x (nb*oh*ow) matrix so that small planes (8x8, 4x4) still make GEMMs wide
 * enough for the microkernel; with nb > 1 the GEMM writes a per-thread scratch whose rows
 * are copied into y's (n, m, oh*ow) layout, then residual + activation run on each copied
 * block.  With enough chunks for the threads, each thread takes whole chunks
 * (single-threaded im2col and GEMM, per-thread scratch); otherwise (batch 1, or fewer
 * images than threads) the chunks run one after the other with threaded im2col and GEMM,
 * as the per-image Python loop did.  The accumulation order of every output is the same
 * as that of mrt_sgemm_f32 on one image, whatever nb and the threads.
 *
 * Images that get a GEMM of their own (nb = 1) skip im2col when their output rows are wide
 * enough ("implicit" mode): the input is copied once, zero-padded and split by stride phase, into
 * planes of hq x wq floats, where phase (py, px) of channel ch holds
 *   plane[i][j] = x[ch][i * sh + py - pt][j * sw + px - pl]   (0 outside x).
 * Tap (ky, kx) of output (oy, ox) is then plane (ky*dh % sh, kx*dw % sw) at
 * [oy + ky*dh / sh][ox + kx*dw / sw]: every row of the im2col matrix is a contiguous run of a
 * plane read with row stride wq instead of ow, which is the extended-grid GEMM of gemm_impl.h
 * (FN(sgemm_conv)): the microkernel reads B straight from the planes, no im2col matrix.  The
 * wq - ow extra columns per output row are computed and dropped, so this mode is only used
 * when they are few (MRT_CONV_IMPLICIT_WASTE).  A 1x1 / stride 1 / unpadded kernel ("direct")
 * needs no planes at all: the image is its own plane (wq = ow, nothing dropped).
 * The planes are built for bands of `band` output rows at a time (hq = band + the taps' reach
 * rows each), small enough to stay in L2 between their copy and the GEMM that reads them
 * (MRT_CONV_BAND_BYTES); with several threads and one image, the threads take whole bands
 * (planes and GEMM single-threaded, no fork-join inside a band).
 * The channel-vector kernel (packed weights) builds no planes for strided layers: it reads the
 * image in place and copies only windows around its borders (conv_in_place, below).
 */

/* Target GEMM width (columns) when batching small planes: one column block of the GEMM.  (1024 was
 * 1.5x faster on the digits CNN at batch 360 before the row tiles swept the packed block; since, 256
 * is best: 13.3 ms against 22.7 with 1024, onnxruntime 4.8-6 ms.) */
#define MRT_CONV_BATCH_COLS 256
/* A 1x1 / stride 1 / unpadded kernel ("direct") over planes of at least this many pixels runs one GEMM
 * per image, reading the image in place and writing y, whatever the batch: images side by side cost a
 * copy of the input (im2col) and one of the result, more than narrow GEMMs lose.  Measured on AVX2 (1
 * thread, 4-32 images): PP-OCR cls's 32 -> 200 and 200 -> 32 over 2 x 96 pixels 14 and 8 % faster,
 * 64 -> 128 over 8 x 8 17 %, 12 x 12 18 %, 4 x 4 30 %, 96 -> 24 over 5 x 5 35 %; over 3 x 3 pixels
 * 64 -> 128 was 30 % slower (and 256 -> 64 2x faster), over 2 x 2 2x slower: those stay batched. */
#define MRT_CONV_DIRECT_MIN_PIXELS 16
/* Implicit mode when the dropped columns are at most 1 / MRT_CONV_IMPLICIT_WASTE of the grid. */
#define MRT_CONV_IMPLICIT_WASTE 4
/* Planes of one band: at most about this many bytes (L2 is 1-2 MB on the targets), unless a
 * band would then have fewer than MRT_CONV_BAND_COLS output columns (GEMM too narrow). */
#define MRT_CONV_BAND_BYTES (512L * 1024)
#define MRT_CONV_BAND_COLS 2048
/* A direct 1x1 conv reads B (the image) in place up to this depth on AVX-512 (see mrt_conv_band). */
#define MRT_CONV_IN_PLACE_K 128

typedef struct {
    const mrt_impl *I;
    const float *x, *w, *bias, *res;
    float *y;
    int n, c, h, wd, m, group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act;
    float a0, a1;
    int nb, direct; /* images per GEMM; direct: 1x1, stride 1, no padding */
    int implicit, band, hq, wq; /* implicit mode: output rows per band, its phase planes (hq x wq floats) */
    const float *packed_w; /* implicit mode on the channel-vector kernel: its packed weights (else NULL) */
    int in_place; /* implicit mode, channel-vector kernel, not direct: conv_in_place instead of planes */
    size_t scratch_bytes;
    int failed;
} mrt_conv_args;

/* Does some tap t < k (dilation d) fall on stride phase `phase` ((t * d) % s)? */
static int conv_phase_used(int k, int d, int s, int phase) {
    for (int t = 0; t < k; ++t)
        if ((t * d) % s == phase) return 1;
    return 0;
}

/* dst[j] = src[2 j], j < n: the even lanes of two vectors per four outputs (GCC vector
 * extensions; GCC does not vectorise the plain strided loop). */
typedef float conv_v4f __attribute__((vector_size(16)));
typedef float conv_v4fu __attribute__((vector_size(16), aligned(4)));
typedef int conv_v4i __attribute__((vector_size(16)));
#if defined(__clang__)
#define CONV_EVEN_LANES(lo, hi) __builtin_shufflevector(lo, hi, 0, 2, 4, 6)
#define CONV_ODD_LANES(lo, hi) __builtin_shufflevector(lo, hi, 1, 3, 5, 7)
#else
#define CONV_EVEN_LANES(lo, hi) __builtin_shuffle(lo, hi, (conv_v4i){0, 2, 4, 6})
#define CONV_ODD_LANES(lo, hi) __builtin_shuffle(lo, hi, (conv_v4i){1, 3, 5, 7})
#endif
static void gather_stride2(float *restrict dst, const float *restrict src, int n) {
    float *const end = dst + n;
    /* 8 outputs per step while more than 8 remain: reads src[0 .. 15], within src[2 (remaining - 1)]
     * (pointer steps, two shuffles: the per-element index arithmetic of a plain loop cost twice as much) */
    for (; end - dst > 8; dst += 8, src += 16) {
        const conv_v4f a = *(const conv_v4fu *)src, b = *(const conv_v4fu *)(src + 4);
        const conv_v4f c = *(const conv_v4fu *)(src + 8), d = *(const conv_v4fu *)(src + 12);
        *(conv_v4fu *)dst = CONV_EVEN_LANES(a, b);
        *(conv_v4fu *)(dst + 4) = CONV_EVEN_LANES(c, d);
    }
    if (end - dst > 4) { /* reads src[0 .. 7], within src[2 (remaining - 1)] */
        const conv_v4f a = *(const conv_v4fu *)src, b = *(const conv_v4fu *)(src + 4);
        *(conv_v4fu *)dst = CONV_EVEN_LANES(a, b);
        dst += 4;
        src += 8;
    }
    for (; dst < end; ++dst, src += 2) *dst = *src;
}

/* even[k] = src[2 k], odd[k] = src[2 k + 1], k < n (reads src[0 .. 2 n - 1]): both column phases of
 * a stride-2 row in one pass over it (half the loads of two gather_stride2 calls). */
#ifdef MRT_HAVE_AVX2_BUILD
/* split_stride2's whole 16-float steps on AVX-512 (two loads, two two-source permutes, two stores
 * per 16 outputs of each phase, against 4 of each per 4 outputs): returns how many were split. */
__attribute__((target("avx512f"))) static int split_stride2_avx512(float *restrict even, float *restrict odd,
                                                                   const float *restrict src, int n) {
    const __m512i even_lanes = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd_lanes = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int k = 0;
    for (; k + 16 <= n; k += 16, src += 32) {
        const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
        _mm512_storeu_ps(even + k, _mm512_permutex2var_ps(a, even_lanes, b));
        _mm512_storeu_ps(odd + k, _mm512_permutex2var_ps(a, odd_lanes, b));
    }
    return k;
}
#endif

static void split_stride2(float *restrict even, float *restrict odd, const float *restrict src, int n) {
    int k = 0;
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) {
        k = split_stride2_avx512(even, odd, src, n);
        src += 2L * k;
    }
#endif
    for (; k + 4 <= n; k += 4, src += 8) {
        const conv_v4f a = *(const conv_v4fu *)src, b = *(const conv_v4fu *)(src + 4);
        *(conv_v4fu *)(even + k) = CONV_EVEN_LANES(a, b);
        *(conv_v4fu *)(odd + k) = CONV_ODD_LANES(a, b);
    }
    for (; k < n; ++k, src += 2) {
        even[k] = src[0];
        odd[k] = src[1];
    }
}
#undef CONV_EVEN_LANES
#undef CONV_ODD_LANES

/* Zeros over dst[0 .. lo) and dst[hi .. n), the margins of a plane row, and possibly over part of
 * dst[lo .. hi), which the caller writes afterwards.  Margins of at most 4 floats in a row of at least
 * 4 (the usual padding) take one 4-float store at each end: a memset call per margin cost more
 * than the row (~5 % of a 64 -> 64 3x3 conv over 20 x 20 pixels, ~8 % of a stride-2 128 -> 256 one
 * over 20 x 20 with its two column phases). */
static void plane_row_margins(float *dst, int lo, int hi, int n) {
    if (n >= 4 && lo <= 4 && n - hi <= 4) {
        const conv_v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
        *(conv_v4fu *)dst = zero;
        *(conv_v4fu *)(dst + n - 4) = zero;
        return;
    }
    memset(dst, 0, sizeof(float) * lo);
    memset(dst + hi, 0, sizeof(float) * (n - hi));
}

/* dst[j] = lo <= j < hi ? src[j] : 0 for j < n (src[j] is read only for lo <= j < hi): a plane row
 * and its zero margins (plane_row_margins), the inside in 4-float vectors (the last one ending at hi,
 * overlapping the one before) when it has at least 4 floats. */
static void copy_row_padded(float *restrict dst, const float *restrict src, int lo, int hi, int n) {
    plane_row_margins(dst, lo, hi, n);
    if (hi - lo < 4) {
        for (int j = lo; j < hi; ++j) dst[j] = src[j];
        return;
    }
    int j = lo;
    for (; j + 4 < hi; j += 4) *(conv_v4fu *)(dst + j) = *(const conv_v4fu *)(src + j);
    *(conv_v4fu *)(dst + hi - 4) = *(const conv_v4fu *)(src + hi - 4);
}

typedef struct {
    const mrt_conv_args *a;
    const float *x; /* one image (c, h, wd) */
    float *planes;  /* (c, sh, sw, hq, wq), rows oy0 .. oy0 + rows of the whole image's planes */
    int oy0, rows;
} conv_planes_args;

/* Plane columns [*jlo, *jhi) of column phase px come from inside the input row: 0 <= j * sw + px - pl < wd. */
static void conv_plane_cols(const mrt_conv_args *a, int px, int *jlo, int *jhi) {
    const int sw = a->sw, wq = a->wq, lead = a->pl - px, tail = a->wd + a->pl - px;
    int lo = lead <= 0 ? 0 : (lead + sw - 1) / sw, hi = tail <= 0 ? 0 : (tail + sw - 1) / sw;
    if (lo > wq) lo = wq;
    if (hi > wq) hi = wq;
    *jlo = lo;
    *jhi = hi < lo ? lo : hi;
}

/* Both column phases of phase row py of channel ch (stride 2 across): each input row split into
 * its even and odd columns in one pass (split_stride2), the phase planes' margins zeroed.  Phase
 * px reads input column q = 2 j + px - pl, i.e. the even columns (q = 2 k) for one phase and the
 * odd ones (q = 2 k + 1) for the other, each with its own shift between k and j. */
static void conv_planes_pair(const conv_planes_args *pa, int ch, int py, float *dst0) {
    const mrt_conv_args *a = pa->a;
    const int wq = a->wq;
    const long plane = (long)a->hq * wq;
    const float *xc = pa->x + (long)ch * a->h * a->wd;
    int jlo[2], jhi[2], shift[2]; /* shift: k - j, for the even (index 0) and odd (1) columns */
    float *dst[2];                /* row 0 of the band in the planes of the even and odd columns */
    for (int px = 0; px < 2; ++px) {
        const int q0 = px - a->pl;                /* input column of plane column 0 */
        const int odd = q0 & 1;                   /* (two's complement: also for negative q0) */
        conv_plane_cols(a, px, &jlo[odd], &jhi[odd]);
        shift[odd] = (q0 - odd) / 2;              /* exact: q0 - odd is even */
        dst[odd] = dst0 + px * plane;
    }
    /* k = j + shift: the columns both phases have inside the input, split together; the others alone */
    const int ke0 = jlo[0] + shift[0], ke1 = jhi[0] + shift[0], ko0 = jlo[1] + shift[1], ko1 = jhi[1] + shift[1];
    const int k0 = ke0 > ko0 ? ke0 : ko0;
    int k1 = ke1 < ko1 ? ke1 : ko1;
    if (k1 < k0) k1 = k0;
    for (int i = pa->oy0; i < pa->oy0 + pa->rows; ++i) {
        const long r = (long)(i - pa->oy0) * wq;
        float *de = dst[0] + r, *dod = dst[1] + r;
        const int iy = i * a->sh + py - a->pt;
        if (iy < 0 || iy >= a->h) {
            memset(de, 0, sizeof(float) * wq);
            memset(dod, 0, sizeof(float) * wq);
            continue;
        }
        const float *src = xc + (long)iy * a->wd;
        /* a stem (an image of a few channels: the model's input, usually cold in DRAM, unlike the
         * output of the previous layer): the next input row this pair reads, sh rows on, fetched
         * while this one is split (YOLO's 3->16 @320 stem 0.38 -> 0.33 ms in the model; layers of 16+
         * channels got 5 % slower with it) */
        if (a->c <= 4 && iy + a->sh < a->h)
            for (long q = 0; q < a->wd; q += 16) __builtin_prefetch(src + (long)a->sh * a->wd + q);
        plane_row_margins(de, jlo[0], jhi[0], wq);
        plane_row_margins(dod, jlo[1], jhi[1], wq);
        for (int k = ke0; k < k0 && k < ke1; ++k) de[k - shift[0]] = src[2L * k];
        for (int k = k1 > ke0 ? k1 : ke0; k < ke1; ++k) de[k - shift[0]] = src[2L * k];
        for (int k = ko0; k < k0 && k < ko1; ++k) dod[k - shift[1]] = src[2L * k + 1];
        for (int k = k1 > ko0 ? k1 : ko0; k < ko1; ++k) dod[k - shift[1]] = src[2L * k + 1];
        split_stride2(de + (k0 - shift[0]), dod + (k0 - shift[1]), src + 2L * k0, k1 - k0);
    }
}

/* Items: (channel, phase row, phase column); phases no tap reads are skipped.  With stride 2
 * across and both column phases read, the item of phase column 0 builds both (conv_planes_pair)
 * and that of phase column 1 has nothing left to do. */
static void conv_planes_task(void *ctx, long begin, long end) {
    const conv_planes_args *pa = (const conv_planes_args *)ctx;
    const mrt_conv_args *a = pa->a;
    const int sh = a->sh, sw = a->sw, wq = a->wq;
    const int pair = sw == 2 && conv_phase_used(a->kw, a->dw, 2, 0) && conv_phase_used(a->kw, a->dw, 2, 1);
    for (long item = begin; item < end; ++item) {
        const int ch = (int)(item / (sh * sw)), py = (int)(item / sw % sh), px = (int)(item % sw);
        if (!conv_phase_used(a->kh, a->dh, sh, py) || !conv_phase_used(a->kw, a->dw, sw, px)) continue;
        if (pair) {
            if (px == 0) conv_planes_pair(pa, ch, py, pa->planes + item * a->hq * wq);
            continue;
        }
        const float *xc = pa->x + (long)ch * a->h * a->wd;
        float *dst = pa->planes + item * a->hq * wq;
        const int lead = a->pl - px;
        int jlo, jhi;
        conv_plane_cols(a, px, &jlo, &jhi);
        for (int i = pa->oy0; i < pa->oy0 + pa->rows; ++i, dst += wq) {
            const int iy = i * sh + py - a->pt;
            if (iy < 0 || iy >= a->h) {
                memset(dst, 0, sizeof(float) * wq);
                continue;
            }
            const float *src = xc + (long)iy * a->wd - lead; /* src[j * sw] is plane column j */
            if (sw == 1) {
                copy_row_padded(dst, src, jlo, jhi, wq);
                continue;
            }
            plane_row_margins(dst, jlo, jhi, wq);
            if (sw == 2)
                gather_stride2(dst + jlo, src + 2L * jlo, jhi - jlo);
            else
                for (int j = jlo; j < jhi; ++j) dst[j] = src[(long)j * sw];
        }
    }
}

/* Floats of scratch taken by the B row table of K rows (K longs). */
static long conv_table_floats(long K) { return (K * (long)sizeof(long) + sizeof(float) - 1) / sizeof(float); }

/* The groups of a grouped convolution (ResNeXt / RegNet: 8-64 channels per group) as one job:
 * each thread takes whole groups and runs each group's GEMM on its own, instead of every group's
 * small GEMM split over the threads one after another (a job per group, each too small to share:
 * RegNetY's 104 -> 104 @28x28 in 13 groups of 8 took 0.49 ms at 2 threads against 0.32 at 1).
 * When the groups are few and would not share evenly (3 on 2 threads), each group keeps the
 * threads instead.  one(ctx, g, nt) computes group g on nt threads; groups only read what they share. */
typedef void (*conv_group_fn)(void *ctx, int g, int nt);
typedef struct {
    conv_group_fn one;
    void *ctx;
} conv_groups_job;

static void conv_groups_task(void *ctx, long begin, long end) {
    const conv_groups_job *job = (const conv_groups_job *)ctx;
    for (long g = begin; g < end; ++g) job->one(job->ctx, (int)g, 1);
}

/* one() over groups 0 .. group - 1 (see above); unit: a group's work (multiply-adds / 16) */
static void conv_for_groups(int group, long unit, int nt, conv_group_fn one, void *ctx) {
    if (group > 1 && nt > 1 && (group % nt == 0 || group >= 4 * nt)) {
        conv_groups_job job = {one, ctx};
        mrt_parallel_for(group, unit, nt, conv_groups_task, &job);
        return;
    }
    for (int g = 0; g < group; ++g) one(ctx, g, nt);
}

/* The band's planes and B row table as mrt_conv_band built them, for its groups (conv_for_groups). */
typedef struct {
    const mrt_conv_args *a;
    long img;
    int oy0, rows;
    const float *planes;
    long plane;
    const long *brow;
    int b_in_place;
} conv_band_groups;

/* Group g of a band (conv_band_groups) on nt threads: one extended-grid GEMM, or the channel-vector
 * kernel on the planes. */
static void conv_band_group(void *ctx, int g, int nt) {
    const conv_band_groups *bg = (const conv_band_groups *)ctx;
    const mrt_conv_args *a = bg->a;
    const long p = (long)a->oh * a->ow, mp = (long)a->m * p, phases = (long)a->sh * a->sw;
    const int cg = a->c / a->group, mg = a->m / a->group, K = cg * a->kh * a->kw;
    const long out = bg->img * mp + (long)g * mg * p + (long)bg->oy0 * a->ow;
    const float *B = bg->planes + (long)g * cg * phases * bg->plane, *bias = a->bias ? a->bias + (long)g * mg : NULL;
    if (a->packed_w) {
        const mrt_cv_region planes_region = {B, bg->brow, bg->rows, a->ow, a->wq, 1, 0, a->ow};
        a->I->conv_cv(mg, K, a->packed_w + a->I->conv_cv_packed_floats(g, mg, K), &planes_region, 1, a->y + out, p,
                      bias, a->res ? a->res + out : NULL, a->act, a->a0, a->a1, nt, a->kh * a->kw == 1);
    } else
        a->I->sgemm_conv(mg, bg->rows, K, a->w + (long)g * mg * K, B, bg->brow, bg->b_in_place, a->ow, a->wq,
                         a->y + out, p, bias, a->res ? a->res + out : NULL, a->act, a->a0, a->a1, nt,
                         bg->rows == a->oh); /* (a band's rows may follow the threads; the whole image not) */
}

/* Output rows [oy0, oy0 + rows) of image img in implicit mode (see above): the band's planes
 * (none when direct), the B row table, and one extended-grid GEMM per group.  scratch: the
 * table (K longs), then the planes. */
static void mrt_conv_band(const mrt_conv_args *a, long img, int oy0, int rows, float *scratch, int nt) {
    const long p = (long)a->oh * a->ow;
    const long phases = (long)a->sh * a->sw;
    const int kk = a->kh * a->kw, cg = a->c / a->group, mg = a->m / a->group;
    const int K = cg * kk;
    const float *x = a->x + img * (long)a->c * a->h * a->wd;
    long *brow = (long *)scratch;
    const float *planes = x; /* direct: the image is its own (h x wd) plane */
    long plane = p;
    if (!a->direct) {
        float *band_planes = scratch + conv_table_floats(K);
        const int reach = (a->kh - 1) * a->dh / a->sh; /* plane rows below a band's last output row */
        conv_planes_args pa = {a, x, band_planes, oy0, rows + reach};
        plane = (long)a->hq * a->wq;
        mrt_parallel_for(a->c * phases, plane, nt, conv_planes_task, &pa);
        planes = band_planes;
    }
    /* row k = (channel of the group, ky, kx): the taps' offsets in a channel's planes once, then
     * shifted per channel (divisions per row cost ~4% of a 3x3 layer over 128 channels) */
    for (int ky = 0; ky < a->kh; ++ky)
        for (int kx = 0; kx < a->kw; ++kx) {
            const int ry = ky * a->dh, rx = kx * a->dw;
            brow[ky * a->kw + kx] = ((long)(ry % a->sh) * a->sw + rx % a->sw) * plane + (long)(ry / a->sh) * a->wq +
                                    rx / a->sw;
        }
    for (int k = kk; k < K; ++k) brow[k] = brow[k - kk] + phases * plane;
    /* B read in place (whole panels straight from the rows of B) rather than packed: always from
     * planes (the taps of a kernel are shifted views of the same rows, in cache); for a direct 1x1
     * kernel on AVX-512 when its K rows are few (packing them cost 2-8 % of the 1x1 layers of K
     * 32-128 there) and their stride is not a multiple of 2 KB (the panel's rows would then share a
     * few L1 sets: 16->96 @160x160 was 20 % slower in place).  Elsewhere a direct kernel packs B:
     * its row tiles sweep the packed block (FN(sgemm_task)'s rows_outer), measured on AVX2 over
     * 14 x 14 - 112 x 112 pixels, K = 16-116: 16 -> 64 @112x112 0.73 -> 0.67 ms, 32 -> 48 1.47 ->
     * 1.27, 116 -> 116 @14x14 7 % faster (32 -> 16 and 16 -> 16 @112x112 5 % slower). */
    const int b_in_place = !a->direct || (impl_isa == MRT_ISA_AVX512 && K <= MRT_CONV_IN_PLACE_K &&
                                          plane * (long)sizeof(float) % 2048 != 0);
    conv_band_groups bg = {a, img, oy0, rows, planes, plane, brow, b_in_place};
    conv_for_groups(a->group, (long)mg * K * rows * a->ow / 16, nt, conv_band_group, &bg);
}

/* ------------------------------------------------------------------ channel-vector convolution read in place
 *
 * With packed weights (FN(conv_cv)) and a kernel that needs planes (not direct), the image is read
 * where it is instead (D58): the output pixels whose taps all fall inside the image
 * ("inside": a rectangle of output rows and columns) read it in place, pixel (oy, ox) at
 * x[ch][oy * sh - pt + ky * dh][ox * sw - pl + kx * dw] (row stride sh * wd, column stride sw);
 * the others (the "borders": output rows above and below the inside, then output columns left
 * and right of it) read small copies of the input they cover, zero-padded ("windows").  Only the
 * windows are copied (a row or column of taps around the image, against the whole image for the
 * planes), and the inside and the borders run as one FN(conv_cv) job.  Every output keeps the
 * planes' sum (same taps, same k order and K blocks): the results are bit-identical. */

/* Output positions [*lo, *hi) along one axis (input length n, kernel k, stride s, dilation d,
 * leading pad, on outputs) whose taps all fall inside the input: o * s - pad >= 0 and
 * o * s - pad + (k - 1) * d <= n - 1.  Empty (lo == hi) when no output's taps do. */
static void conv_inside_range(int n, int k, int s, int d, int pad, int on, int *lo, int *hi) {
    int first = (pad + s - 1) / s;
    if (first > on) first = on;
    const int last = n - 1 + pad - (k - 1) * d; /* o * s <= last */
    int end = last < 0 ? 0 : last / s + 1;
    if (end > on) end = on;
    *lo = first;
    *hi = end < first ? first : end;
}

/* A rectangle of output pixels [oy0, oy1) x [ox0, ox1) and the input window its taps cover:
 * hw x ww input positions from (iy0, ix0) (the window of the inside is the image itself). */
typedef struct {
    int oy0, oy1, ox0, ox1;
    int iy0, ix0, hw, ww;
} conv_rect;

/* The inside (first, when not empty) and the non-empty borders of the output of a: returns their
 * count (at most MRT_CV_MAX_REGIONS); *window_floats: the floats of all the borders' windows. */
static int conv_in_place_rects(const mrt_conv_args *a, conv_rect *rects, long *window_floats) {
    int y0, y1, x0, x1;
    conv_inside_range(a->h, a->kh, a->sh, a->dh, a->pt, a->oh, &y0, &y1);
    conv_inside_range(a->wd, a->kw, a->sw, a->dw, a->pl, a->ow, &x0, &x1);
    if (x1 == x0) y1 = y0; /* no inside column: every row is a border row */
    const conv_rect all[MRT_CV_MAX_REGIONS] = {
        {y0, y1, x0, x1},      /* inside */
        {0, y0, 0, a->ow},     /* top rows */
        {y1, a->oh, 0, a->ow}, /* bottom rows */
        {y0, y1, 0, x0},       /* left columns */
        {y0, y1, x1, a->ow},   /* right columns */
    };
    int n = 0;
    *window_floats = 0;
    for (int i = 0; i < MRT_CV_MAX_REGIONS; ++i) {
        if (all[i].oy1 <= all[i].oy0 || all[i].ox1 <= all[i].ox0) continue;
        conv_rect r = all[i];
        r.iy0 = r.oy0 * a->sh - a->pt;
        r.ix0 = r.ox0 * a->sw - a->pl;
        r.hw = (r.oy1 - r.oy0 - 1) * a->sh + (a->kh - 1) * a->dh + 1;
        r.ww = (r.ox1 - r.ox0 - 1) * a->sw + (a->kw - 1) * a->dw + 1;
        if (i > 0) *window_floats += (long)a->c * r.hw * r.ww;
        rects[n++] = r;
    }
    return n;
}

/* Windows at most this wide are copied a float at a time (three library calls per row of a
 * 3-wide border column cost more than the copy). */
#define CONV_WINDOW_NARROW 16

/* Does the input window of r lie inside the image (read in place, no window copied)? */
static int conv_rect_inside(const mrt_conv_args *a, const conv_rect *r) {
    return r->iy0 >= 0 && r->ix0 >= 0 && r->iy0 + r->hw <= a->h && r->ix0 + r->ww <= a->wd;
}

/* dst[ch][i][j] = x[ch][r->iy0 + i][r->ix0 + j] for every channel of the image x, 0 outside it. */
static void conv_window(const mrt_conv_args *a, const float *x, const conv_rect *r, float *dst) {
    int jlo = -r->ix0, jhi = a->wd - r->ix0; /* window columns inside the image */
    if (jlo < 0) jlo = 0;
    if (jhi > r->ww) jhi = r->ww;
    if (jhi < jlo) jhi = jlo;
    for (int ch = 0; ch < a->c; ++ch)
        for (int i = 0; i < r->hw; ++i, dst += r->ww) {
            const int iy = r->iy0 + i;
            if (iy < 0 || iy >= a->h) {
                memset(dst, 0, sizeof(float) * r->ww);
                continue;
            }
            const float *src = x + ((long)ch * a->h + iy) * a->wd + r->ix0;
            if (r->ww <= CONV_WINDOW_NARROW) { /* a border column's few floats: no library calls */
                for (int j = 0; j < r->ww; ++j) dst[j] = j >= jlo && j < jhi ? src[j] : 0.0f;
                continue;
            }
            memset(dst, 0, sizeof(float) * jlo);
            memcpy(dst + jlo, src + jlo, sizeof(float) * (jhi - jlo));
            memset(dst + jhi, 0, sizeof(float) * (r->ww - jhi));
        }
}

/* brow[k] for row k = (channel of the group, ky, kx) of the implicit B over channels of `plane`
 * floats and rows of `width` floats. */
static void conv_tap_table(const mrt_conv_args *a, int K, long plane, long width, long *brow) {
    const int kk = a->kh * a->kw;
    for (int ky = 0; ky < a->kh; ++ky)
        for (int kx = 0; kx < a->kw; ++kx) brow[ky * a->kw + kx] = (long)ky * a->dh * width + (long)kx * a->dw;
    for (int k = kk; k < K; ++k) brow[k] = brow[k - kk] + plane;
}

/* Scratch floats of conv_in_place: a tap table per region, then the borders' windows. */
static long conv_in_place_floats(const mrt_conv_args *a) {
    conv_rect rects[MRT_CV_MAX_REGIONS];
    long window_floats;
    conv_in_place_rects(a, rects, &window_floats);
    return MRT_CV_MAX_REGIONS * conv_table_floats((long)a->c / a->group * a->kh * a->kw) + window_floats;
}

/* When reading in place pays, measured in YOLO (docs/decisions.md, D58): strided
 * kernels only (their planes are a phase split, twice the work of a copy; at stride 1 the planes
 * are a memcpy per row and cost as much as the borders' windows: 32 -> 32 @40x40 was 2% slower in
 * place), with at most 1 / MRT_CONV_IN_PLACE_BORDER of the output pixels in the borders (their
 * part-filled pixel tiles and windows: 128 -> 256 / 2 @10x10, 19% border, gained nothing). */
#define MRT_CONV_IN_PLACE_BORDER 8
/* test hook (mrt_conv2d_in_place_mode): -1 by the rule above, 0 never, 1 always */
static int conv_in_place_mode = -1;

int mrt_conv2d_in_place_mode(int mode) {
    const int before = conv_in_place_mode;
    conv_in_place_mode = mode < 0 ? -1 : mode > 0;
    return before;
}

/* Whether the implicit conv of a on the channel-vector kernel (not direct) reads in place. */
static int conv_in_place_pays(const mrt_conv_args *a) {
    if (conv_in_place_mode >= 0) return conv_in_place_mode;
    if (a->sh == 1 && a->sw == 1) return 0;
    /* a grouped convolution of a few channels per group: the planes copy every input channel for
     * only m / group outputs (against hundreds in a dense layer), the windows cost less whatever the
     * border (AVX2, RegNetY, 1 thread: 440 -> 440 / 55 groups @14x14 -> 7x7, 27 % border, 0.20 ->
     * 0.13 ms; 208 -> 208 / 26 @28x28 0.26 -> 0.18) */
    if (a->group > 1 && a->m / a->group < 32) return 1;
    conv_rect rects[MRT_CV_MAX_REGIONS];
    long window_floats, border = 0;
    const int n = conv_in_place_rects(a, rects, &window_floats);
    for (int i = 0; i < n; ++i)
        if (!conv_rect_inside(a, &rects[i])) border += (long)(rects[i].oy1 - rects[i].oy0) * (rects[i].ox1 - rects[i].ox0);
    return border * MRT_CONV_IN_PLACE_BORDER <= (long)a->oh * a->ow;
}

/* The regions of an image read in place (conv_in_place), for its groups (conv_for_groups). */
typedef struct {
    const mrt_conv_args *a;
    long img;
    const mrt_cv_region *regions;
    const long *plane; /* floats per channel of each region's input */
    int nregions;
} conv_in_place_groups;

/* Group g of an image read in place, on nt threads: its channels of every region. */
static void conv_in_place_group(void *ctx, int g, int nt) {
    const conv_in_place_groups *ig = (const conv_in_place_groups *)ctx;
    const mrt_conv_args *a = ig->a;
    const long p = (long)a->oh * a->ow, mp = (long)a->m * p;
    const int cg = a->c / a->group, mg = a->m / a->group, K = cg * a->kh * a->kw;
    mrt_cv_region group_regions[MRT_CV_MAX_REGIONS];
    for (int i = 0; i < ig->nregions; ++i) {
        group_regions[i] = ig->regions[i];
        group_regions[i].B += (long)g * cg * ig->plane[i];
    }
    const long out = ig->img * mp + (long)g * mg * p;
    a->I->conv_cv(mg, K, a->packed_w + a->I->conv_cv_packed_floats(g, mg, K), group_regions, ig->nregions, a->y + out,
                  p, a->bias ? a->bias + (long)g * mg : NULL, a->res ? a->res + out : NULL, a->act, a->a0, a->a1, nt,
                  a->kh * a->kw == 1);
}

/* Image img of a, read in place (see above), on nt threads. */
static void conv_in_place(const mrt_conv_args *a, long img, float *scratch, int nt) {
    const long p = (long)a->oh * a->ow;
    const int cg = a->c / a->group, mg = a->m / a->group, K = cg * a->kh * a->kw;
    const float *x = a->x + img * (long)a->c * a->h * a->wd;
    conv_rect rects[MRT_CV_MAX_REGIONS];
    long window_floats;
    const int n = conv_in_place_rects(a, rects, &window_floats);
    mrt_cv_region regions[MRT_CV_MAX_REGIONS];
    long plane[MRT_CV_MAX_REGIONS]; /* floats per channel of each region's input */
    float *windows = scratch + MRT_CV_MAX_REGIONS * conv_table_floats(K);
    for (int i = 0; i < n; ++i) {
        const conv_rect *r = &rects[i];
        long *brow = (long *)(scratch + i * conv_table_floats(K));
        const int inside = conv_rect_inside(a, r);
        const float *B;
        long width;
        if (inside) { /* the image itself (the inside region, or a border that needs no padding) */
            B = x + (long)r->iy0 * a->wd + r->ix0;
            width = a->wd;
            plane[i] = (long)a->h * a->wd;
        } else {
            conv_window(a, x, r, windows);
            B = windows;
            width = r->ww;
            plane[i] = (long)r->hw * r->ww;
            windows += (long)a->c * plane[i];
        }
        conv_tap_table(a, K, plane[i], width, brow);
        regions[i] = (mrt_cv_region){B, brow, r->oy1 - r->oy0, r->ox1 - r->ox0, (long)a->sh * width, a->sw,
                                     (long)r->oy0 * a->ow + r->ox0, a->ow};
    }
    conv_in_place_groups ig = {a, img, regions, plane, n};
    conv_for_groups(a->group, (long)mg * K * p / 16, nt, conv_in_place_group, &ig);
}

typedef struct {
    mrt_conv_args *a;
    long img;
} conv_bands_args;

/* Items: bands of one image, each on one thread with that thread's scratch. */
static void conv_bands_task(void *ctx, long begin, long end) {
    conv_bands_args *ba = (conv_bands_args *)ctx;
    mrt_conv_args *a = ba->a;
    /* the caller's own buffer has this size already: it is not reallocated under it */
    float *scratch = (float *)mrt_scratch_buffer(a->scratch_bytes);
    if (!scratch) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long b = begin; b < end; ++b) {
        const int oy0 = (int)b * a->band;
        mrt_conv_band(a, ba->img, oy0, a->oh - oy0 < a->band ? a->oh - oy0 : a->band, scratch, 1);
    }
}

/* One image in implicit mode: its bands, over the threads when there are enough of them. */
static void mrt_conv_implicit(mrt_conv_args *a, long img, float *scratch, int nt) {
    const long bands = (a->oh + a->band - 1) / a->band;
    if (nt > 1 && bands >= nt) {
        conv_bands_args ba = {a, img};
        mrt_parallel_for(bands, (long)a->m * a->c / a->group * a->kh * a->kw * a->band * a->ow / 16, nt,
                         conv_bands_task, &ba);
        return;
    }
    for (long b = 0; b < bands; ++b) {
        const int oy0 = (int)b * a->band;
        mrt_conv_band(a, img, oy0, a->oh - oy0 < a->band ? a->oh - oy0 : a->band, scratch, nt);
    }
}

#ifdef MRT_HAVE_AVX2_BUILD
/* Float im2col of one image whose planes have at most 64 output pixels and the input's width at
 * stride 1 ("same" convolutions of small images, e.g. the digits model's 8x8 and 4x4, run as a batch
 * side by side): row (channel, tap) is the plane shifted by the tap's (dy, dx), so it is up to four
 * masked 16-float loads at offset dy * wd + dx and four stores, instead of one short copy per output
 * row (those made im2col 55% of the digits model at batch 360).  Lanes outside the image read 0;
 * masked-off lanes are never read (AVX-512 masked loads do not fault on them).  Up to 7x7 taps. */
enum { PLANE64_MAX_TAPS = 49 };
__attribute__((target("avx512f"))) static void im2col_plane64_f32(const float *x, float *cols, long ld, int c, int h,
                                                                 int wd, int kh, int kw, int dh, int dw, int pt, int pl,
                                                                 int oh, int ow) {
    const int kk = kh * kw, npix = oh * ow, nvec = (npix + 15) / 16;
    const __mmask16 last = npix % 16 ? (__mmask16)((1u << (npix % 16)) - 1) : (__mmask16)0xffff;
    __mmask16 masks[PLANE64_MAX_TAPS][4];
    long offs[PLANE64_MAX_TAPS];
    for (int t = 0; t < kk; ++t) {
        const int dy = (t / kw) * dh - pt, dx = (t % kw) * dw - pl;
        const uint64_t m = plane64_tap_mask(h, wd, oh, ow, dy, dx);
        for (int v = 0; v < 4; ++v) masks[t][v] = (__mmask16)(m >> (16 * v));
        offs[t] = (long)dy * wd + dx;
    }
    for (int ch = 0; ch < c; ++ch) {
        const float *xp = x + (long)ch * h * wd;
        for (int t = 0; t < kk; ++t) {
            float *dst = cols + ((long)ch * kk + t) * ld;
            const float *src = xp + offs[t];
            for (int v = 0; v < nvec; ++v) {
                const __m512 val = _mm512_maskz_loadu_ps(masks[t][v], src + 16 * v);
                if (v < nvec - 1)
                    _mm512_storeu_ps(dst + 16 * v, val);
                else
                    _mm512_mask_storeu_ps(dst + 16 * v, last, val);
            }
        }
    }
}

/* Whether im2col_plane64_f32 applies (AVX-512 in use; the geometry above). */
static int use_im2col_plane64(const mrt_conv_args *a) {
    return impl_isa == MRT_ISA_AVX512 && a->sh == 1 && a->sw == 1 && a->ow == a->wd && (long)a->oh * a->ow <= 64 &&
           a->kh * a->kw <= PLANE64_MAX_TAPS;
}
#endif

/* One image's im2col (mrt_conv_chunk), for its groups (conv_for_groups). */
typedef struct {
    const mrt_conv_args *a;
    long img;
    const float *cols;
} conv_cols_groups;

/* Group g of one image from its im2col, on nt threads: one GEMM straight into y, epilogue fused. */
static void conv_cols_group(void *ctx, int g, int nt) {
    const conv_cols_groups *cg_ = (const conv_cols_groups *)ctx;
    const mrt_conv_args *a = cg_->a;
    const long p = (long)a->oh * a->ow, mp = (long)a->m * p;
    const int mg = a->m / a->group;
    const long K = (long)(a->c / a->group) * a->kh * a->kw;
    const long out = cg_->img * mp + (long)g * mg * p;
    a->I->sgemm(1, mg, (int)p, (int)K, a->w + (long)g * mg * K, K, 0, cg_->cols + (long)g * K * p, p, 0, 0, a->y + out,
                p, 0, a->bias ? a->bias + (long)g * mg : NULL, 1, a->res ? a->res + out : NULL, p, 0, a->act, a->a0,
                a->a1, nt, 1);
}

static void mrt_conv_chunk(mrt_conv_args *a, long chunk, float *scratch, int nt) {
    const mrt_impl *I = a->I;
    const long p = (long)a->oh * a->ow, chw = (long)a->c * a->h * a->wd, mp = (long)a->m * p;
    const int kk = a->kh * a->kw, cg = a->c / a->group, mg = a->m / a->group;
    const long K = (long)cg * kk;
    const long i0 = chunk * a->nb;
    const int nb = a->n - i0 < a->nb ? (int)(a->n - i0) : a->nb;
    if (a->in_place) {
        conv_in_place(a, i0, scratch, nt);
        return;
    }
    if (a->implicit) {
        mrt_conv_implicit(a, i0, scratch, nt);
        return;
    }
    /* im2col (the images of the chunk side by side) and one GEMM per group */
    const long ldb = (long)nb * p;
    float *cols = scratch;
    float *tmp = scratch + (long)a->c * kk * a->nb * p;
#ifdef MRT_HAVE_AVX2_BUILD
    if (use_im2col_plane64(a)) {
        for (int j = 0; j < nb; ++j)
            im2col_plane64_f32(a->x + (i0 + j) * chw, cols + j * p, ldb, a->c, a->h, a->wd, a->kh, a->kw, a->dh, a->dw,
                               a->pt, a->pl, a->oh, a->ow);
    } else
#endif
    for (int j = 0; j < nb; ++j)
        I->im2col(a->x + (i0 + j) * chw, cols + j * p, ldb, a->c, a->h, a->wd, a->kh, a->kw, a->sh, a->sw, a->dh,
                  a->dw, a->pt, a->pl, a->oh, a->ow, nt);
    if (nb == 1) { /* straight into y, whole epilogue fused */
        conv_cols_groups cg_ = {a, i0, cols};
        conv_for_groups(a->group, (long)mg * K * p / 16, nt, conv_cols_group, &cg_);
        return;
    }
    for (int g = 0; g < a->group; ++g) { /* (the images side by side in tmp, shared by the groups) */
        const float *A = a->w + (long)g * mg * K;
        const float *B = cols + (long)g * K * ldb;
        const float *bg = a->bias ? a->bias + (long)g * mg : NULL;
        I->sgemm(1, mg, (int)ldb, (int)K, A, K, 0, B, ldb, 0, 0, tmp, ldb, 0, bg, 1, NULL, 0, 0,
                 a->res ? MRT_ACT_NONE : a->act, a->a0, a->a1, nt, 0); /* (nb follows the threads) */
        for (int j = 0; j < nb; ++j) {
            float *yb = a->y + (i0 + j) * mp + (long)g * mg * p;
            for (int r = 0; r < mg; ++r) memcpy(yb + r * p, tmp + r * ldb + j * p, sizeof(float) * p);
            if (a->res) I->bias_act(yb, NULL, a->res + (i0 + j) * mp + (long)g * mg * p, 1, mg, p, a->act, a->a0,
                                    a->a1, 1);
        }
    }
}

static void mrt_conv_task(void *ctx, long begin, long end) {
    mrt_conv_args *a = (mrt_conv_args *)ctx;
    float *scratch = NULL;
    if (a->scratch_bytes) {
        scratch = (float *)mrt_scratch_buffer(a->scratch_bytes);
        if (!scratch) {
            __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    for (long ch = begin; ch < end; ++ch) mrt_conv_chunk(a, ch, scratch, 1);
}

/* When the channel-vector kernel (FN(conv_cv)) pays, measured (docs/decisions.md, D50):
 * from this depth K = c/group*kh*kw whatever the kernel (the weights read as one contiguous stream;
 * below, its transposing epilogue costs more than that saves) ... */
#define MRT_CONV_CV_DEEP_K 192
/* ... for kernels larger than 1x1, on outputs of at most this many pixels (the GEMM's dropped and
 * padded columns are 6-28% of a 32x32-10x10 output's) ... */
#define MRT_CONV_CV_SMALL_PLANE 1024
/* ... and strided from this depth (5-10% faster than the GEMM at K = 144 over 80x80-160x160
 * outputs; at stride 1 it is not, and 25% slower over 160x160). */
#define MRT_CONV_CV_STRIDED_K 144
/* ... but a stride-1 window conv over fewer than this many products per output (1-3 input channels of a
 * 3 x 3 kernel: an image's first layer) keeps the GEMM on AVX-512 panels too: its tile's few multiply-adds
 * left the transposing epilogue most of the work (1 -> 64 3 x 3 over 32 x 128: 163 -> 122 us, 3 -> 64
 * over 112 x 112 587 -> 463, 3 -> 32 over 64 x 64 121 -> 77; at K = 36 the two were even, D167). */
#define MRT_CONV_CV_SHALLOW_K 32

/* ... Output channels in part-filled panels (M not a multiple of 32, the widest panel) waste lanes,
 * but on tiny outputs the GEMM's fixed costs (im2col, packing, its column padding) weigh more: at
 * most this many pixels, measured 8x8-16x16 with M = 8-24, C = 1-16: 0.74-3.0 us against 1.3-4.9
 * for the GEMM; 32x32 with C = 3 and M = 16 was 12.1 against 10.6. */
#define MRT_CONV_CV_TINY_PLANE 256

/* ... Not for one output row longer than this (a 1-D conv, run as the 2-D conv of (N, C, 1, W)):
 * measured on AVX2, 512 -> 512 channels, kernel 3, stride 2, 3199 -> 1599 outputs: 150 ms against
 * 48 for the GEMM, 1599 -> 799: 26.6 against 23.6; 399 -> 199 (kernel 2) 4.9 against 5.2. */
#define MRT_CONV_CV_MAX_ROW 256

/* ... and on AVX2 (panels of 16) a 1x1 conv of few output channels, whole panels, over many input
 * channels (a projection / squeeze layer): the GEMM packs its whole input to feed few row tiles.
 * Measured per layer (cold caches, 1 thread): 128 -> 16 @55x55 0.83x, 192 -> 32 @28x28 0.94x,
 * 384 -> 64 @13x13 0.92x, 512 -> 64 0.98x; below K = 128 slower (96 -> 24 @56x56 1.17x, 32 -> 16
 * @112x112 1.13x); a half-empty panel with a residual slower too (MobileNetV2's 144 -> 24 @56x56 + x:
 * 0.32 -> 0.49 ms).  In SqueezeNet the squeeze layers took 10-25 % less. */
#define MRT_CONV_CV_NARROW_1X1_M 64
#define MRT_CONV_CV_NARROW_1X1_K 128

/* ... and with panels of 32 (AVX-512) a 1x1 conv (stride 1) of at least this many output channels, not a
 * multiple of 32, from MRT_CONV_CV_DEEP_K input channels up: the last panel's empty lanes are a few
 * percent of the work, while the GEMM pads the pixels to its panels of 32 (13 x 13 = 169 -> 192).
 * Measured (D138, this host's AVX-512, programs' call times): SqueezeNet's classifier 512 -> 1000 @13x13
 * 1454 -> 1208 us alone at 1 thread (757 -> 636 at 2), 747-749 -> 699-708 in the model at 2 (its 2 MB of
 * weights cold there: unchanged at 1); RegNetY-400MF (208 -> 440, 440 -> 440) 11.06-11.35 -> 10.49-10.59 ms
 * at 1 thread, 6.71 -> 6.22 at 2. */
#define MRT_CONV_CV_WIDE_1X1_M 256

/* ... and with panels of 32 a 1x1 conv (stride 1, ungrouped) to whole panels of at least
 * MRT_CONV_CV_SMALL_1X1_M output channels over at most MRT_CONV_CV_SMALL_1X1_PLANE pixels: the expansions of
 * inverted residual blocks at 14 x 14 and 7 x 7, where the GEMM pads the pixels to its panels of 32
 * (49 -> 64, 196 -> 224).  Measured (D157, this host, one layer alone against onnxruntime): 160 -> 960 @7x7
 * 1.27 -> 1.06x, 112 -> 672 @14x14 1.10 -> 0.99x, 64 -> 384 @14x14 1.12 -> 1.03x; at 28 x 28 slower (32 -> 192
 * 1.06 -> 1.21x), and 24 -> 96 @14x14 slower too. */
#define MRT_CONV_CV_SMALL_1X1_M 128
#define MRT_CONV_CV_SMALL_1X1_PLANE 256

/* A grouped convolution of a few channels per group (RegNet, ResNeXt: 8-24) runs on the channel-vector
 * kernel whatever its plane, when the group fills whole panels of 8 or 16 channels (NEON / SSE2, AVX2)
 * or half of one (AVX-512's panels of 32 would be three quarters empty at 8: not measured there; 24
 * channels in panels of 16, 384 -> 384 / 16 groups @28x28, went 2.0 -> 2.4 ms).  Each
 * group's GEMM of 8 rows used a third of the 6 x 16 tile, or its columns in 6-row tiles; measured on
 * AVX2 (RegNetY-400MF's layers, 1 thread): 48 -> 48 / 6 groups stride 2 @112x112 0.67 -> 0.53 ms,
 * 104 -> 104 / 13 stride 2 @56x56 0.40 -> 0.30, stride 1 @28x28 unchanged; 16 channels per group,
 * 256 -> 256 / 16 @28x28 0.98 -> 0.87, stride 2 @56x56 1.68 -> 1.15. */
static int conv_cv_grouped(const mrt_conv_geometry *g) {
    const int mg = g->m / g->group, nr = (int)impl->conv_cv_packed_floats(1, 1, 1);
    return g->group > 1 && nr <= 16 && (mg % nr == 0 || 2 * mg == nr);
}

/* A convolution with one output pixel whose window is the whole input, unpadded (the squeeze-excite
 * convolutions of MobileNetV3, EfficientNet, RegNet, on a 1 x 1 input after a global pooling; a classifier
 * written as a conv): a product of the weight matrix with each image's input vector.  It reads each weight
 * once, so the GEMM's packing of the weights (or of the input) is pure cost: measured on AVX2 (2 threads,
 * hot caches, one image) RegNetY-400MF's 440 -> 110 28 -> 4-5 us, MobileNetV3's 960 -> 240 55 -> 10-24 and
 * 240 -> 960 45 -> 11-18; 8 images of 440 -> 110 103 -> 13 (the im2col path, images side by side). */
static int conv_is_dense(const mrt_conv_geometry *g) {
    return g->group == 1 && g->oh == 1 && g->ow == 1 && g->kh == g->h && g->kw == g->w && g->pt == 0 && g->pl == 0 &&
           (g->kh == 1 || g->dh == 1) && (g->kw == 1 || g->dw == 1);
}
/* ... up to this many images through sgemv (each block of 8 weight rows read from memory once for all the
 * images), more through the GEMM (weights transposed), whose packing then pays.  Measured on AVX2, 2 threads,
 * hot caches, sgemv against the GEMM: 440 -> 110 3.8 / 28.6 us at 1 image, 8.9 / 34.7 at 8; 240 -> 960
 * 11.0 / 115 at 1, 46 / 77 at 8; at 16 images 110 -> 440 was 63 / 39 but 440 -> 110 18 / 40. */
#define MRT_CONV_DENSE_GEMV_MAX_N 8

/* Does the channel-vector kernel run this geometry (when it gets packed weights)?  With whole panels
 * of output channels (a multiple of 32) by the rules above; else on tiny outputs only.  With panels
 * of 16 (AVX2) a 1x1 kernel does only as just above: the GEMM (its row tiles sweeping a packed
 * block of B) was 4-15 % faster at every depth measured (K = 384-1152 over 7 x 7 - 14 x 14 pixels, 320 -> 1280 @7x7
 * 1.01 -> 0.86 ms, 512 -> 1000 @13x13 3.30 -> 3.10).  It depends on the geometry and the panel width
 * only (not on the batch, the threads or the dilations), so callers can pack once per layer;
 * minirt/format/packed_weights.py has a copy of these rules (conv_uses_packed_w). */
int mrt_conv2d_uses_packed_w(const mrt_conv_geometry *g) {
    const int c = g->c, m = g->m, group = g->group, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw, oh = g->oh,
              ow = g->ow;
    if (group < 1 || c % group || m % group) return 0;
    if (oh == 1 && ow > MRT_CONV_CV_MAX_ROW) return 0;
    /* a 1 x 1 kernel at stride 1 onto one pixel reads a 1 x 1 input: the dense path (conv_is_dense) */
    if (group == 1 && kh * kw == 1 && sh == 1 && sw == 1 && oh == 1 && ow == 1) return 0;
    if (kh * kw == 1 && sh == 1 && sw == 1 && impl->conv_cv_packed_floats(1, 1, 1) == 16 &&
        (m / group) % 16 == 0 && m / group <= MRT_CONV_CV_NARROW_1X1_M && (long)c / group >= MRT_CONV_CV_NARROW_1X1_K)
        return 1;
    if (group == 1 && kh * kw == 1 && sh == 1 && sw == 1 && impl->conv_cv_packed_floats(1, 1, 1) == 32 &&
        m >= MRT_CONV_CV_WIDE_1X1_M && c >= MRT_CONV_CV_DEEP_K)
        return 1;
    if ((m / group) % 32 != 0)
        return kh * kw > 1 && ((long)oh * ow <= MRT_CONV_CV_TINY_PLANE || conv_cv_grouped(g));
    if (group == 1 && kh * kw == 1 && sh == 1 && sw == 1 && impl->conv_cv_packed_floats(1, 1, 1) == 32 &&
        m >= MRT_CONV_CV_SMALL_1X1_M && (long)oh * ow <= MRT_CONV_CV_SMALL_1X1_PLANE)
        return 1;
    const long k = (long)c / group * kh * kw;
    if (kh * kw == 1 && impl->conv_cv_packed_floats(1, 1, 1) == 16) return 0;
    if (k >= MRT_CONV_CV_DEEP_K) return 1;
    if (kh * kw == 1) return 0;
    /* AVX-512 panels: a stride-1 window conv at any plane from MRT_CONV_CV_SHALLOW_K (its implicit GEMM over
     * shifted planes was 3-12 % slower at K = 72-180 on 40 x 40 to 112 x 112 planes, SqueezeNet's 16 -> 64
     * 3 x 3 @55 x 55 430 -> 400 us; stride 2 and AVX2's panels of 16 measured no gain) */
    if (sh == 1 && sw == 1 && impl->conv_cv_packed_floats(1, 1, 1) == 32 && k >= MRT_CONV_CV_SHALLOW_K) return 1;
    return (long)oh * ow <= MRT_CONV_CV_SMALL_PLANE || ((sh > 1 || sw > 1) && k >= MRT_CONV_CV_STRIDED_K);
}

long mrt_conv2d_packed_w_floats(int m, int group, int k) {
    if (group < 1 || m % group || k < 0) return 0;
    return impl->conv_cv_packed_floats(group, m / group, k);
}

void mrt_conv2d_pack_w(const float *w, int m, int group, int k, float *packed_w) {
    if (group < 1 || m % group || k < 0) return;
    impl->conv_cv_pack_w(w, group, m / group, k, packed_w);
}

/* Winograd F(2x2, 3x3) (winograd_impl.h) for ungrouped 3x3 convs at stride 1, undilated, measured per layer
 * on AVX2 against the direct paths (docs/decisions.md, D178; 1 thread): 64 -> 64 @56x56 4.7 -> 2.9 ms,
 * 128 -> 128 @28x28 and 256 -> 256 @14x14 the same, 16 -> 64 @55x55 1.26 -> 1.01, 96 -> 96 @16x16
 * 0.94 -> 0.43, 256 -> 256 @7x7 1.30 -> 0.93, 64 -> 64 @8x8 133 -> 117 us.  Not below 1024 channel
 * pairs (16 -> 16 @56x56 and 16 -> 32 no faster: the transforms, ~16 additions per tile and channel,
 * against C x 16 multiply-adds a tile) ... */
#define MRT_WINO_MIN_PAIRS 1024
#define MRT_WINO_MIN_CHANNELS 16
/* ... nor beyond 256 channels in or out: the transformed weights (16 x M x C floats, 16/9 of the weights)
 * are read again for every band of tiles, from memory at 384 -> 384 @14x14 (9.7 against 10.0 ms direct)
 * and 512 -> 512 @7x7 (6.3 against 4.8) ... */
#define MRT_WINO_MAX_CHANNELS 256
/* ... on outputs of at least 7 x 7 pixels (16 tiles covering 8 x 8) ... */
#define MRT_WINO_MIN_PLANE 49
/* ... with AVX2's panels of 16 floats only: measured there; the other copies (AVX-512, NEON, SSE2) compile
 * the same code, not measured. */
#define MRT_WINO_PANEL 16

static int wino_mode = -1; /* mrt_conv2d_winograd_mode */

int mrt_conv2d_winograd_mode(int mode) {
    const int before = wino_mode;
    wino_mode = mode < 0 ? -1 : mode > 0;
    return before;
}

int mrt_conv2d_uses_winograd(const mrt_conv_geometry *g) {
    if (g->group != 1 || g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->dh != 1 || g->dw != 1) return 0;
    if (wino_mode >= 0) return wino_mode;
    return impl->conv_cv_packed_floats(1, 1, 1) == MRT_WINO_PANEL && g->c >= MRT_WINO_MIN_CHANNELS &&
           g->m >= MRT_WINO_MIN_CHANNELS && (long)g->c * g->m >= MRT_WINO_MIN_PAIRS &&
           g->c <= MRT_WINO_MAX_CHANNELS && g->m <= MRT_WINO_MAX_CHANNELS && (long)g->oh * g->ow >= MRT_WINO_MIN_PLANE;
}

long mrt_conv2d_winograd_floats(int m, int c) { return m > 0 && c > 0 ? 16L * m * c : 0; }

/* u[xi][mi][ci] = (G g G^T)[xi / 4][xi % 4] for the 3 x 3 weights g of (mi, ci) */
void mrt_conv2d_winograd_pack_w(const float *w, int m, int c, float *u) {
    for (int mi = 0; mi < m; ++mi)
        for (int ci = 0; ci < c; ++ci) {
            const float *g = w + ((long)mi * c + ci) * 9;
            float t[4][3];
            for (int j = 0; j < 3; ++j) { /* G g: rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2 */
                t[0][j] = g[j];
                t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
                t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
                t[3][j] = g[6 + j];
            }
            for (int i = 0; i < 4; ++i) { /* (G g) G^T */
                const float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]), 0.5f * (t[i][0] - t[i][1] + t[i][2]),
                                    t[i][2]};
                for (int j = 0; j < 4; ++j) u[((long)(4 * i + j) * m + mi) * c + ci] = r[j];
            }
        }
}

int mrt_conv2d_f32(const mrt_conv_geometry *g, const float *w, const float *packed_w, const mrt_epilogue *e,
                   const float *x, const float *res, float *y, int nthreads) {
    const int n = g->n, c = g->c, h = g->h, wd = g->w, m = g->m, group = g->group, kh = g->kh, kw = g->kw,
              sh = g->sh, sw = g->sw, dh = g->dh, dw = g->dw, pt = g->pt, pl = g->pl, oh = g->oh, ow = g->ow;
    const float *bias = e->bias;
    const int act = e->act;
    const float a0 = e->a0, a1 = e->a1;
    if (n <= 0 || m <= 0 || oh <= 0 || ow <= 0) return 0;
    if (group < 1 || c % group || m % group) return -1;
    if (geometry_overflows(g)) return -2;
    if (nthreads < 1) nthreads = 1;
    /* packed_w is then the Winograd pack (minirt.native packs for the rule it asks here); without scratch
     * for its bands (a very wide image) the layer takes the direct paths below, which write all of y */
    if (packed_w && mrt_conv2d_uses_winograd(g)) {
        if (impl->conv_winograd(g, packed_w, bias, res, act, a0, a1, x, y, nthreads) == 0) return 0;
        packed_w = NULL;
    }
    const long p = (long)oh * ow;
    if (conv_is_dense(g)) {
        /* one output pixel whose window is the whole unpadded input: y[i, :] = W x[i] + bias (+ res[i, :]),
         * each image's input and each weight row one contiguous run of c * kh * kw floats in the same
         * order: the product of the images (n x K) with the weights transposed (K x m) */
        const int K = c * kh * kw;
        mrt_gemm_shape s = {1, n, m, K, K, K, m, m, 0, 0, 0, 0, 1, 2};
        if (!res && n <= MRT_CONV_DENSE_GEMV_MAX_N)
            mrt_sgemv_f32(&s, e, x, w, y, nthreads);
        else
            mrt_sgemm_f32(&s, e, x, w, y, res, nthreads);
        return 0;
    }
    mrt_conv_args a;
    a.I = impl;
    a.x = x; a.w = w; a.bias = bias; a.res = res; a.y = y;
    a.n = n; a.c = c; a.h = h; a.wd = wd; a.m = m; a.group = group; a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw;
    a.dh = dh; a.dw = dw; a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow; a.act = act; a.a0 = a0; a.a1 = a1;
    a.failed = 0;
    /* images per GEMM: enough for ~MRT_CONV_BATCH_COLS columns, but leave a chunk per thread; a direct 1x1
     * kernel on planes of MRT_CONV_DIRECT_MIN_PIXELS or more takes one image per GEMM (see there) */
    const int one_by_one = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && oh == h && ow == wd;
    long nb = p < MRT_CONV_BATCH_COLS ? (MRT_CONV_BATCH_COLS + p - 1) / p : 1;
    if (one_by_one && p >= MRT_CONV_DIRECT_MIN_PIXELS) nb = 1;
    long per_thread = (n + nthreads - 1) / nthreads;
    if (nb > per_thread) nb = per_thread;
    if (nb < 1) nb = 1;
    a.nb = (int)nb;
    a.direct = nb == 1 && one_by_one;
    const long kk = (long)kh * kw;
    /* implicit mode: planes wide enough for every tap's shift, and few dropped columns */
    const int reach = (kh - 1) * dh / sh;
    a.wq = ow + (kw - 1) * dw / sw;
    /* the channel-vector kernel drops no column: implicit whatever the waste */
    a.packed_w = nb == 1 ? packed_w : NULL;
    a.implicit = nb == 1 && (a.direct || a.packed_w || (long)(a.wq - ow) * MRT_CONV_IMPLICIT_WASTE <= a.wq);
    /* one output row (a 1-D conv as 2-D): im2col and one GEMM rather than phase planes read in place
     * (their K rows, one per channel and tap, far apart): measured on AVX2, 512 -> 512, kernel 3,
     * stride 2, 3199 -> 1599 outputs 61 -> 47 ms, 1599 -> 799 28.6 -> 23.7; 384 -> 384 stride 2
     * over 3000 35 -> 26; 80 -> 384 stride 1 over 3000 13.3 -> 10.9; 399 -> 199 the same. */
    if (oh == 1 && !a.direct && !a.packed_w) a.implicit = 0;
    a.in_place = a.implicit && a.packed_w && !a.direct && conv_in_place_pays(&a);
    a.band = oh;
    if (a.implicit && !a.direct && !a.in_place) {
        /* bands: planes within MRT_CONV_BAND_BYTES but >= MRT_CONV_BAND_COLS columns each, then
         * evened out, and at least one per thread when the image is large enough */
        const long row_bytes = (long)c * sh * sw * a.wq * (long)sizeof(float);
        long band = MRT_CONV_BAND_BYTES / row_bytes - reach;
        const long min_band = (MRT_CONV_BAND_COLS + ow - 1) / ow;
        if (band < min_band) band = min_band;
        long bands = (oh + band - 1) / band;
        if (bands < nthreads && p >= (long)nthreads * MRT_CONV_BAND_COLS) bands = nthreads;
        if (nthreads > 1 && bands > nthreads) bands = (bands + nthreads - 1) / nthreads * nthreads;
        if (bands > oh) bands = oh;
        a.band = (int)((oh + bands - 1) / bands);
    }
    a.hq = a.band + reach;
    size_t floats = 0;
    if (a.in_place) {
        floats = (size_t)conv_in_place_floats(&a);
    } else if (a.implicit) {
        floats = (size_t)conv_table_floats((long)(c / group) * kk);
        if (!a.direct) floats += (size_t)c * sh * sw * a.hq * a.wq;
    } else {
        floats += (size_t)c * kk * nb * p;
        if (nb > 1) floats += (size_t)(m / group) * nb * p;
    }
    a.scratch_bytes = floats * sizeof(float);
    const long chunks = (n + nb - 1) / nb;
    if (n > 1 && chunks >= nthreads) {
        mrt_parallel_for(chunks, (long)m * (c / group) * kk * nb * p / 16, nthreads, mrt_conv_task, &a);
    } else {
        float *scratch = NULL;
        if (a.scratch_bytes) {
            scratch = (float *)mrt_scratch_buffer(a.scratch_bytes);
            if (!scratch) return -1;
        }
        for (long ch = 0; ch < chunks; ++ch) mrt_conv_chunk(&a, ch, scratch, nthreads);
    }
    return a.failed ? -1 : 0;
}

/* ------------------------------------------------------------------ data-movement kernels (layout_impl.h) */

#ifdef MRT_HAVE_AVX2_BUILD
/* The AVX2 copies serve the avx2 and avx512 levels (these loops gain nothing from 512-bit vectors). */
static int layout_avx2(void) { return impl_isa == MRT_ISA_AVX2 || impl_isa == MRT_ISA_AVX512; }
#endif

void mrt_upsample_nearest_f32(const float *x, float *y, long planes, int h, int wd, int fh, int fw, int nthreads) {
#ifdef MRT_HAVE_AVX2_BUILD
    if (layout_avx2()) {
        upsample_nearest_avx2(x, y, planes, h, wd, fh, fw, nthreads);
        return;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        upsample_nearest_neon32(x, y, planes, h, wd, fh, fw, nthreads);
        return;
    }
#endif
    upsample_nearest_base(x, y, planes, h, wd, fh, fw, nthreads);
}

/* mrt_copy_rows_f32: rows split over the threads (a copy is bound by memory: threads pay from
 * ~128 KB, MRT_MIN_WORK_PER_THREAD counting one unit per 4 floats). */
typedef struct {
    const float *src;
    float *dst;
    long src_ld, dst_ld, cols;
} copy_rows_args;

static void copy_rows_task(void *ctx, long begin, long end) {
    const copy_rows_args *a = (const copy_rows_args *)ctx;
    for (long r = begin; r < end; ++r) memcpy(a->dst + r * a->dst_ld, a->src + r * a->src_ld, sizeof(float) * a->cols);
}

void mrt_copy_rows_f32(const float *src, long src_ld, float *dst, long dst_ld, long rows, long cols, int nthreads) {
    if (rows <= 0 || cols <= 0) return;
    copy_rows_args a = {src, dst, src_ld, dst_ld, cols};
    mrt_parallel_for(rows, cols / 4, nthreads, copy_rows_task, &a);
}

/* mrt_binary_f32: chunks of 4096 values over the threads; plain loops the compiler vectorizes
 * (each value's operation is the IEEE one numpy's ufunc computes: identical results). */
typedef struct {
    int op;
    const float *a, *b;
    float *y;
    long n;
} binary_args;

#define MRT_BINARY_CHUNK 4096L

static void binary_task(void *ctx, long begin, long end) {
    const binary_args *t = (const binary_args *)ctx;
    const long i0 = begin * MRT_BINARY_CHUNK, i1 = end * MRT_BINARY_CHUNK < t->n ? end * MRT_BINARY_CHUNK : t->n;
    const float *a = t->a, *b = t->b;
    float *y = t->y;
    switch (t->op) {
    case MRT_BINARY_ADD:
        for (long i = i0; i < i1; ++i) y[i] = a[i] + b[i];
        break;
    case MRT_BINARY_SUB:
        for (long i = i0; i < i1; ++i) y[i] = a[i] - b[i];
        break;
    case MRT_BINARY_MUL:
        for (long i = i0; i < i1; ++i) y[i] = a[i] * b[i];
        break;
    default:
        for (long i = i0; i < i1; ++i) y[i] = a[i] / b[i];
    }
}

void mrt_binary_f32(int op, const float *a, const float *b, float *y, long n, int nthreads) {
    if (n <= 0) return;
    binary_args t = {op, a, b, y, n};
    mrt_parallel_for((n + MRT_BINARY_CHUNK - 1) / MRT_BINARY_CHUNK, MRT_BINARY_CHUNK, nthreads, binary_task, &t);
}

/* mrt_binary_rows_f32: the same loops with one operand broadcast.  Work items are (row, chunk of
 * MRT_BINARY_CHUNK values of that row), so a scalar (one row of n values) threads as well as many
 * short rows; the broadcast value of a row form is read once per item. */
typedef struct {
    int op;
    const float *a, *b;
    float *y;
    long rows, len, bmod, chunks_per_row;
} binary_rows_args;

/* y[i] = a[i] op s (or s op a[i] with rev) for i < n: the loop of one row form item. */
static void binary_scalar_run(int op, int rev, const float *a, float s, float *y, long n) {
    long i;
    switch (op) {
    case MRT_BINARY_ADD:
        for (i = 0; i < n; ++i) y[i] = a[i] + s;
        break;
    case MRT_BINARY_SUB:
        if (rev)
            for (i = 0; i < n; ++i) y[i] = s - a[i];
        else
            for (i = 0; i < n; ++i) y[i] = a[i] - s;
        break;
    case MRT_BINARY_MUL:
        for (i = 0; i < n; ++i) y[i] = a[i] * s;
        break;
    default:
        if (rev)
            for (i = 0; i < n; ++i) y[i] = s / a[i];
        else
            for (i = 0; i < n; ++i) y[i] = a[i] / s; /* (not a[i] * (1 / s): numpy divides) */
    }
}

/* y[i] = a[i] op b[i] (or b[i] op a[i] with rev) for i < n: the loop of one column form item. */
static void binary_vector_run(int op, int rev, const float *a, const float *b, float *y, long n) {
    long i;
    switch (op) {
    case MRT_BINARY_ADD:
        for (i = 0; i < n; ++i) y[i] = a[i] + b[i];
        break;
    case MRT_BINARY_SUB:
        if (rev)
            for (i = 0; i < n; ++i) y[i] = b[i] - a[i];
        else
            for (i = 0; i < n; ++i) y[i] = a[i] - b[i];
        break;
    case MRT_BINARY_MUL:
        for (i = 0; i < n; ++i) y[i] = a[i] * b[i];
        break;
    default:
        if (rev)
            for (i = 0; i < n; ++i) y[i] = b[i] / a[i];
        else
            for (i = 0; i < n; ++i) y[i] = a[i] / b[i];
    }
}

static void binary_rows_task(void *ctx, long begin, long end) {
    const binary_rows_args *t = (const binary_rows_args *)ctx;
    const int op = t->op & 3, rev = (t->op & MRT_BINARY_REVERSED) != 0, cols = (t->op & MRT_BINARY_COLUMNS) != 0;
    for (long item = begin; item < end; ++item) {
        const long r = item / t->chunks_per_row, c0 = (item % t->chunks_per_row) * MRT_BINARY_CHUNK;
        const long c1 = c0 + MRT_BINARY_CHUNK < t->len ? c0 + MRT_BINARY_CHUNK : t->len;
        const long base = r * t->len;
        if (cols)
            binary_vector_run(op, rev, t->a + base + c0, t->b + c0, t->y + base + c0, c1 - c0);
        else
            binary_scalar_run(op, rev, t->a + base + c0, t->b[r % t->bmod], t->y + base + c0, c1 - c0);
    }
}

void mrt_binary_rows_f32(int op, const float *a, const float *b, float *y, long rows, long len, long bmod,
                         int nthreads) {
    if (rows <= 0 || len <= 0 || bmod <= 0) return;
    const long per_row = (len + MRT_BINARY_CHUNK - 1) / MRT_BINARY_CHUNK;
    binary_rows_args t = {op, a, b, y, rows, len, bmod, per_row};
    /* one unit per value (as mrt_binary_f32), averaged over the items */
    mrt_parallel_for(rows * per_row, len < MRT_BINARY_CHUNK ? len : MRT_BINARY_CHUNK, nthreads, binary_rows_task, &t);
}

/* mrt_activation_f32: chunks of MRT_ACT_CHUNK values over the threads, each copied to y (unless in
 * place) and activated there by the epilogues' row code of the ISA in use (q_act_row: the same
 * function the int8 epilogues run, so a standalone activation computes what a fused one does; on
 * x86-64 FN(act_row_fast), the float epilogues' vector code where it has the activation, D83). */
#define MRT_ACT_CHUNK 4096L

typedef struct {
    const mrt_epilogue *e;
    const float *x;
    float *y;
    long n;
} activation_args;

static void activation_task(void *ctx, long begin, long end) {
    const activation_args *t = (const activation_args *)ctx;
    const long i0 = begin * MRT_ACT_CHUNK, i1 = end * MRT_ACT_CHUNK < t->n ? end * MRT_ACT_CHUNK : t->n;
    for (long i = i0; i < i1; i += MRT_ACT_CHUNK) { /* (copied chunk by chunk: activated while in L1) */
        const long m = i1 - i < MRT_ACT_CHUNK ? i1 - i : MRT_ACT_CHUNK;
        if (t->x != t->y) memcpy(t->y + i, t->x + i, sizeof(float) * (size_t)m);
        q_act_row(t->y + i, m, t->e->act, t->e->a0, t->e->a1);
    }
}

void mrt_activation_f32(const mrt_epilogue *e, const float *x, float *y, long n, int nthreads) {
    if (n <= 0 || e->act == MRT_ACT_NONE) {
        if (n > 0 && x != y) memcpy(y, x, sizeof(float) * (size_t)n);
        return;
    }
    activation_args t = {e, x, y, n};
    /* one unit per value for the selects (bound by memory, as a copy); the ones with an exp cost
     * several times more: threads pay from a quarter of the values */
    const long unit = e->act == MRT_ACT_RELU || e->act == MRT_ACT_CLIP || e->act == MRT_ACT_LEAKY ||
                              e->act == MRT_ACT_HARDSIGMOID || e->act == MRT_ACT_HARDSWISH
                          ? MRT_ACT_CHUNK
                          : 4 * MRT_ACT_CHUNK;
    mrt_parallel_for((n + MRT_ACT_CHUNK - 1) / MRT_ACT_CHUNK, unit, nthreads, activation_task, &t);
}

void mrt_plane_means_f32(const float *x, float *y, long planes, long plane, int nthreads) {
#ifdef MRT_HAVE_AVX2_BUILD
    if (layout_avx2()) {
        plane_means_avx2(x, y, planes, plane, nthreads);
        return;
    }
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        plane_means_neon32(x, y, planes, plane, nthreads);
        return;
    }
#endif
    plane_means_base(x, y, planes, plane, nthreads);
}

int mrt_convtranspose_tiles_f32(const mrt_conv_geometry *g, const float *wt, const mrt_epilogue *e, const float *x,
                                float *y, int nthreads) {
    if (g->n <= 0 || g->m <= 0 || g->h <= 0 || g->w <= 0) return 0;
#ifdef MRT_HAVE_AVX2_BUILD
    if (layout_avx2())
        return convt_tiles_avx2(x, g->n, g->c, g->h, g->w, wt, g->m, g->kh, g->kw, e->bias, y, e->act, e->a0, e->a1,
                                nthreads);
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        return convt_tiles_neon32(x, g->n, g->c, g->h, g->w, wt, g->m, g->kh, g->kw, e->bias, y, e->act, e->a0,
                                  e->a1, nthreads);
    }
#endif
    return convt_tiles_base(x, g->n, g->c, g->h, g->w, wt, g->m, g->kh, g->kw, e->bias, y, e->act, e->a0, e->a1,
                            nthreads);
}

int mrt_maxpool2d_s1_f32(const mrt_conv_geometry *g, const float *x, float *y, int nthreads) {
    const long planes = (long)g->n * g->c;
    if (planes <= 0 || g->oh <= 0 || g->ow <= 0) return 0;
#ifdef MRT_HAVE_AVX2_BUILD
    if (layout_avx2())
        return maxpool_s1_avx2(x, y, planes, g->h, g->w, g->kh, g->kw, g->pt, g->pl, g->oh, g->ow, nthreads);
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        return maxpool_s1_neon32(x, y, planes, g->h, g->w, g->kh, g->kw, g->pt, g->pl, g->oh, g->ow, nthreads);
    }
#endif
    return maxpool_s1_base(x, y, planes, g->h, g->w, g->kh, g->kw, g->pt, g->pl, g->oh, g->ow, nthreads);
}

/* ------------------------------------------------------------------ recurrent layers
 *
 * mrt_rnn_f32 (kernels.h): the input projection of every step and direction as one GEMM (x times
 * the stacked W of all directions, transposed, plus the folded biases), then per direction and step
 * the recurrent product of the batch's states (sgemv for a few rows, the GEMM otherwise) and one
 * gate pass per batch row (rnn_impl.h, the ISA's copy).  A row whose sequence has ended (t >=
 * lens[b]) keeps its state and is not written: its remaining outputs are zeroed once at the end.
 * The products' results depend on the thread count only as the GEMM's do (they do not). */

typedef void (*rnn_lstm_fn)(int, const float *, const float *, const float *, float, int, float *, float *, float *);
typedef void (*rnn_gru_fn)(int, int, const float *, const float *, const float *, float, float *, float *, float *,
                           float *);

/* out (rows, n) = a (rows, k) times b^T, b stored (n, k) with row stride k */
static void rnn_product(int rows, int n, int k, const float *a, const float *b, float *out, int nthreads) {
    mrt_gemm_shape s = {1, rows, n, k, k, k, n, 0, 0, 0, 0, 0, 1, 2};
    mrt_epilogue e = {NULL, MRT_ACT_NONE, 0.0f, 0.0f, 1.0f, 0.0f};
    if (rows <= 4)
        mrt_sgemv_f32(&s, &e, a, b, out, nthreads);
    else
        mrt_sgemm_f32(&s, &e, a, b, out, NULL, nthreads);
}

/* One direction of a layer (see mrt_rnn_f32), its steps in order: the states start in the output,
 * per step the recurrent product of the batch's states and one gate pass per row. */
typedef struct {
    const mrt_rnn_shape *s;
    const int32_t *lens;
    const float *h0, *c0, *xp; /* xp: the input projection, rows of D * G * H */
    const long *xrows;         /* x's row -> its projection row (-1: past its sequence), or NULL: the same */
    int *active;               /* per direction: the batch rows still inside their sequence at a step */
    float *y, *state;
    float *scratch;            /* per direction: rec + 3 * bh floats (see mrt_rnn_f32) */
    rnn_lstm_fn lstm_row;
    rnn_gru_fn gru_row;
    int nthreads;              /* for the products of one direction */
} rnn_dir_args;

static void rnn_direction(const rnn_dir_args *a, int d) {
    const mrt_rnn_shape *s = a->s;
    const int S = s->seq, B = s->batch, H = s->hidden, D = s->dirs;
    const int lstm = s->kind == MRT_RNN_LSTM, G = lstm ? 4 : 3;
    const long GH = (long)G * H, DBH = (long)D * B * H, ldxp = D * GH;
    const size_t rec = (size_t)B * GH, bh = (size_t)B * H;
    const float lim = s->clip > 0.0f ? s->clip : INFINITY;
    const int32_t *lens = a->lens;
    const float *h0 = a->h0, *c0 = a->c0, *xp = a->xp;
    float *y = a->y, *h = a->state, *c = lstm ? a->state + DBH : NULL;
    float *rc = a->scratch + (size_t)d * (rec + 3 * bh), *hb = rc + rec, *zb = hb + bh, *rh = zb + bh;
    const int nthreads = a->nthreads;
    const rnn_lstm_fn lstm_row = a->lstm_row;
    const rnn_gru_fn gru_row = a->gru_row;
    /* the states' index of (d, b): layout 0 (D, B, H), layout 1 (B, D, H) */
#define RNN_ST(d, b) ((s->layout ? ((long)(b) * D + (d)) : ((long)(d) * B + (b))) * H)
    /* y's row of (t, d, b): layout 0 (S, D, B, H), layout 1 (B, S, D, H) */
#define RNN_Y(t, d, b) (s->layout ? (((long)(b) * S + (t)) * D + (d)) * H : (((long)(t) * D + (d)) * B + (b)) * H)
    /* the projection's row of (t, b): the row of x, (S, B) or (B, S) */
#define RNN_X(t, b) (s->layout ? (long)(b) * S + (t) : (long)(t) * B + (b))
    const int back = D == 2 ? d == 1 : s->reverse;
    const float *R = s->r + (long)d * GH * H;
    const float *P = s->p ? s->p + (long)d * 3 * H : NULL;
    const float *rbh = s->rbh ? s->rbh + (long)d * H : NULL;
    for (int b = 0; b < B; ++b) { /* this direction's states start in the output */
        const long o = RNN_ST(d, b);
        for (int j = 0; j < H; ++j) {
            h[o + j] = h0 ? h0[o + j] : 0.0f;
            if (c) c[o + j] = c0 ? c0[o + j] : 0.0f;
        }
    }
    /* r packed (the caller does so for several rows): the product on it, no per-step packing, no
     * lane sums (not for a GRU without linear_before_reset, whose products take parts of r) */
    const float *Rp = s->rpack && (lstm || s->linear_before_reset)
                          ? s->rpack + (long)d * mrt_sgemm_packed_b_floats(H, (int)GH) : NULL;
    /* Per step, only the rows still inside their sequence (all of them without lens) take part: their
     * states gathered into hb, in batch order, their products and gates at their place i in that list
     * (a row's product does not depend on the other rows: a shorter list changes no result). */
    int *act = a->active + (size_t)d * B;
    for (int t = 0; t < S; ++t) {
        int m = 0;
        for (int b = 0; b < B; ++b)
            if (!lens || t < lens[b]) {
                act[m] = b;
                memcpy(hb + (long)m * H, h + RNN_ST(d, b), sizeof(float) * H);
                ++m;
            }
        if (m == 0) break; /* every sequence has ended (lens only end rows as t grows) */
        if (Rp) {
            mrt_gemm_shape ps = {1, m, (int)GH, H, H, 0, GH, 0, 0, 0, 0, 0, 0, 2};
            mrt_epilogue pe = {NULL, MRT_ACT_NONE, 0.0f, 0.0f, 1.0f, 0.0f};
            mrt_sgemm_pb_f32(&ps, &pe, hb, Rp, rc, NULL, nthreads);
        } else
            rnn_product(m, lstm || s->linear_before_reset ? (int)GH : 2 * H, H, hb, R, rc, nthreads);
        for (int pass = 0; pass < (lstm || s->linear_before_reset ? 1 : 2); ++pass) {
            if (pass == 1) rnn_product(m, H, H, rh, R + 2L * H * H, rc, nthreads);
            for (int i = 0; i < m; ++i) {
                const int b = act[i];
                const int len = lens ? lens[b] : S;
                const int tt = back ? len - 1 - t : t; /* the time step this step reads and writes */
                const long xr = a->xrows ? a->xrows[RNN_X(tt, b)] : RNN_X(tt, b);
                const float *xrow = xp + xr * ldxp + (long)d * GH;
                const float *rrow = rc + (long)i * (pass ? H : (lstm || s->linear_before_reset ? GH : 2L * H));
                float *hs = h + RNN_ST(d, b);
                float *yrow = y + RNN_Y(tt, d, b);
                if (lstm)
                    lstm_row(H, xrow, rrow, P, lim, s->input_forget, c + RNN_ST(d, b), hs, yrow);
                else if (s->linear_before_reset)
                    gru_row(H, 0, xrow, rrow, rbh, lim, NULL, NULL, hs, yrow);
                else
                    gru_row(H, pass, xrow, rrow, NULL, lim, zb + (long)i * H, pass ? NULL : rh + (long)i * H, hs,
                            pass ? yrow : NULL);
            }
        }
    }
    if (lens) /* the steps past each sequence's end: zeros */
        for (int b = 0; b < B; ++b)
            for (int t = lens[b]; t < S; ++t) memset(y + RNN_Y(t, d, b), 0, sizeof(float) * H);
#undef RNN_ST
#undef RNN_Y
#undef RNN_X
}

static void rnn_direction_task(void *ctx, long begin, long end) {
    for (long d = begin; d < end; ++d) rnn_direction((const rnn_dir_args *)ctx, (int)d);
}

int mrt_rnn_f32(const mrt_rnn_shape *s, const float *x, const int32_t *lens, const float *h0, const float *c0,
                float *y, float *state, int nthreads) {
    const int S = s->seq, B = s->batch, I = s->input, H = s->hidden, D = s->dirs;
    const int lstm = s->kind == MRT_RNN_LSTM, G = lstm ? 4 : 3;
    if (S < 0 || B < 0 || I < 0 || H < 0 || (D != 1 && D != 2) || (s->kind != MRT_RNN_LSTM && s->kind != MRT_RNN_GRU))
        return -2;
    if (lens)
        for (int b = 0; b < B; ++b)
            if (lens[b] < 0 || lens[b] > S) return -2;
    const long GH = (long)G * H, rows = (long)S * B, DBH = (long)D * B * H;
    rnn_lstm_fn lstm_row = rnn_lstm_row_base;
    rnn_gru_fn gru_row = rnn_gru_row_base;
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        lstm_row = rnn_lstm_row_neon32;
        gru_row = rnn_gru_row_neon32;
    }
#endif
#ifdef MRT_HAVE_AVX2_BUILD
    if (impl_isa == MRT_ISA_AVX512) {
        lstm_row = rnn_lstm_row_avx512;
        gru_row = rnn_gru_row_avx512;
    } else if (impl_isa == MRT_ISA_AVX2) {
        lstm_row = rnn_lstm_row_avx2;
        gru_row = rnn_gru_row_avx2;
    }
#endif
    /* the states' index of (d, b): layout 0 (D, B, H), layout 1 (B, D, H) */
#define RNN_ST(d, b) ((s->layout ? ((long)(b) * D + (d)) : ((long)(d) * B + (b))) * H)
    /* y's row of (t, d, b): layout 0 (S, D, B, H), layout 1 (B, S, D, H) */
#define RNN_Y(t, d, b) (s->layout ? (((long)(b) * S + (t)) * D + (d)) * H : (((long)(t) * D + (d)) * B + (b)) * H)
    /* the projection's row of (t, b): the row of x, (S, B) or (B, S) */
#define RNN_X(t, b) (s->layout ? (long)(b) * S + (t) : (long)(t) * B + (b))
    float *h = state, *c = lstm ? state + DBH : NULL;
    if (rows == 0 || H == 0) { /* nothing to run: the states are the initial ones, y is empty or zeros */
        for (int d = 0; d < D; ++d)
            for (int b = 0; b < B; ++b) {
                const long o = RNN_ST(d, b);
                for (int j = 0; j < H; ++j) {
                    h[o + j] = h0 ? h0[o + j] : 0.0f;
                    if (c) c[o + j] = c0 ? c0[o + j] : 0.0f;
                }
            }
        memset(y, 0, sizeof(float) * (size_t)rows * D * H);
        return 0;
    }
    /* With sequence_lens, only the rows of x inside their sequence are projected (a tagger's padded
     * batch of 4 x 64 tokens had 159 such rows of 256): gathered into xc, their projections in that
     * order, xrows mapping each row of x to its projection row. */
    long valid = rows;
    if (lens) {
        valid = 0;
        for (int b = 0; b < B; ++b) valid += lens[b];
    }
    const int compact = valid < rows && I > 0;
    /* scratch: the projection (rows, D*G*H; compacting, the valid rows first); per direction and step
     * the batch's states (B, H) in, the recurrent product (B, G*H); a GRU without linear_before_reset:
     * z and r * h (B, H) each; with lengths, room for the gathered rows of x (valid of rows, I) */
    /* (sized for every row whatever the lengths: the scratch does not depend on the data, so the
     * first run, or a session's warm-up (D90), grows it to what every later run uses) */
    const size_t proj = (size_t)rows * D * GH, rec = (size_t)B * GH, bh = (size_t)B * H;
    const size_t xc_floats = lens && I > 0 ? (size_t)rows * I : 0;
    /* (the calling thread's scratch, kept across calls: a fresh block of this size is a fresh mapping,
     * page faults on every call until malloc's threshold adapts; nothing this call runs uses it) */
    float *buf = (float *)mrt_scratch_buffer(sizeof(float) * (proj + (size_t)D * (rec + 3 * bh) + xc_floats));
    int *active = (int *)mrt_scratch_malloc(sizeof(int) * ((size_t)D * B + 1));
    long *xrows = compact ? (long *)mrt_scratch_malloc(sizeof(long) * (size_t)rows) : NULL;
    if (!buf || !active || (compact && !xrows)) {
        free(active);
        free(xrows);
        return -1;
    }
    float *xp = buf, *rc = xp + proj, *xc = rc + (size_t)D * (rec + 3 * bh);
    const float *xin = x;
    long prows = rows;
    if (compact) {
        long n = 0;
        for (int t = 0; t < S; ++t)
            for (int b = 0; b < B; ++b) {
                const long r = RNN_X(t, b);
                if (t < lens[b]) {
                    memcpy(xc + n * I, x + r * I, sizeof(float) * I);
                    xrows[r] = n++;
                } else
                    xrows[r] = -1;
            }
        xin = xc;
        prows = valid;
    }
    {
        mrt_gemm_shape gs = {1, (int)prows, (int)(D * GH), I, I, I, D * GH, 0, 0, 0, 0, 0, 1, 2};
        mrt_epilogue e = {s->bias, MRT_ACT_NONE, 0.0f, 0.0f, 1.0f, 0.0f};
        if (I == 0) /* no input features: the projection is the bias alone (never compacted) */
            for (long r = 0; r < rows; ++r)
                for (long j = 0; j < D * GH; ++j) xp[r * D * GH + j] = s->bias ? s->bias[j] : 0.0f;
        else if (prows > 0 && s->wpack) /* (packing W per call cost more than the product for a short
                                          * sequence: 31 steps of 512 -> 2 x 1024 gates, 1.5 of 2.4 ms) */
            mrt_sgemm_pb_f32(&gs, &e, xin, s->wpack, xp, NULL, nthreads);
        else if (prows > 0) /* (none when every sequence is empty) */
            mrt_sgemm_f32(&gs, &e, xin, s->w, xp, NULL, nthreads);
    }
    /* The directions, at once on two threads when there are two of them (each runs its steps on one
     * thread: no per-step hand-over; a product's result does not depend on its thread count, so the
     * outputs are those of one thread), else one after the other with the threads in the products. */
    rnn_dir_args da = {s, lens, h0, c0, xp, xrows, active, y, state, rc, lstm_row, gru_row, nthreads};
    if (D == 2 && nthreads >= 2) {
        da.nthreads = nthreads / 2;
        mrt_parallel_for(2, (long)S * B * GH * H, 2, rnn_direction_task, &da);
    } else
        for (int d = 0; d < D; ++d) rnn_direction(&da, d);
#undef RNN_ST
#undef RNN_Y
#undef RNN_X
    free(active);
    free(xrows);
    return 0;
}

/* ------------------------------------------------------------------ detection
 *
 * mrt_nms_f32 (nms_impl.h, one copy for every ISA) and mrt_roi_align_f32 (kernels.h): the RoIs are
 * checked and measured here (batch indices, sample grids), the sampling runs in the ISA's copy of
 * roialign_impl.h, threads over the RoIs.  The channels-last layout pays when the samples outnumber
 * the map's pixels (each pixel is then read several times, and a tap is a vector over the channels);
 * below that, the planes are read in place. */

#include "nms_impl.h"

int mrt_roi_align_f32(const mrt_roi_align_shape *s, const float *x, const float *rois, const int64_t *batch,
                      long nrois, float *y, int nthreads) {
    if (s->n < 0 || s->c < 0 || s->h < 0 || s->w < 0 || s->oh < 0 || s->ow < 0 || nrois < 0 ||
        (s->mode != MRT_ROI_AVG && s->mode != MRT_ROI_MAX))
        return -2;
    if (nrois == 0 || s->c == 0 || s->oh == 0 || s->ow == 0) return 0;
    if (s->h == 0 || s->w == 0) return -2;
    long samples = 0, max_ty = 1, max_tx = 1;
    for (long r = 0; r < nrois; ++r) {
        if (batch[r] < 0 || batch[r] >= s->n) return -2;
        roi_geom g;
        roi_geometry(s, rois + 4 * r, &g);
        if (g.gh < 0 || g.gw < 0) return -3;
        const long ty = (long)s->oh * g.gh, tx = (long)s->ow * g.gw;
        if (ty > max_ty) max_ty = ty;
        if (tx > max_tx) max_tx = tx;
        samples += ty * tx;
    }
    const int channels_last = s->c >= 4 && 2 * samples >= (long)s->n * s->h * s->w;
#ifdef MRT_HAVE_AVX2_BUILD
    if (layout_avx2())
        return roi_align_avx2(s, x, rois, batch, nrois, y, channels_last, max_ty, max_tx, samples, nthreads);
#endif
#ifdef MRT_HAVE_NEON32_BUILD
    if (impl_isa == MRT_ISA_NEON) {
        return roi_align_neon32(s, x, rois, batch, nrois, y, channels_last, max_ty, max_tx, samples, nthreads);
    }
#endif
    return roi_align_base(s, x, rois, batch, nrois, y, channels_last, max_ty, max_tx, samples, nthreads);
}


#include "crc32_impl.h"
#include "index_copy_impl.h"
#include "broadcast_impl.h"
#include "program_impl.h"
#include "trees_impl.h"
#include "nbits_impl.h"
#include "attention_impl.h"
