/* Ranked locks (core.h): each breach of the rule aborts with the locks named; the allowed
 * patterns do not. Each case runs in a forked child so that an abort is observed, not
 * suffered. Built with checks on (tests never define NDEBUG). */
#include "core/core.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static ps_mutex low = PS_MUTEX_INITIALIZER(PS_RANK_SETUP, "the low lock");
static ps_mutex high = PS_MUTEX_INITIALIZER(PS_RANK_TRACE_DICT, "the high lock");
static ps_mutex dev0, dev1;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* Runs fn in a child with stderr captured; the child's stderr in out, and whether it
 * aborted (SIGABRT). */
static bool aborts(void (*fn)(void), char *out, size_t outlen)
{
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], STDERR_FILENO);
    close(p[0]);
    fn();
    _exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while (n < outlen - 1 && (r = read(p[0], out + n, outlen - 1 - n)) > 0)
    n += (size_t)r;
  out[n] = 0;
  close(p[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void high_then_low(void)
{
  ps_mutex_lock(&high);
  ps_mutex_lock(&low);
}

static void low_then_high(void)
{
  ps_mutex_lock(&low);
  ps_mutex_lock(&high);
  ps_mutex_unlock(&low); /* release order is free */
  ps_mutex_unlock(&high);
}

static void devices_descending(void)
{
  ps_mutex_lock(&dev1);
  ps_mutex_lock(&dev0);
}

static void devices_ascending(void)
{
  ps_mutex_lock(&dev0);
  ps_mutex_lock(&dev1);
  ps_mutex_unlock(&dev1);
  ps_mutex_unlock(&dev0);
}

static void release_unheld(void) { ps_mutex_unlock(&low); }

static void take_twice(void)
{
  ps_mutex_lock(&low);
  ps_mutex_trylock(&low); /* fails: a mutex is not recursive; must not count as taken */
  ps_mutex_unlock(&low);
  ps_mutex_lock(&low);
  ps_mutex_lock(&low);
}

static void trylock_out_of_order(void)
{
  ps_mutex_lock(&high);
  if (ps_mutex_trylock(&low) == 0)
    ps_mutex_unlock(&low);
  ps_mutex_unlock(&high);
}

static void wait_without_lock(void)
{
  struct timespec now = {0, 0};
  ps_cond_timedwait(&cond, &low, &now);
}

static void assert_unheld(void) { ps_mutex_assert_held(&dev0); }

static void assert_held_ok(void)
{
  ps_mutex_lock(&dev0);
  ps_mutex_assert_held(&dev0);
  ps_mutex_unlock(&dev0);
}

static void none_while_holding(void)
{
  ps_mutex_lock(&low);
  ps_lock_check_none("waiting for the owner");
}

static void test_order(void **state)
{
  (void)state;
  char out[1024];
  assert_true(aborts(high_then_low, out, sizeof out));
  assert_non_null(strstr(out, "psshim: check failed: taking the low lock"));
  assert_non_null(strstr(out, "while holding the high lock"));
  assert_false(aborts(low_then_high, out, sizeof out));
  assert_string_equal(out, "");
  assert_false(aborts(trylock_out_of_order, out, sizeof out));
}

static void test_devices_by_ordinal(void **state)
{
  (void)state;
  char out[1024];
  assert_true(aborts(devices_descending, out, sizeof out));
  assert_non_null(strstr(out, "device 0"));
  assert_non_null(strstr(out, "device 1"));
  assert_false(aborts(devices_ascending, out, sizeof out));
}

static void test_release_and_reentry(void **state)
{
  (void)state;
  char out[1024];
  assert_true(aborts(release_unheld, out, sizeof out));
  assert_non_null(strstr(out, "releasing the low lock, which this thread does not hold"));
  assert_true(aborts(take_twice, out, sizeof out));
  assert_non_null(strstr(out, "already holds"));
}

static void test_held(void **state)
{
  (void)state;
  char out[1024];
  assert_true(aborts(wait_without_lock, out, sizeof out));
  assert_non_null(strstr(out, "the low lock"));
  assert_true(aborts(assert_unheld, out, sizeof out));
  assert_non_null(strstr(out, "assert_unheld needs device 0"));
  assert_false(aborts(assert_held_ok, out, sizeof out));
  assert_true(aborts(none_while_holding, out, sizeof out));
  assert_non_null(strstr(out, "waiting for the owner while holding the low lock"));
}

int main(void)
{
  ps_mutex_init(&dev0, PS_RANK_DEVICE + 0, "device 0");
  ps_mutex_init(&dev1, PS_RANK_DEVICE + 1, "device 1");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_devices_by_ordinal),
      cmocka_unit_test(test_release_and_reentry),
      cmocka_unit_test(test_held),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
