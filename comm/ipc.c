/* The transport of legacy CUDA IPC of psshim's memory: a process that exported a handle
 * answers the processes that open it, over an abstract unix socket named from its pid and
 * a random token that the handle carries, with the frames' file descriptors (SCM_RIGHTS).
 *
 * Only this user's processes get in (README.md, Security): the service reads nothing from
 * a connection whose peer (SO_PEERCRED) has another uid, and the asking end checks that
 * the socket is held by the pid the handle names, of this uid, before it reads an answer:
 * a stranger who bound the name of a process that has ended hands out nothing.
 *
 * The service is a thread of its own, started at the first export, answering one
 * connection at a time. A forked child has no such thread: its state starts anew (and the
 * listening socket is closed there, so the name does not outlive the exporter in a child
 * that never accepts). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/node.h"
#include "comm/sock.h"
#include "core/core.h"

#define MAX_FDS (1 << 20) /* an answer's descriptors at most: a 2 TiB allocation of 2 MiB chunks */
#define NAME_TRIES 4      /* tokens tried when another process holds the name */

/* What precedes the answer's descriptors, which follow in batches of PSC_SOCK_MAX_FDS,
 * each carried by its count. */
struct header {
  uint32_t ok;
  uint32_t nfds;
  unsigned char answer[PSC_IPC_ANSWER];
};

static ps_mutex lock = PS_MUTEX_INITIALIZER(PS_RANK_COMM_IPC, "the IPC descriptor lock");
static uint64_t token;     /* 0: not serving */
static int listener = -1;
static psc_ipc_answer_fn answer_fn;
static bool stranger_said;

static void atfork_prepare(void) { ps_mutex_lock(&lock); }
static void atfork_parent(void) { ps_mutex_unlock(&lock); }
static void atfork_child(void) {
  if (listener >= 0) close(listener);
  listener = -1;
  token = 0;
  ps_mutex_unlock(&lock);
}
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

static bool address(int32_t pid, uint64_t tok, struct sockaddr_un *a, socklen_t *len) {
  return psc_sock_abstract(a, len, "psshim-ipc-%d-%016llx", (int)pid, (unsigned long long)tok);
}

static double deadline(void) { return psg_now() + ps_options.comm_timeout_s; }

/* The header, then the descriptors in batches. */
static bool send_answer(int c, const struct header *h, const int *fds, double until) {
  if (!psc_sock_transfer(c, (void *)h, sizeof *h, true, NULL, NULL, until)) return false;
  for (uint32_t at = 0; at < h->nfds;) {
    int n = (int)(h->nfds - at < PSC_SOCK_MAX_FDS ? h->nfds - at : PSC_SOCK_MAX_FDS);
    uint32_t count = (uint32_t)n;
    if (!psc_sock_transfer(c, &count, sizeof count, true, (int *)fds + at, &n, until)) return false;
    at += count;
  }
  return true;
}

static void serve_one(int c) {
  struct ucred who;
  if (!psc_sock_peer(c, &who) || who.uid != geteuid()) {
    if (!stranger_said)
      psc_errorf("refused a CUDA IPC connection from pid %d (uid %u): psshim serves its memory to this "
                 "user's processes only", (int)who.pid, (unsigned)who.uid);
    stranger_said = true;
    return;
  }
  double until = deadline();
  unsigned char question[PSC_IPC_QUESTION];
  if (!psc_sock_transfer(c, question, sizeof question, false, NULL, NULL, until)) return;
  struct header h = {0};
  int *fds = NULL;
  int n = answer_fn(question, h.answer, &fds);
  h.ok = n >= 0;
  h.nfds = n > 0 ? (uint32_t)n : 0;
  send_answer(c, &h, fds, until); /* a failure is the asker's to report */
  for (int i = 0; i < n; i++) close(fds[i]);
  free(fds);
}

static void *serve_main(void *arg) {
  int l = (int)(intptr_t)arg;
  for (;;) {
    int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return NULL; /* the socket is gone (a forked child's copy closed): nothing more to serve */
    }
    serve_one(c);
    close(c);
  }
}

/* Binds a fresh token's name and starts the thread; called under `lock`. */
static bool start(void) {
  for (int k = 0; k < NAME_TRIES; k++) {
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, GRND_NONBLOCK) != sizeof t) t = (uint64_t)(psg_now() * 1e9) ^ ((uint64_t)k << 56);
    if (!t) continue;
    struct sockaddr_un a;
    socklen_t len;
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || !address(getpid(), t, &a, &len)) {
      if (l >= 0) close(l);
      break;
    }
    if (bind(l, (struct sockaddr *)&a, len) != 0 || listen(l, 16) != 0) {
      int e = errno;
      close(l);
      if (e == EADDRINUSE) continue; /* someone took the name first: another token */
      errno = e;
      break;
    }
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&th, &attr, serve_main, (void *)(intptr_t)l);
    pthread_attr_destroy(&attr);
    if (e) {
      close(l);
      errno = e;
      break;
    }
    listener = l;
    token = t;
    return true;
  }
  psc_errorf("cannot serve CUDA IPC handles (%s): the handle is not made", errno ? strerror(errno) : "no free name");
  return false;
}

uint64_t psc_ipc_serve(psc_ipc_answer_fn answer) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_atfork);
  ps_mutex_lock(&lock);
  if (!token) answer_fn = answer; /* before the thread starts; it never changes while it runs */
  uint64_t t = token || start() ? token : 0;
  ps_mutex_unlock(&lock);
  return t;
}

/* A connection to pid's service, held by pid itself under this uid; -1 after one line. */
static int connect_to(int32_t pid, uint64_t tok, double until) {
  struct sockaddr_un a;
  socklen_t len;
  unsigned round = 0;
  if (!address(pid, tok, &a, &len)) return -1;
  for (;;) {
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) break;
    if (connect(c, (const struct sockaddr *)&a, len) == 0) {
      struct ucred who;
      if (psc_sock_peer(c, &who) && who.pid == pid && who.uid == geteuid()) return c;
      close(c);
      psc_errorf("a CUDA IPC handle of process %d: its socket is held by pid %d (uid %u) instead; not opened",
                 (int)pid, (int)who.pid, (unsigned)who.uid);
      return -1;
    }
    int e = errno;
    close(c);
    if (e != EAGAIN || psg_now() >= until) { /* EAGAIN: the backlog is full, the service busy */
      psc_errorf("a CUDA IPC handle of process %d cannot be opened: that process %s (%s)", (int)pid,
                 e == ECONNREFUSED ? "has ended or serves no handles" : "does not answer", strerror(e));
      return -1;
    }
    psg_backoff(&round);
  }
  psc_errorf("a CUDA IPC handle of process %d cannot be opened: %s", (int)pid, strerror(errno));
  return -1;
}

static bool receive_answer(int c, struct header *h, int **fds, double until) {
  if (!psc_sock_transfer(c, h, sizeof *h, false, NULL, NULL, until)) return false;
  if (!h->ok || !h->nfds) return true;
  if (h->nfds > MAX_FDS || !(*fds = malloc(sizeof **fds * h->nfds))) {
    errno = EPROTO;
    return false;
  }
  for (uint32_t at = 0; at < h->nfds;) {
    uint32_t count = 0;
    int n = PSC_SOCK_MAX_FDS;
    bool ok = psc_sock_transfer(c, &count, sizeof count, false, *fds + at, &n, until);
    if (ok && ((uint32_t)n != count || count == 0 || count > h->nfds - at)) {
      errno = EPROTO;
      ok = false;
    }
    if (!ok) {
      for (int i = 0; i < n; i++) close((*fds)[at + (uint32_t)i]);
      for (uint32_t i = 0; i < at; i++) close((*fds)[i]);
      free(*fds);
      *fds = NULL;
      return false;
    }
    at += count;
  }
  return true;
}

int psc_ipc_ask(int32_t pid, uint64_t tok, const unsigned char question[PSC_IPC_QUESTION],
                unsigned char answer[PSC_IPC_ANSWER], int **fds) {
  *fds = NULL;
  double until = deadline();
  int c = connect_to(pid, tok, until);
  if (c < 0) return -1;
  struct header h;
  bool ok = psc_sock_transfer(c, (void *)question, PSC_IPC_QUESTION, true, NULL, NULL, until) &&
            receive_answer(c, &h, fds, until);
  close(c);
  if (!ok) {
    psc_errorf("a CUDA IPC handle of process %d cannot be opened: the exchange failed (%s)", (int)pid,
               errno ? strerror(errno) : "the process closed the connection");
    return -1;
  }
  if (!h.ok) {
    psc_errorf("process %d refused a CUDA IPC handle: it exports no such memory now (freed since?)", (int)pid);
    return -1;
  }
  memcpy(answer, h.answer, PSC_IPC_ANSWER);
  return (int)h.nfds;
}
