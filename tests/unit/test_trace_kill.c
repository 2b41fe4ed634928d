/* A traced process killed with SIGKILL leaves a readable trace: everything flushed before
 * the kill reads back whole, and at most a torn last block is lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_trace_util.h"
#include "tracer/tracer.h"

/* The child: emits numbered launches until it is killed. paced: a few per millisecond
 * (the flusher keeps up); else as fast as it can (the flusher writes all the time). */
_Noreturn static void child(const char *path, int paced) {
  const struct pst_trace_header h = { .chunk_size = 1 << 20, .device = "killed" };
  if (!pst_trace_open(path, &h)) _exit(1);
  const uint32_t name = pst_trace_intern("step");
  for (uint64_t i = 0;; i++) {
    const uint64_t p = i * 64;
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_LAUNCH, .launch = { 1, i, name, 1, &p } });
    if (paced && i % 4 == 3) usleep(1000);
  }
}

/* Whether the trace at path already holds a flushed "step" (the child's first flush). */
static bool flushed(const char *path) {
  struct trace_read t;
  bool yes = test_trace_read(path, &t) && test_trace_string(&t, 1) && !strcmp(test_trace_string(&t, 1), "step");
  test_trace_read_free(&t);
  return yes;
}

/* Kills the child ms after its first flush (waited for, up to 10 s: a loaded machine may
 * take longer than any fixed delay to get there). */
static void kill_after(const char *path, int paced, int ms, struct trace_read *t) {
  unlink(path);
  pid_t pid = fork();
  if (pid == 0) child(path, paced);
  for (int i = 0; i < 1000 && !flushed(path); i++)
    nanosleep(&(struct timespec){ .tv_nsec = 10000000L }, NULL);
  nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L }, NULL);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  assert_true(test_trace_read(path, t));
  assert_false(t->stats.clean_end);
  assert_int_equal(t->stats.bad_blocks, 0);
  /* Only a torn tail may be missing, nothing else. */
  if (t->error[0]) assert_non_null(strstr(t->error, "truncated at byte"));
  assert_int_equal(t->header.pid, pid);
  const char *step = test_trace_string(t, 1);
  assert_non_null(step); /* the first flush happened before the kill */
  assert_string_equal(step, "step");
}

static void test_killed_while_paced(void **state) {
  (void)state;
  const char *path = test_trace_path("killed-paced");
  struct trace_read t;
  kill_after(path, 1, 550, &t);
  /* ~5 flushes happened, each with every record emitted before it, in order, no gaps. */
  size_t launches = 0;
  for (size_t i = 0; i < t.n; i++)
    if (t.recs[i].type == PST_REC_LAUNCH) assert_int_equal(t.recs[i].launch.seq, launches++);
  assert_true(launches >= 100);
  test_trace_read_free(&t);
  unlink(path);
}

static void test_killed_while_flooding(void **state) {
  (void)state;
  const char *path = test_trace_path("killed-flood");
  for (int ms = 250; ms <= 450; ms += 100) { /* after the first flush, even on a busy machine */
    struct trace_read t;
    kill_after(path, 0, ms, &t);
    uint64_t last = 0;
    size_t launches = 0;
    for (size_t i = 0; i < t.n; i++) {
      if (t.recs[i].type != PST_REC_LAUNCH) continue;
      /* A full ring drops records, so there may be gaps, but never disorder. */
      assert_true(launches == 0 || t.recs[i].launch.seq > last);
      last = t.recs[i].launch.seq;
      launches++;
    }
    assert_true(launches > 0);
    test_trace_read_free(&t);
  }
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_killed_while_paced),
    cmocka_unit_test(test_killed_while_flooding),
  };
  return cmocka_run_group_tests(tests, NULL, test_trace_remove_all);
}
