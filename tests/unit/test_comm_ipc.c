/* comm/ipc.c, field by field (docs/security.md, "CUDA IPC handles of psshim's memory"): the
 * service answers a peer whose uid is this process's, whatever its gid, and reads nothing
 * from one whose uid differs though its gid equals this user's uid; the asking end takes an
 * answer from a socket held by the handle's pid under this uid, whatever its gid, and from
 * none held by that pid under another uid. Root runs each peer under another uid or gid
 * (nobody's) with the other field left at root's 0, which equals root's uid; without root
 * the cases are skipped, saying so. */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "comm/shm_group.h" /* psg_now */
#include "comm/sock.h"
#include "core/core.h"
#include "rank_procs.h"

#define NOBODY 65534
#define ANSWER_MARK 0x5a

struct scratch {
  _Atomic uint64_t token;  /* a serving child's */
  _Atomic int32_t pid;     /* its pid */
  _Atomic int answered;    /* answers this process's service gave */
};
static struct scratch *scratch;
static _Atomic int answers; /* in the serving process */

static int answer(const unsigned char question[PSC_IPC_QUESTION], unsigned char out[PSC_IPC_ANSWER], int **fds) {
  memset(out, ANSWER_MARK, PSC_IPC_ANSWER);
  out[0] = question[0];
  *fds = NULL;
  atomic_fetch_add(&answers, 1);
  return 0;
}

static bool root_or_skip(void) {
  if (geteuid() == 0) return true;
  print_message("[  SKIP    ] needs root, to run a peer under another uid or gid (%d)\n", NOBODY);
  return false;
}

/* One field set to nobody's, the other left at root's 0; the process ends with its parent. */
static bool become(bool other_uid) {
  pid_t parent = getppid();
  bool ok = other_uid ? setresuid(NOBODY, NOBODY, NOBODY) == 0
                      : setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0;
  return ok && prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent;
}

/* Runs fn in a child; its exit status (128 + signal when killed). */
static int in_child(int (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(fn(arg));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool ask(int32_t pid, uint64_t token) {
  unsigned char q[PSC_IPC_QUESTION] = {7}, a[PSC_IPC_ANSWER] = {0};
  int *fds = NULL;
  int n = psc_ipc_ask(pid, token, q, a, &fds);
  free(fds);
  return n == 0 && a[0] == 7 && a[1] == ANSWER_MARK;
}

static int setup(void **state) {
  (void)state;
  memset(scratch, 0, sizeof *scratch);
  setenv("PSSHIM_COMM_TIMEOUT_S", "5", 1);
  return ps_options_parse(NULL, 0) ? 0 : -1;
}

/* ---- the service's check ---- */

struct asker {
  bool other_uid;
  uint64_t token;
};

/* Under another uid the asker is a stranger's plain client (psshim's own asking end would
 * refuse root's service first): it sends a question and waits a second for any answer. */
static bool ask_raw(int32_t pid, uint64_t token) {
  struct sockaddr_un a;
  socklen_t len;
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0 || !psc_sock_abstract(&a, &len, "psshim-ipc-%d-%016llx", (int)pid, (unsigned long long)token) ||
      connect(c, (struct sockaddr *)&a, len) != 0)
    return false;
  unsigned char q[PSC_IPC_QUESTION] = {7}, got[8];
  bool answered = send(c, q, sizeof q, MSG_NOSIGNAL) == (ssize_t)sizeof q &&
                  psc_sock_ready(c, POLLIN, psg_now() + 1) && recv(c, got, sizeof got, 0) > 0;
  close(c);
  return answered;
}

static int ask_as(void *arg) {
  struct asker *a = arg;
  if (!become(a->other_uid)) return 2;
  bool answered = a->other_uid ? ask_raw(getppid(), a->token) : ask(getppid(), a->token);
  return answered ? 0 : 1;
}

static void service_answers_gid_not_uid(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  uint64_t token = psc_ipc_serve(answer);
  assert_true(token != 0);
  int before = atomic_load(&answers);
  /* this user's uid, another gid: answered */
  assert_int_equal(in_child(ask_as, &(struct asker){false, token}), 0);
  assert_int_equal(atomic_load(&answers), before + 1);
  /* another uid, gid 0 (this user's uid): nothing read, nothing answered */
  assert_int_equal(in_child(ask_as, &(struct asker){true, token}), 1);
  assert_int_equal(atomic_load(&answers), before + 1);
}

/* ---- the asking end's check ---- */

/* Serves under one field changed; publishes its pid and token; lives until killed. */
static int serve_as(void *arg) {
  bool other_uid = *(bool *)arg;
  if (!become(other_uid)) return 2;
  uint64_t t = psc_ipc_serve(answer);
  if (!t) return 3;
  atomic_store(&scratch->pid, getpid());
  atomic_store(&scratch->token, t);
  pause();
  return 0;
}

/* Another uid cannot be served by psshim's own service to root here (its own check would
 * refuse root as a stranger), so a process of another uid holds the name and answers
 * anyone: what a stranger who bound the name would do. */
static int squat_as_other_uid(void *arg) {
  (void)arg;
  if (!become(true)) return 2;
  uint64_t t = 0x1234abcd5678ef01ull;
  struct sockaddr_un a;
  socklen_t len;
  int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0 || !psc_sock_abstract(&a, &len, "psshim-ipc-%d-%016llx", (int)getpid(), (unsigned long long)t) ||
      bind(l, (struct sockaddr *)&a, len) != 0 || listen(l, 4) != 0)
    return 3;
  atomic_store(&scratch->pid, getpid());
  atomic_store(&scratch->token, t);
  for (;;) {
    int c = accept(l, NULL, NULL);
    if (c < 0) continue;
    unsigned char q[PSC_IPC_QUESTION];
    struct { uint32_t ok, nfds; unsigned char answer[PSC_IPC_ANSWER]; } h = {1, 0, {0}};
    if (recv(c, q, sizeof q, MSG_WAITALL) == (ssize_t)sizeof q) {
      memset(h.answer, ANSWER_MARK, sizeof h.answer);
      h.answer[0] = q[0];
      send(c, &h, sizeof h, MSG_NOSIGNAL);
    }
    close(c);
  }
}

static pid_t start_peer(int (*fn)(void *), void *arg) {
  atomic_store(&scratch->token, 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(fn(arg));
  for (int i = 0; i < 5000 && !atomic_load(&scratch->token); i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
  assert_true(atomic_load(&scratch->token) != 0);
  return pid;
}

static void stop_peer(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void asker_trusts_uid_not_gid(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  /* this uid, another gid: its answer is taken */
  bool other_uid = false;
  pid_t p = start_peer(serve_as, &other_uid);
  assert_true(ask(atomic_load(&scratch->pid), atomic_load(&scratch->token)));
  stop_peer(p);
  /* the handle's pid itself, under another uid with gid 0: no answer taken */
  p = start_peer(squat_as_other_uid, NULL);
  assert_false(ask(atomic_load(&scratch->pid), atomic_load(&scratch->token)));
  stop_peer(p);
}

int main(void) {
  scratch = shared_scratch(sizeof *scratch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(service_answers_gid_not_uid, setup),
      cmocka_unit_test_setup(asker_trusts_uid_not_gid, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
