/* The trace writer: per-thread rings, the dictionary of strings and stacks, and the flush
 * thread that turns both into checksummed blocks.
 *
 * It runs inside someone else's process, so: no malloc after open (every buffer is mmap'd),
 * no lock when a thread emits a record (each thread owns a single-producer ring that only
 * the flusher consumes), bounded memory (a full ring drops and counts), and nothing printed
 * but one "psshim: " line when something fails. */
#include "core/core.h"
#include "tracer/tracer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <libunwind.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tracer/trace_codec.h"
#include "tracer/trace_intern.h"

/* Sizes. A ring holds ~100 ms of one thread's records at a high launch rate (a 4-pointer
 * launch is 76 bytes: 1 MiB is ~13k launches); a block takes a whole ring. */
enum {
  RING_BYTES = 1 << 20,
  BLOCK_CAP = RING_BYTES,
  MAX_RINGS = 512,
  FLUSH_MS = 100,
  STRING_MAX = 4096,          /* longer texts are cut: mangled kernel names can be huge */
  META_BYTES = 32 << 20,      /* strings and stacks not yet flushed */
  STRING_ARENA = 64 << 20,
  STRING_COUNT = 1 << 20,
  STACK_ARENA = 256 << 20,
  STACK_COUNT = 1 << 20,
};
_Static_assert(BLOCK_CAP <= PST_BLOCK_MAX, "blocks must stay readable");
_Static_assert(PST_RECORD_HEADER_SIZE + 24 + PST_LAUNCH_MAX_PTRS * 8 < RING_BYTES, "ring too small");

/* ---- clocks and ids ---- */
static uint64_t now_ns(int clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void say(const char *what, const char *path, int err) {
  fprintf(stderr, "psshim: trace %s%s%s%s%s\n", what, path ? " " : "", path ? path : "",
          err ? ": " : "", err ? strerror(err) : "");
}

/* ---- per-thread rings ----
 * head is written by the owning thread only, tail by the flusher only; the bytes between
 * are whole records. busy brackets an emit so that close can wait for emitters to leave. */
enum ring_state { RING_FREE = 0, RING_CLAIMING, RING_OWNED, RING_ORPHAN };
struct ring {
  alignas(64) _Atomic uint64_t head;
  _Atomic uint64_t tail;
  _Atomic int state;
  _Atomic int busy;
  _Atomic uint64_t dropped, dropped_bytes;
  uint32_t tid;
  uint8_t *data;
};
static struct ring rings[MAX_RINGS];
static _Atomic uint32_t ring_hwm;        /* slots [0, ring_hwm) have been used */
static _Atomic uint64_t orphan_drops;    /* records of threads that had no ring */

static _Atomic int tracing_on;
static _Atomic uint32_t generation;      /* bumped by every open and close */
static PS_THREAD_LOCAL struct ring *tls_ring;
static PS_THREAD_LOCAL uint32_t tls_gen;
/* A thread past its exit destructor: it must not claim a ring again. */
#define DEAD_RING ((struct ring *)1)
static pthread_key_t exit_key;

/* ---- the open trace ---- */
static ps_mutex open_lock = PS_MUTEX_INITIALIZER(PS_RANK_TRACE_OPEN, "the trace open lock"); /* open/close */
static ps_mutex flush_lock = PS_MUTEX_INITIALIZER(PS_RANK_TRACE_FLUSH, "the trace flush lock"); /* the file and the block */
static ps_mutex dict_lock = PS_MUTEX_INITIALIZER(PS_RANK_TRACE_DICT, "the trace dictionary lock"); /* strings, stacks, meta */
static ps_mutex wake_lock = PS_MUTEX_INITIALIZER(PS_RANK_TRACE_WAKE, "the trace flusher wake lock");
static pthread_cond_t wake; /* on CLOCK_MONOTONIC: init_wake, before the first open */
static bool stopping;
static pthread_t flusher;
static int fd = -1;
static bool write_failed;
static char *trace_path; /* mmap'd copy, for messages */
static uint8_t *block;   /* PST_BLOCK_HEADER_SIZE + BLOCK_CAP */
static size_t block_used;

/* The dictionary: interned texts and stacks, and meta, the STRING/STACK records not yet
 * flushed. Under dict_lock; dict_open says whether they exist. */
static bool dict_open;
static struct pst_itab strings, stacks;
static uint32_t stacks_symbolized;
static uint8_t *meta;
static size_t meta_used, meta_flushed;
static _Atomic uint64_t dict_drops;

/* ---- blocks ---- */
static void write_all(const uint8_t *p, size_t n) {
  while (n && !write_failed) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      say("write failed, tracing stops:", trace_path, w < 0 ? errno : ENOSPC);
      write_failed = true;
      atomic_store(&tracing_on, 0);
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

static void block_write(void) {
  if (!block_used) return;
  pst_encode_block_header(block, block + PST_BLOCK_HEADER_SIZE, (uint32_t)block_used);
  write_all(block, PST_BLOCK_HEADER_SIZE + block_used);
  block_used = 0;
}

/* Room for n more bytes in the block, writing it out first if needed. */
static uint8_t *block_room(size_t n) {
  if (block_used + n > BLOCK_CAP) block_write();
  return block + PST_BLOCK_HEADER_SIZE + block_used;
}

/* ---- the dictionary ---- */

/* Appends a STRING or STACK record to meta. Caller holds dict_lock. */
static bool meta_append(struct pst_record *r) {
  r->ts_ns = now_ns(CLOCK_MONOTONIC);
  r->tid = (uint32_t)gettid();
  size_t n = pst_record_size(r);
  if (n > META_BYTES - meta_used) return false;
  meta_used += pst_encode_record(r, meta + meta_used);
  return true;
}

static uint32_t intern_locked(const char *s, size_t len) {
  bool added;
  if (len > STRING_MAX) len = STRING_MAX;
  uint32_t id = pst_itab_add(&strings, s, len, &added);
  if (added) {
    struct pst_record r = { .type = PST_REC_STRING, .string = { id, (uint32_t)len, s } };
    if (!meta_append(&r)) id = 0; /* the text never reaches the file: do not hand out its id */
  }
  if (!id) atomic_fetch_add(&dict_drops, 1);
  return id;
}

uint32_t pst_trace_intern(const char *s) {
  uint32_t id = 0;
  if (!s || !atomic_load_explicit(&tracing_on, memory_order_relaxed)) return 0;
  ps_mutex_lock(&dict_lock);
  if (dict_open) id = intern_locked(s, strlen(s));
  ps_mutex_unlock(&dict_lock);
  return id;
}

uint32_t pst_trace_stack_here(int skip) {
  enum { MAX_SKIP = 16 };
  void *pcs[1 + MAX_SKIP + PST_STACK_MAX_DEPTH];
  uint32_t id = 0;
  bool added;
  if (!atomic_load_explicit(&tracing_on, memory_order_relaxed)) return 0;
  if (skip < 0) skip = 0;
  if (skip > MAX_SKIP) skip = MAX_SKIP;
  const int first = 1 + skip; /* frame 0 is this function */
  int n = unw_backtrace(pcs, first + PST_STACK_MAX_DEPTH);
  if (n <= first) return 0;
  ps_mutex_lock(&dict_lock);
  if (dict_open) id = pst_itab_add(&stacks, pcs + first, (size_t)(n - first) * sizeof(void *), &added);
  ps_mutex_unlock(&dict_lock);
  if (!id) atomic_fetch_add(&dict_drops, 1);
  return id;
}

/* Looks up the symbol of each new stack's frames (the slow part, kept off the threads that
 * capture stacks) and appends its STACK record after the STRING records it names. */
static void symbolize_new_stacks(void) {
  ps_mutex_lock(&dict_lock);
  const uint32_t last = dict_open ? stacks.count : 0;
  ps_mutex_unlock(&dict_lock);
  for (uint32_t id = stacks_symbolized + 1; id <= last; id++) {
    size_t len;
    const uint64_t *pcs = pst_itab_key(&stacks, id, &len); /* immutable once added */
    struct pst_frame frames[PST_STACK_MAX_DEPTH];
    const uint32_t depth = (uint32_t)(len / sizeof(uint64_t));
    for (uint32_t i = 0; i < depth; i++) {
      Dl_info info;
      char buf[256];
      const char *name = NULL;
      uint64_t start = pcs[i];
      /* pc - 1: a return address may already belong to the next function. */
      if (dladdr((void *)(uintptr_t)(pcs[i] - 1), &info)) {
        if (info.dli_sname) {
          name = info.dli_sname;
          start = (uint64_t)(uintptr_t)info.dli_saddr;
        } else if (info.dli_fname) {
          const char *base = strrchr(info.dli_fname, '/');
          snprintf(buf, sizeof buf, "[%s]", base ? base + 1 : info.dli_fname);
          name = buf;
          start = (uint64_t)(uintptr_t)info.dli_fbase;
        }
      }
      frames[i] = (struct pst_frame){ .pc = pcs[i], .offset = (uint32_t)(pcs[i] - start) };
      if (name) {
        ps_mutex_lock(&dict_lock);
        frames[i].symbol = dict_open ? intern_locked(name, strlen(name)) : 0;
        ps_mutex_unlock(&dict_lock);
      }
    }
    struct pst_record r = { .type = PST_REC_STACK, .stack = { id, depth, frames } };
    ps_mutex_lock(&dict_lock);
    if (dict_open && !meta_append(&r)) atomic_fetch_add(&dict_drops, 1);
    ps_mutex_unlock(&dict_lock);
  }
  stacks_symbolized = last;
}

/* Moves meta into blocks, whole records at a time; the lock is not held across writes. */
static void flush_meta(void) {
  for (;;) {
    ps_mutex_lock(&dict_lock);
    if (meta_flushed == meta_used) {
      meta_flushed = meta_used = 0;
      ps_mutex_unlock(&dict_lock);
      return;
    }
    size_t n = 0;
    while (meta_flushed + n < meta_used) {
      uint32_t len;
      memcpy(&len, meta + meta_flushed + n + 4, 4);
      const size_t rec = PST_RECORD_HEADER_SIZE + len;
      if (block_used + n + rec > BLOCK_CAP) break;
      n += rec;
    }
    if (n) memcpy(block + PST_BLOCK_HEADER_SIZE + block_used, meta + meta_flushed, n);
    block_used += n;
    meta_flushed += n;
    ps_mutex_unlock(&dict_lock);
    if (!n || meta_flushed < meta_used) block_write();
  }
}

/* ---- flushing ---- */

/* Writes what every ring holds now. Records name strings and stacks interned before
 * they were published, so heads are read first, then the dictionary is written, then the
 * rings: a reader meets every id's definition before its use. Caller holds flush_lock. */
static void flush_locked(void) {
  static uint64_t heads[MAX_RINGS];
  static bool orphan[MAX_RINGS];
  const uint32_t hwm = atomic_load(&ring_hwm);
  for (uint32_t i = 0; i < hwm; i++) {
    const int st = atomic_load(&rings[i].state);
    orphan[i] = st == RING_ORPHAN;
    heads[i] = st == RING_OWNED || st == RING_ORPHAN ? atomic_load(&rings[i].head)
                                                      : atomic_load(&rings[i].tail);
  }
  symbolize_new_stacks();
  flush_meta();
  for (uint32_t i = 0; i < hwm; i++) {
    struct ring *rg = &rings[i];
    const uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    const size_t n = (size_t)(heads[i] - tail);
    if (n) {
      uint8_t *dst = block_room(n);
      const size_t at = (size_t)(tail % RING_BYTES), first = n < RING_BYTES - at ? n : RING_BYTES - at;
      memcpy(dst, rg->data + at, first);
      memcpy(dst + first, rg->data, n - first);
      block_used += n;
      atomic_store_explicit(&rg->tail, heads[i], memory_order_release);
    }
    if (orphan[i]) atomic_store(&rg->state, RING_FREE); /* its thread is gone: reuse the slot */
  }
  block_write();
}

void pst_trace_flush(void) {
  ps_mutex_lock(&flush_lock);
  if (fd >= 0 && !write_failed) flush_locked();
  ps_mutex_unlock(&flush_lock);
}

/* The flush thread waits on wake with a CLOCK_MONOTONIC deadline, so wake must measure
 * time by that clock: a default condition variable reads the deadline as CLOCK_REALTIME,
 * where it is decades past, and the flush thread would never sleep. */
static void init_wake(void) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&wake, &attr);
  pthread_condattr_destroy(&attr);
}

static void *flush_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "psshim-trace"); /* so ps -T and debuggers say whose */
  ps_mutex_lock(&wake_lock);
  while (!stopping) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += FLUSH_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    ps_cond_timedwait(&wake, &wake_lock, &until);
    if (stopping) break;
    ps_mutex_unlock(&wake_lock);
    pst_trace_flush();
    ps_mutex_lock(&wake_lock);
  }
  ps_mutex_unlock(&wake_lock);
  return NULL;
}

/* ---- emitting ---- */

static void thread_exit(void *arg) {
  struct ring *rg = arg;
  if (rg != DEAD_RING && tls_gen == atomic_load(&generation)) {
    int owned = RING_OWNED;
    atomic_compare_exchange_strong(&rg->state, &owned, RING_ORPHAN);
  }
  tls_ring = DEAD_RING;
}

/* The calling thread's ring for this trace, claiming a free slot the first time. */
static struct ring *my_ring(void) {
  const uint32_t gen = atomic_load_explicit(&generation, memory_order_acquire);
  if (tls_ring == DEAD_RING) return NULL;
  if (tls_ring && tls_gen == gen) return tls_ring;
  for (uint32_t i = 0; i < MAX_RINGS; i++) {
    int expect = RING_FREE;
    struct ring *rg = &rings[i];
    if (!atomic_compare_exchange_strong(&rg->state, &expect, RING_CLAIMING)) continue;
    if (!rg->data && !(rg->data = pst_map(RING_BYTES))) {
      atomic_store(&rg->state, RING_FREE);
      return NULL;
    }
    atomic_store(&rg->head, atomic_load(&rg->tail)); /* drop counts stay: summed at close */
    rg->tid = (uint32_t)gettid();
    uint32_t hwm = atomic_load(&ring_hwm);
    while (hwm < i + 1 && !atomic_compare_exchange_weak(&ring_hwm, &hwm, i + 1)) {
    }
    if (atomic_load(&generation) != gen) { /* closed meanwhile */
      atomic_store(&rg->state, RING_FREE);
      return NULL;
    }
    atomic_store(&rg->state, RING_OWNED);
    tls_ring = rg;
    tls_gen = gen;
    pthread_setspecific(exit_key, rg); /* once per thread: its destructor frees the slot */
    return rg;
  }
  return NULL;
}

/* Sorts and deduplicates n pointers in place (shell sort: no malloc, no recursion);
 * returns the count left. */
uint32_t pst_sort_unique(uint64_t *p, uint32_t n) {
  uint32_t run = 1; /* launch pointers usually come sorted already: check in one pass */
  while (run < n && p[run - 1] < p[run]) run++;
  if (run >= n) return n;
  static const uint32_t gaps[] = { 57, 23, 10, 4, 1 };
  for (size_t g = 0; g < sizeof gaps / sizeof *gaps; g++)
    for (uint32_t i = gaps[g]; i < n; i++) {
      const uint64_t v = p[i];
      uint32_t j = i;
      for (; j >= gaps[g] && p[j - gaps[g]] > v; j -= gaps[g]) p[j] = p[j - gaps[g]];
      p[j] = v;
    }
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++)
    if (!k || p[i] != p[k - 1]) p[k++] = p[i];
  return k;
}

void pst_trace_emit(const struct pst_record *in) {
  if (!atomic_load_explicit(&tracing_on, memory_order_relaxed)) return;
  if (in->type <= PST_REC_STACK || in->type >= PST_REC_END) return;
  struct ring *rg = my_ring();
  if (!rg) {
    atomic_fetch_add_explicit(&orphan_drops, 1, memory_order_relaxed);
    return;
  }
  /* busy before the second look at tracing_on: close waits for busy to clear. */
  atomic_store(&rg->busy, 1);
  if (!atomic_load(&tracing_on) || tls_gen != atomic_load(&generation)) {
    atomic_store_explicit(&rg->busy, 0, memory_order_release);
    return;
  }
  struct pst_record r = *in;
  uint64_t ptrs[PST_LAUNCH_MAX_PTRS];
  uint8_t enc[PST_RECORD_HEADER_SIZE + 24 + sizeof ptrs];
  if (r.type == PST_REC_LAUNCH) {
    uint32_t n = r.launch.n;
    if (n > PST_LAUNCH_MAX_PTRS) {
      n = PST_LAUNCH_MAX_PTRS;
      r.flags |= PST_RF_TRUNCATED;
    }
    if (n) memcpy(ptrs, r.launch.ptrs, (size_t)n * sizeof *ptrs);
    r.launch.n = pst_sort_unique(ptrs, n);
    r.launch.ptrs = ptrs;
  } else if (r.type == PST_REC_NOTE) {
    size_t len = r.note.len ? r.note.len : strlen(r.note.text);
    r.note.len = (uint32_t)(len > PST_NOTE_MAX ? PST_NOTE_MAX : len);
  }
  if (!r.ts_ns) r.ts_ns = now_ns(CLOCK_MONOTONIC);
  r.tid = rg->tid;
  const size_t n = pst_encode_record(&r, enc);
  const uint64_t head = atomic_load_explicit(&rg->head, memory_order_relaxed);
  const uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_acquire);
  if (head - tail + n > RING_BYTES) {
    atomic_fetch_add_explicit(&rg->dropped, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rg->dropped_bytes, n, memory_order_relaxed);
  } else {
    const size_t at = (size_t)(head % RING_BYTES), first = n < RING_BYTES - at ? n : RING_BYTES - at;
    memcpy(rg->data + at, enc, first);
    memcpy(rg->data, enc + first, n - first);
    atomic_store_explicit(&rg->head, head + n, memory_order_release);
  }
  atomic_store_explicit(&rg->busy, 0, memory_order_release);
}

bool pst_trace_enabled(void) {
  return atomic_load_explicit(&tracing_on, memory_order_relaxed);
}

/* ---- open, close, fork ---- */

/* Frees everything the trace holds and marks every ring free; no file I/O. Callers made
 * sure no thread is inside an emit (close) or that no other thread exists (fork child). */
static void release_all(void) {
  atomic_fetch_add(&generation, 1);
  for (uint32_t i = 0; i < MAX_RINGS; i++) {
    pst_unmap(rings[i].data, RING_BYTES);
    rings[i].data = NULL;
    atomic_store(&rings[i].head, 0);
    atomic_store(&rings[i].tail, 0);
    atomic_store(&rings[i].busy, 0);
    atomic_store(&rings[i].dropped, 0);
    atomic_store(&rings[i].dropped_bytes, 0);
    atomic_store(&rings[i].state, RING_FREE);
  }
  atomic_store(&ring_hwm, 0);
  atomic_store(&orphan_drops, 0);
  atomic_store(&dict_drops, 0);
  if (dict_open) {
    pst_itab_destroy(&strings);
    pst_itab_destroy(&stacks);
    dict_open = false;
  }
  pst_unmap(meta, META_BYTES);
  pst_unmap(block, PST_BLOCK_HEADER_SIZE + BLOCK_CAP);
  pst_unmap(trace_path, PATH_MAX);
  meta = block = NULL;
  trace_path = NULL;
  meta_used = meta_flushed = block_used = 0;
  stacks_symbolized = 0;
  if (fd >= 0) close(fd);
  fd = -1;
  write_failed = false;
}

/* The child of a fork has only the forking thread and a copy of the parent's buffers:
 * it stops tracing, leaves the parent's file alone, and may open a trace of its own. */
static void atfork_child(void) {
  atomic_store(&tracing_on, 0);
  pthread_mutex_init(&open_lock.m, NULL);
  pthread_mutex_init(&flush_lock.m, NULL);
  pthread_mutex_init(&dict_lock.m, NULL);
  pthread_mutex_init(&wake_lock.m, NULL);
  init_wake();
  stopping = false;
  release_all();
}

static void init_once(void) {
  init_wake();
  pthread_key_create(&exit_key, thread_exit);
  pthread_atfork(NULL, NULL, atfork_child);
}

bool pst_trace_open(const char *path, const struct pst_trace_header *h) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_once);
  ps_mutex_lock(&open_lock);
  if (fd >= 0) {
    ps_mutex_unlock(&open_lock);
    say("already open, not opening", path, 0);
    return false;
  }
  /* The user names the file: made as any program makes one, so the umask decides who may
   * read it, and a link the user made is followed (docs/security.md). */
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    say("cannot be created:", path, errno);
    ps_mutex_unlock(&open_lock);
    return false;
  }
  struct pst_trace_header hd = *h;
  hd.version = PST_TRACE_VERSION;
  if (!hd.pid) hd.pid = (uint32_t)getpid();
  if (!hd.start_ns) {
    hd.start_ns = now_ns(CLOCK_MONOTONIC);
    hd.wall_ns = now_ns(CLOCK_REALTIME);
  }
  uint8_t fh[PST_FILE_HEADER_SIZE];
  pst_encode_file_header(&hd, fh);
  meta = pst_map(META_BYTES);
  block = pst_map(PST_BLOCK_HEADER_SIZE + BLOCK_CAP);
  trace_path = pst_map(PATH_MAX);
  if (trace_path) snprintf(trace_path, PATH_MAX, "%s", path);
  dict_open = pst_itab_init(&strings, STRING_ARENA, STRING_COUNT);
  if (dict_open && !pst_itab_init(&stacks, STACK_ARENA, STACK_COUNT)) {
    pst_itab_destroy(&strings);
    dict_open = false;
  }
  if (meta && block && trace_path && dict_open) write_all(fh, sizeof fh);
  if (!meta || !block || !trace_path || !dict_open || write_failed) {
    if (!write_failed) say("cannot be set up (out of memory):", path, 0);
    release_all();
    ps_mutex_unlock(&open_lock);
    return false;
  }
  stopping = false;
  atomic_fetch_add(&generation, 1);
  atomic_store(&tracing_on, 1);
  /* The flush thread takes no signals: they belong to the host program's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int err = pthread_create(&flusher, NULL, flush_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err) {
    say("flush thread cannot start:", path, err);
    atomic_store(&tracing_on, 0);
    release_all();
    ps_mutex_unlock(&open_lock);
    return false;
  }
  ps_mutex_unlock(&open_lock);
  return true;
}

void pst_trace_close(void) {
  ps_mutex_lock(&open_lock);
  if (fd < 0) {
    ps_mutex_unlock(&open_lock);
    return;
  }
  atomic_store(&tracing_on, 0);
  for (uint32_t i = 0; i < MAX_RINGS; i++)
    while (atomic_load(&rings[i].busy)) sched_yield();
  ps_mutex_lock(&wake_lock);
  stopping = true;
  pthread_cond_signal(&wake);
  ps_mutex_unlock(&wake_lock);
  pthread_join(flusher, NULL);

  ps_mutex_lock(&flush_lock);
  flush_locked();
  uint64_t drops = atomic_load(&orphan_drops) + atomic_load(&dict_drops), bytes = 0;
  for (uint32_t i = 0; i < MAX_RINGS; i++) {
    drops += atomic_load(&rings[i].dropped);
    bytes += atomic_load(&rings[i].dropped_bytes);
  }
  const uint32_t tid = (uint32_t)gettid();
  if (drops) {
    char text[160];
    int len = snprintf(text, sizeof text,
                       "dropped %llu records (%llu bytes) because the trace writer fell behind",
                       (unsigned long long)drops, (unsigned long long)bytes);
    struct pst_record r = { .type = PST_REC_NOTE, .tid = tid, .ts_ns = now_ns(CLOCK_MONOTONIC),
                            .note = { (uint32_t)len, text } };
    block_used += pst_encode_record(&r, block_room(pst_record_size(&r)));
  }
  struct pst_record end = { .type = PST_REC_END, .tid = tid, .ts_ns = now_ns(CLOCK_MONOTONIC) };
  block_used += pst_encode_record(&end, block_room(pst_record_size(&end)));
  block_write();
  ps_mutex_lock(&dict_lock);
  release_all();
  ps_mutex_unlock(&dict_lock);
  ps_mutex_unlock(&flush_lock);
  ps_mutex_unlock(&open_lock);
}
