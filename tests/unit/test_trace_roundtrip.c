/* Trace writer -> reader round trips: every record kind, strings and stacks, threads,
 * drops, ring reuse and fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_trace_util.h"
#include "tracer/trace_codec.h" /* the record layout itself */
#include "tracer/tracer.h"

static const struct pst_trace_header test_header = {
  .chunk_size = 64u << 20, .gpu_budget = 16ull << 30, .host_budget = 64ull << 30,
  .device = "NVIDIA H200 (test)", .space_base = 0x7f0000000000ull, .space_size = 1ull << 40,
};

static void open_trace(const char *path) {
  assert_true(pst_trace_open(path, &test_header));
}

/* What a test leaves behind, undone by its teardown (cleanup) even when an assertion ends
 * the test midway: the open trace, the trace read back, the files. */
static struct trace_read readback;
static const char *files[2];

/* A fresh trace path, removed after the test. */
static const char *trace_file(const char *name) {
  const char *path = test_trace_path(name);
  for (size_t i = 0; i < sizeof files / sizeof *files; i++)
    if (!files[i]) return files[i] = path;
  fail_msg("more trace files than the fixture holds");
  return NULL;
}

/* Reads path back into readback, replacing what it held. */
static struct trace_read *read_back(const char *path) {
  test_trace_read_free(&readback);
  assert_true(test_trace_read(path, &readback));
  return &readback;
}

static int cleanup(void **state) {
  (void)state;
  pst_trace_close();
  test_trace_read_free(&readback);
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    if (files[i]) unlink(files[i]);
    files[i] = NULL;
  }
  return 0;
}

static const struct pst_record *find(const struct trace_read *t, unsigned type, size_t nth) {
  for (size_t i = 0; i < t->n; i++)
    if (t->recs[i].type == type && nth-- == 0) return &t->recs[i];
  fail_msg("no record %s #%zu", pst_record_type_name(type), nth);
  return NULL;
}

/* Version 1's bytes for one record of each type, as the format was first written: a round
 * trip cannot tell a field moved on both sides, which would leave older traces unreadable. */
static void test_record_bytes(void **state) {
  (void)state;
  const struct pst_frame frames[] = { { 0x1111, 3, 4 }, { 0x2222, 5, 6 } };
  const uint64_t ptrs[] = { 7, 8, 9 };
  const struct pst_record in[] = {
    { .type = PST_REC_STRING, .string = { 5, 5, "hello" } },
    { .type = PST_REC_STACK, .stack = { 9, 2, frames } },
    { .type = PST_REC_ALLOC, .alloc = { 0x1234567890, 77, 3, 4, 5, PST_PLACE_HOST } },
    { .type = PST_REC_FREE, .free = { 99, 98 } },
    { .type = PST_REC_CHUNK, .chunk = { 1, 2, 3, 4 } },
    { .type = PST_REC_LAUNCH, .launch = { 1, 2, 3, 3, ptrs } },
    { .type = PST_REC_COPY, .copy = { 1, 2, 3, 4, 5, 6, 7 } },
    { .type = PST_REC_MIGRATION, .migration = { 1, 1, 2, 3, 4, 5 } },
    { .type = PST_REC_SYNC, .sync = { 2, 42 } },
    { .type = PST_REC_SAMPLE, .sample = { 1, 2, 3, 4 } },
    { .type = PST_REC_ITERATION,
      .iteration = { .iteration = 1, .period = 2, .pager_ns = 3, .turns_ns = 4, .late_waits = 5, .late_wait_ns = 6 } },
    { .type = PST_REC_NOTE, .note = { 5, "note!" } },
    { .type = PST_REC_END },
  };
  static const char *const want[] = { /* the 20-byte header (type, flags, length, ts_ns, tid), then the payload */
    "0100000009000000e8030000000000000700000005000000" "68656c6c6f",
    "0200000028000000e9030000000000000700000009000000020000001111000000000000030000000400000022220000000000000500"
    "000006000000",
    "0300000024000000ea030000000000000700000090785634120000004d00000000000000030000000000000004000000050000000100"
    "0000",
    "0400000010000000eb030000000000000700000063000000000000006200000000000000",
    "0500000018000000ec0300000000000007000000010000000200000003000000000000000400000000000000",
    "0600000030000000ed030000000000000700000001000000000000000200000000000000030000000300000007000000000000000800"
    "0000000000000900000000000000",
    "0700000038000000ee030000000000000700000001000000000000000200000000000000030000000000000004000000000000000500"
    "0000000000000600000000000000" "0700000000000000",
    "0800000020000000ef03000000000000070000000100000001000200030000000000000004000000000000000500000000000000",
    "0900000010000000f0030000000000000700000002000000000000002a00000000000000",
    "0a00000020000000f103000000000000070000000100000000000000020000000000000003000000000000000400000000000000",
    "0b00000030000000f2030000000000000700000001000000000000000200000000000000030000000000000004000000000000000500"
    "0000000000000600000000000000",
    "0c00000005000000f303000000000000070000006e6f746521",
    "0d00000000000000f40300000000000007000000",
  };
  _Static_assert(sizeof in / sizeof *in == sizeof want / sizeof *want, "one layout per record");
  uint8_t buf[256];
  char hex[2 * sizeof buf + 1];
  struct pst_decode_scratch scratch = { 0 };
  for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
    struct pst_record r = in[i];
    r.ts_ns = 1000 + i;
    r.tid = 7;
    size_t n = pst_encode_record(&r, buf);
    assert_int_equal(n, pst_record_size(&r));
    for (size_t j = 0; j < n; j++) snprintf(hex + 2 * j, 3, "%02x", buf[j]);
    hex[2 * n] = '\0';
    assert_string_equal(hex, want[i]);
    struct pst_record back;
    size_t used;
    assert_int_equal(pst_decode_record(buf, n, &back, &used, &scratch), PST_DECODE_OK);
    assert_int_equal(used, n);
    assert_int_equal(back.type, r.type);
    assert_int_equal(back.ts_ns, r.ts_ns);
  }
  free(scratch.frames);
  free(scratch.ptrs);
}

static void test_every_kind(void **state) {
  (void)state;
  const char *path = trace_file("kinds");
  open_trace(path);
  const uint32_t kname = pst_trace_intern("sgemm_kernel<float>");
  assert_int_not_equal(kname, 0);
  assert_int_equal(pst_trace_intern("sgemm_kernel<float>"), kname);
  const uint64_t ptrs[] = { 30, 10, 20, 10, 30, 5 };
  const struct pst_record in[] = {
    { .type = PST_REC_ALLOC, .ts_ns = 1001,
      .alloc = { 0x7f0000001000, 4096, 7, 0, 3, PST_PLACE_HOST } },
    { .type = PST_REC_FREE, .ts_ns = 1002, .free = { 0x7f0000001000, 7 } },
    { .type = PST_REC_CHUNK, .ts_ns = 1003,
      .chunk = { 3, PST_CHUNK_FRAME_GPU, 0x7f0000000000, 64u << 20 } },
    { .type = PST_REC_LAUNCH, .ts_ns = 1004, .launch = { 7, 42, kname, 6, ptrs } },
    { .type = PST_REC_COPY, .ts_ns = 1005,
      .copy = { PST_COPY_D2H, 1 << 20, 0xa000, 0xb000, 7, 2000, 3000 } },
    { .type = PST_REC_MIGRATION, .ts_ns = 1006,
      .migration = { 3, PST_DIR_D2H, PST_REASON_EVICT, 64u << 20, 4000, 5000 } },
    { .type = PST_REC_SYNC, .ts_ns = 1007, .sync = { PST_SYNC_STREAM, 7 } },
    { .type = PST_REC_SAMPLE, .ts_ns = 1008, .sample = { 1, 2, 3, 4 } },
    { .type = PST_REC_ITERATION, .ts_ns = 1009,
      .iteration = { .iteration = 12, .period = 345, .pager_ns = 6, .turns_ns = 5, .late_waits = 4, .late_wait_ns = 3 } },
    { .type = PST_REC_NOTE, .ts_ns = 1010, .note = { 0, "CUPTI unavailable" } },
  };
  for (size_t i = 0; i < sizeof in / sizeof *in; i++) pst_trace_emit(&in[i]);
  /* The writer's own kinds are refused from outside. */
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_END });
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_STRING, .string = { 99, 1, "x" } });
  pst_trace_close();
  assert_false(pst_trace_enabled());

  struct trace_read *t = read_back(path);
  if (t->error[0]) fail_msg("%s", t->error);
  assert_true(t->stats.clean_end);
  assert_int_equal(t->header.version, PST_TRACE_VERSION);
  assert_int_equal(t->header.pid, getpid());
  assert_int_equal(t->header.chunk_size, test_header.chunk_size);
  assert_int_equal(t->header.gpu_budget, test_header.gpu_budget);
  assert_int_equal(t->header.host_budget, test_header.host_budget);
  assert_string_equal(t->header.device, test_header.device);
  assert_int_equal(t->header.space_base, test_header.space_base);
  assert_int_equal(t->header.space_size, test_header.space_size);
  assert_true(t->header.start_ns > 0 && t->header.wall_ns > t->header.start_ns);
  assert_int_equal(test_trace_count(t, PST_REC_STRING), 1);
  assert_string_equal(test_trace_string(t, kname), "sgemm_kernel<float>");
  assert_int_equal(test_trace_count(t, PST_REC_END), 1);
  assert_int_equal(t->recs[t->n - 1].type, PST_REC_END);

  for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
    const struct pst_record *got = find(t, in[i].type, 0), *want = &in[i];
    assert_int_equal(test_trace_count(t, want->type), 1);
    assert_int_equal(got->ts_ns, want->ts_ns);
    assert_int_equal(got->tid, gettid());
    switch (want->type) {
    case PST_REC_LAUNCH:
      assert_int_equal(got->launch.stream, 7);
      assert_int_equal(got->launch.seq, 42);
      assert_int_equal(got->launch.function, kname);
      assert_int_equal(got->launch.n, 4); /* sorted, duplicates gone */
      assert_int_equal(got->launch.ptrs[0], 5);
      assert_int_equal(got->launch.ptrs[1], 10);
      assert_int_equal(got->launch.ptrs[2], 20);
      assert_int_equal(got->launch.ptrs[3], 30);
      assert_int_equal(got->flags, 0);
      break;
    case PST_REC_NOTE:
      assert_int_equal(got->note.len, strlen("CUPTI unavailable"));
      assert_memory_equal(got->note.text, "CUPTI unavailable", got->note.len);
      break;
    case PST_REC_ALLOC:
      assert_memory_equal(&got->alloc, &want->alloc, sizeof want->alloc);
      break;
    case PST_REC_FREE:
      assert_memory_equal(&got->free, &want->free, sizeof want->free);
      break;
    case PST_REC_CHUNK:
      assert_memory_equal(&got->chunk, &want->chunk, sizeof want->chunk);
      break;
    case PST_REC_COPY:
      assert_int_equal(got->copy.kind, want->copy.kind);
      assert_int_equal(got->copy.bytes, want->copy.bytes);
      assert_int_equal(got->copy.src, want->copy.src);
      assert_int_equal(got->copy.dst, want->copy.dst);
      assert_int_equal(got->copy.stream, want->copy.stream);
      assert_int_equal(got->copy.start_ns, want->copy.start_ns);
      assert_int_equal(got->copy.end_ns, want->copy.end_ns);
      break;
    case PST_REC_MIGRATION:
      assert_int_equal(got->migration.chunk, 3);
      assert_int_equal(got->migration.direction, PST_DIR_D2H);
      assert_int_equal(got->migration.reason, PST_REASON_EVICT);
      assert_int_equal(got->migration.bytes, 64u << 20);
      assert_int_equal(got->migration.start_ns, 4000);
      assert_int_equal(got->migration.end_ns, 5000);
      break;
    case PST_REC_SYNC:
      assert_int_equal(got->sync.what, PST_SYNC_STREAM);
      assert_int_equal(got->sync.stream, 7);
      break;
    case PST_REC_SAMPLE:
      assert_memory_equal(&got->sample, &want->sample, sizeof want->sample);
      break;
    case PST_REC_ITERATION:
      assert_int_equal(got->iteration.iteration, 12);
      assert_int_equal(got->iteration.period, 345);
      assert_true(got->iteration.has_pager);
      assert_int_equal(got->iteration.pager_ns, 6);
      assert_int_equal(got->iteration.turns_ns, 5);
      assert_int_equal(got->iteration.late_waits, 4);
      assert_int_equal(got->iteration.late_wait_ns, 3);
      break;
    }
  }
}

static void test_launch_pointer_cap(void **state) {
  (void)state;
  const char *path = trace_file("cap");
  static uint64_t many[PST_LAUNCH_MAX_PTRS + 100];
  for (size_t i = 0; i < sizeof many / sizeof *many; i++) many[i] = 1000 - i % 700;
  open_trace(path);
  pst_trace_emit(&(struct pst_record){
      .type = PST_REC_LAUNCH, .launch = { 1, 1, 0, sizeof many / sizeof *many, many } });
  pst_trace_close();
  struct trace_read *t = read_back(path);
  const struct pst_record *l = find(t, PST_REC_LAUNCH, 0);
  assert_true(l->flags & PST_RF_TRUNCATED);
  assert_true(l->launch.n <= PST_LAUNCH_MAX_PTRS && l->launch.n > 0);
  for (uint32_t i = 1; i < l->launch.n; i++) assert_true(l->launch.ptrs[i - 1] < l->launch.ptrs[i]);
  assert_true(l->ts_ns >= t->header.start_ns); /* 0 given: the writer's clock */
}

/* Two allocation sites; visible to dladdr (the test links with -rdynamic). */
__attribute__((visibility("default"), noinline)) uint32_t psshim_test_site_a(void) {
  uint32_t id = pst_trace_stack_here(0);
  __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a tail call */
  return id;
}
__attribute__((visibility("default"), noinline)) uint32_t psshim_test_site_b(void) {
  uint32_t id = pst_trace_stack_here(0);
  __asm__ volatile("" ::: "memory");
  return id;
}

/* Runs psshim_test_site_a on a thread of its own. Every such thread has the same stack, frame
 * for frame: this function's one call site, under the same thread-start frames. Calls from
 * a loop in the test function would not do: the compiler may peel or unroll the loop, and
 * clang with UBSan does (the bounds check of a[3] splits off three iterations with three
 * call sites), which makes three stacks that rightly get three ids. */
__attribute__((visibility("default"), noinline)) void *psshim_test_site_a_thread(void *id) {
  *(uint32_t *)id = psshim_test_site_a();
  return NULL;
}

static const struct pst_record *stack_record(const struct trace_read *t, uint32_t id) {
  for (size_t i = 0; i < t->n; i++)
    if (t->recs[i].type == PST_REC_STACK && t->recs[i].stack.id == id) return &t->recs[i];
  fail_msg("no STACK record %u", id);
  return NULL;
}

static void test_stacks_deduped_and_symbolized(void **state) {
  (void)state;
  const char *path = trace_file("stacks");
  open_trace(path);
  uint32_t a[3], b = psshim_test_site_b();
  for (int i = 0; i < 3; i++) {
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, psshim_test_site_a_thread, &a[i]), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
  }
  assert_int_not_equal(a[0], 0);
  assert_int_not_equal(b, 0);
  assert_int_equal(a[0], a[1]); /* the same stack: the same id */
  assert_int_equal(a[0], a[2]);
  assert_int_not_equal(a[0], b); /* another stack: another id */
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_ALLOC, .alloc = { 1, 2, 0, a[0], 0, 0 } });
  pst_trace_close();

  struct trace_read *t = read_back(path);
  assert_int_equal(test_trace_count(t, PST_REC_STACK), 2);
  const struct pst_record *sa = stack_record(t, a[0]), *sb = stack_record(t, b);
  assert_true(sa < find(t, PST_REC_ALLOC, 0)); /* definitions come before their use */
  /* Two ids, two different stacks: a dedupe that merged or split wrongly shows here. */
  assert_true(sa->stack.depth >= 2 && sb->stack.depth >= 2);
  bool same = sa->stack.depth == sb->stack.depth;
  for (uint32_t i = 0; same && i < sa->stack.depth; i++)
    same = sa->stack.frames[i].pc == sb->stack.frames[i].pc;
  assert_false(same);
  /* Symbols: each site, then psshim_test_site_a's caller, found by dladdr. */
  assert_string_equal(test_trace_string(t, sa->stack.frames[0].symbol), "psshim_test_site_a");
  assert_true(sa->stack.frames[0].offset > 0);
  assert_string_equal(test_trace_string(t, sa->stack.frames[1].symbol), "psshim_test_site_a_thread");
  assert_true(sa->stack.frames[1].offset > 0);
  assert_string_equal(test_trace_string(t, sb->stack.frames[0].symbol), "psshim_test_site_b");
  assert_true(sb->stack.frames[0].offset > 0);
}

enum { THREADS = 8, PER_THREAD = 5000 };

static void *writer_thread(void *arg) {
  const uint64_t k = (uint64_t)(uintptr_t)arg;
  const uint32_t name = pst_trace_intern("kernel shared by all threads");
  for (uint64_t i = 0; i < PER_THREAD; i++) {
    const uint64_t p[2] = { 1000000 + k, i }; /* stored sorted: i first */
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_LAUNCH, .launch = { k, i, name, 2, p } });
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  const char *path = trace_file("threads");
  pthread_t th[THREADS];
  open_trace(path);
  for (uintptr_t k = 0; k < THREADS; k++) pthread_create(&th[k], NULL, writer_thread, (void *)k);
  for (int k = 0; k < THREADS; k++) pthread_join(th[k], NULL);
  pst_trace_close();

  struct trace_read *t = read_back(path);
  assert_true(t->stats.clean_end);
  if (t->error[0]) fail_msg("%s", t->error);
  assert_int_equal(test_trace_count(t, PST_REC_STRING), 1);
  assert_int_equal(test_trace_count(t, PST_REC_NOTE), 0); /* nothing dropped */
  uint64_t next[THREADS] = { 0 };
  uint32_t tid[THREADS] = { 0 };
  for (size_t i = 0; i < t->n; i++) {
    const struct pst_record *r = &t->recs[i];
    if (r->type != PST_REC_LAUNCH) continue;
    const uint64_t k = r->launch.stream;
    assert_true(k < THREADS);
    assert_int_equal(r->launch.seq, next[k]); /* each thread's records in its order */
    assert_int_equal(r->launch.ptrs[0], next[k]);
    assert_int_equal(r->launch.ptrs[1], 1000000 + k);
    if (!tid[k]) tid[k] = r->tid;
    assert_int_equal(r->tid, tid[k]);
    next[k]++;
  }
  for (int k = 0; k < THREADS; k++) assert_int_equal(next[k], PER_THREAD);
}

static void test_drops_are_counted(void **state) {
  (void)state;
  enum { FLOOD = 200000 };
  const char *path = trace_file("drops");
  open_trace(path);
  for (uint64_t i = 0; i < FLOOD; i++)
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_SAMPLE, .sample = { i, 0, 0, 0 } });
  pst_trace_close();
  struct trace_read *t = read_back(path);
  const size_t kept = test_trace_count(t, PST_REC_SAMPLE);
  const struct pst_record *note = find(t, PST_REC_NOTE, 0);
  char text[256];
  snprintf(text, sizeof text, "%.*s", (int)note->note.len, note->note.text);
  unsigned long long dropped = 0;
  assert_int_equal(sscanf(text, "dropped %llu records", &dropped), 1);
  assert_true(dropped > 0);
  assert_int_equal(kept + dropped, FLOOD);
}

static double cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static off_t file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return st.st_size;
}

/* The flush thread wakes every ~100 ms and sleeps in between: an idle trace costs next to no
 * CPU (a spinning flusher costs a core, and keeps up with floods it should drop), yet what
 * is emitted reaches the file without an explicit flush. */
static void test_flusher_sleeps_between_flushes(void **state) {
  (void)state;
  const char *path = trace_file("idle");
  open_trace(path);
  const off_t header_only = file_size(path);
  const double before = cpu_ms();
  nanosleep(&(struct timespec){ .tv_nsec = 500 * 1000000L }, NULL);
  const double idle = cpu_ms() - before;
  if (idle >= 100) fail_msg("%.0f ms of CPU in 500 ms with nothing to write", idle);
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, 1 } });
  for (int ms = 0; ms < 5000 && file_size(path) == header_only; ms += 10)
    nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000000L }, NULL);
  assert_true(file_size(path) > header_only);
  pst_trace_close();
  struct trace_read *t = read_back(path);
  assert_int_equal(test_trace_count(t, PST_REC_SYNC), 1);
}

static void *one_record(void *arg) {
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, (uintptr_t)arg } });
  return NULL;
}

/* More short-lived threads than ring slots: exited threads' rings are reused. */
static void test_ring_reuse(void **state) {
  (void)state;
  enum { N = 700 };
  const char *path = trace_file("reuse");
  open_trace(path);
  for (uintptr_t i = 0; i < N; i++) {
    pthread_t th;
    pthread_create(&th, NULL, one_record, (void *)i);
    pthread_join(th, NULL);
    if (i % 50 == 49) pst_trace_flush();
  }
  pst_trace_close();
  struct trace_read *t = read_back(path);
  assert_int_equal(test_trace_count(t, PST_REC_SYNC), N);
  assert_int_equal(test_trace_count(t, PST_REC_NOTE), 0);
}

static void test_fork_child_stops(void **state) {
  (void)state;
  const char *path = trace_file("parent"), *child_path = trace_file("child");
  open_trace(path);
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, 1 } });
  pid_t pid = fork();
  if (pid == 0) {
    /* In the child: tracing is off, its records go nowhere; a trace of its own works. */
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, 2 } });
    int ok = !pst_trace_enabled() && pst_trace_open(child_path, &test_header);
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, 3 } });
    pst_trace_close();
    _exit(ok ? 0 : 1);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC, .sync = { 0, 4 } });
  pst_trace_close();

  struct trace_read *t = read_back(path);
  assert_int_equal(test_trace_count(t, PST_REC_SYNC), 2);
  assert_int_equal(find(t, PST_REC_SYNC, 0)->sync.stream, 1);
  assert_int_equal(find(t, PST_REC_SYNC, 1)->sync.stream, 4);
  assert_int_equal(t->header.pid, getpid());
  t = read_back(child_path);
  assert_int_equal(test_trace_count(t, PST_REC_SYNC), 1);
  assert_int_equal(find(t, PST_REC_SYNC, 0)->sync.stream, 3);
  assert_int_equal(t->header.pid, pid);
}

static void test_off_and_bad_path(void **state) {
  (void)state;
  /* Closed: every call is a cheap no-op. */
  assert_false(pst_trace_enabled());
  assert_int_equal(pst_trace_intern("x"), 0);
  assert_int_equal(pst_trace_stack_here(0), 0);
  pst_trace_emit(&(struct pst_record){ .type = PST_REC_SYNC });
  pst_trace_flush();
  pst_trace_close();
  assert_false(pst_trace_open("/nonexistent-dir/x.trace", &test_header));
  assert_false(pst_trace_enabled());
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_record_bytes),
    cmocka_unit_test_teardown(test_every_kind, cleanup),
    cmocka_unit_test_teardown(test_launch_pointer_cap, cleanup),
    cmocka_unit_test_teardown(test_stacks_deduped_and_symbolized, cleanup),
    cmocka_unit_test_teardown(test_threads, cleanup),
    cmocka_unit_test_teardown(test_drops_are_counted, cleanup),
    cmocka_unit_test_teardown(test_flusher_sleeps_between_flushes, cleanup),
    cmocka_unit_test_teardown(test_ring_reuse, cleanup),
    cmocka_unit_test_teardown(test_fork_child_stops, cleanup),
    cmocka_unit_test_teardown(test_off_and_bad_path, cleanup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
