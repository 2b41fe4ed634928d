/* The node's socket star, for sharding: rank 0 listens on an abstract unix socket named
 * from the node segment's name and relays; every other rank holds one connection to it.
 * File descriptors of exported frames can only travel over a unix socket (SCM_RIGHTS), and
 * the chunk checksums ride along, so sharding needs neither NCCL nor device buffers.
 * A star cannot deadlock on full socket buffers: rank 0 reads every rank's message before
 * it writes any answer. Every wait is bounded by PSSHIM_COMM_TIMEOUT_S; a dead peer's
 * socket closes, which ends a wait at once. After a failure the star is closed for good,
 * so the peers' next exchange fails at once too.
 *
 * Only the job's ranks get in. An abstract socket has no permissions: any process of the
 * node may connect to it or bind its name first. So its name carries a random salt from the
 * node segment (which only this user can read), and each end checks the other's kernel
 * credentials (SO_PEERCRED) before anything crosses: this user's uid, and the pid the segment
 * lists for that rank. Rank 0 refuses a stranger's connection and goes on with the ranks; a
 * rank that finds a stranger holding the name says so and runs unshared. Received frames
 * must be like this rank's own (kind of file and size) before the caller may map them. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/node.h"
#include "comm/sock.h"

#define NO_SOCKET (-1)

static int me(void) { return psc_state.ranks.local_rank; }
static int nranks(void) { return psc_state.node->nranks; }

static void star_fail(const char *during, int peer) {
  if (!psc_state.star_down)
    psc_errorf("the ranks' socket star failed during %s (rank %d: %s): chunks are no longer shared "
               "from now on", during, peer, errno ? strerror(errno) : "closed");
  psc_star_close();
}

bool psc_star_address(struct sockaddr_un *a, socklen_t *len) {
  return psc_sock_abstract(a, len, "%s-star-%016llx", psc_state.shm_name,
                           (unsigned long long)psc_state.node->star_salt);
}

/* True if `who` is rank r: this user, and the live process the segment lists for r. */
static bool is_rank(const struct ucred *who, int r) {
  struct psg_member *m = &psc_state.node->group.m[r];
  return who->uid == geteuid() && who->pid == atomic_load(&m->pid) &&
         psc_proc_alive(who->pid, atomic_load(&m->start));
}

static double deadline(void) { return psg_now() + psc_state.ranks.timeout_s; }

/* Sends or receives all len bytes by the timeout; the first piece may carry descriptors
 * (psc_sock_transfer). */
static bool transfer(int fd, void *buf, size_t len, bool send, int *fds, int *nfds) {
  return psc_sock_transfer(fd, buf, len, send, fds, nfds, deadline());
}

static bool put(int fd, const void *buf, size_t len) { return transfer(fd, (void *)buf, len, true, NULL, NULL); }
static bool get(int fd, void *buf, size_t len) { return transfer(fd, buf, len, false, NULL, NULL); }

/* The rank whose process is at the other end, or -1 (a stranger: named in one line, the
 * first time, *said). */
static int rank_at(int c, bool *said) {
  struct ucred who;
  if (!psc_sock_peer(c, &who)) return -1;
  for (int r = 1; r < nranks(); r++)
    if (is_rank(&who, r)) return r;
  if (!*said)
    psc_errorf("refused a connection to the ranks' socket star from pid %d (uid %u), which is not "
               "one of this job's ranks", (int)who.pid, (unsigned)who.uid);
  *said = true;
  return -1;
}

/* Until every other rank is connected; a stranger is refused before a byte is read. */
static bool accept_peers(int listener) {
  double until = deadline();
  bool said = false;
  for (int joined = 1; joined < nranks();) {
    if (!psc_sock_ready(listener, POLLIN, until)) return false;
    int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return false;
    }
    int r = rank_at(c, &said);
    if (r < 0 || psc_state.star[r] != NO_SOCKET) {
      close(c);
      continue;
    }
    psc_state.star[r] = c;
    joined++;
  }
  return true;
}

/* The name is bound already: by a stranger who learned it, since only rank 0 binds it. */
static void name_taken(const struct sockaddr_un *a, socklen_t len) {
  struct ucred who;
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool known = c >= 0 && connect(c, (const struct sockaddr *)a, len) == 0 && psc_sock_peer(c, &who);
  if (c >= 0) close(c);
  if (known)
    psc_errorf("the ranks' socket star cannot open: its name is held by pid %d (uid %u), which is "
               "not one of this job's ranks; chunks are not shared", (int)who.pid, (unsigned)who.uid);
  else
    psc_errorf("the ranks' socket star cannot open: its name is held by another process; chunks "
               "are not shared");
  psc_star_close();
}

/* Rank 0 may not be listening yet: retried until the timeout, or until rank 0 says it gave
 * up. Non-blocking, so a listener whose backlog a stranger filled cannot hold connect(). */
static bool connect_hub(const struct sockaddr_un *a, socklen_t len) {
  double until = deadline();
  unsigned round = 0;
  for (;;) {
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return false;
    if (connect(c, (const struct sockaddr *)a, len) == 0) {
      struct ucred who;
      bool known = psc_sock_peer(c, &who);
      if (known && is_rank(&who, 0)) {
        psc_state.star[0] = c;
        return true;
      }
      close(c);
      if (!known) return false;
      psc_errorf("the ranks' socket star is held by pid %d (uid %u), which is not this job's rank 0: "
                 "chunks are not shared", (int)who.pid, (unsigned)who.uid);
      psc_star_close();
      return false;
    }
    close(c);
    if (atomic_load(&psc_state.node->star_refused)) {
      psc_errorf("rank 0 could not open the ranks' socket star (its own line says why): chunks are "
                 "not shared");
      psc_star_close();
      return false;
    }
    if (psg_now() >= until) {
      errno = ETIMEDOUT;
      return false;
    }
    psg_backoff(&round);
  }
}

static bool star_up(void) {
  if (psc_state.star_up) return true;
  if (psc_state.star_down || !psc_state.node) return false;
  for (int i = 0; i < PSG_MAX_MEMBERS; i++) psc_state.star[i] = NO_SOCKET;
  psc_state.star_up = true; /* so that psc_star_close closes what was opened */
  struct sockaddr_un a;
  socklen_t len;
  bool ok = psc_star_address(&a, &len);
  if (ok && me() == 0) {
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    bool bound = l >= 0 && bind(l, (struct sockaddr *)&a, len) == 0;
    if (l >= 0 && !bound && errno == EADDRINUSE) name_taken(&a, len);
    ok = bound && listen(l, PSG_MAX_MEMBERS) == 0 && accept_peers(l);
    if (l >= 0) close(l);
    if (!ok) atomic_store(&psc_state.node->star_refused, 1); /* the others stop waiting */
  } else if (ok) {
    ok = connect_hub(&a, len);
  }
  if (!ok) star_fail("its set-up", me() == 0 ? -1 : 0);
  return ok;
}

void psc_star_close(void) {
  if (psc_state.star_up)
    for (int i = 0; i < PSG_MAX_MEMBERS; i++)
      if (psc_state.star[i] != NO_SOCKET) {
        close(psc_state.star[i]);
        psc_state.star[i] = NO_SOCKET;
      }
  psc_state.star_up = false;
  psc_state.star_down = true;
}

bool psc_agree_checksums(const uint64_t *sums, size_t count, bool *agree) {
  if (!star_up()) return false;
  uint64_t n = count;
  if (me() != 0) {
    if (!put(psc_state.star[0], &n, sizeof n) || !put(psc_state.star[0], sums, count * sizeof *sums) ||
        !get(psc_state.star[0], agree, count * sizeof *agree)) {
      star_fail("the checksum exchange", 0);
      return false;
    }
    return true;
  }
  for (size_t i = 0; i < count; i++) agree[i] = sums[i] != 0;
  uint64_t *theirs = malloc(count * sizeof *theirs + 1);
  bool ok = theirs != NULL;
  for (int k = 1; ok && k < nranks(); k++) {
    uint64_t m = 0;
    bool counted = get(psc_state.star[k], &m, sizeof m);
    ok = counted && m == count && get(psc_state.star[k], theirs, count * sizeof *theirs);
    if (!ok) {
      if (counted && m != count) errno = EPROTO;
      star_fail(counted && m != count ? "the checksum exchange (another count of chunks)" : "the checksum exchange", k);
      break;
    }
    for (size_t i = 0; i < count; i++) agree[i] = agree[i] && theirs[i] == sums[i];
  }
  free(theirs);
  for (int k = 1; ok && k < nranks(); k++)
    if (!put(psc_state.star[k], agree, count * sizeof *agree)) {
      star_fail("the checksum exchange", k);
      ok = false;
    }
  return ok;
}

/* One message: a flag per rank (whose fd follows), the fds in rank order. */
static bool relay_fds(int sock, int fds[], bool send) {
  unsigned char has[PSG_MAX_MEMBERS];
  int packed[PSG_MAX_MEMBERS], n = 0;
  if (send) {
    for (int r = 0; r < nranks(); r++)
      if ((has[r] = fds[r] >= 0)) packed[n++] = fds[r];
    return transfer(sock, has, (size_t)nranks(), true, packed, &n);
  }
  for (int r = 0; r < PSG_MAX_MEMBERS; r++) fds[r] = NO_SOCKET;
  n = PSG_MAX_MEMBERS;
  if (!transfer(sock, has, (size_t)nranks(), false, packed, &n)) return false;
  int k = 0;
  for (int r = 0; r < nranks(); r++) fds[r] = has[r] && k < n ? packed[k++] : NO_SOCKET;
  bool whole = k == n;
  for (; k < n; k++) close(packed[k]);
  return whole;
}

/* The first rank whose frame is not like `mine`: the same kind of file on the same device
 * (a memfd, the driver's device file) and of the same size (the agreed piece length, where
 * the kind has a size); -1 if none. Credentials keep strangers out; this keeps a peer's
 * mistake from being mapped as a piece. */
static int unlike_mine(int mine, const int fds[]) {
  struct stat ref, st;
  if (fstat(mine, &ref) != 0) return me();
  for (int r = 0; r < nranks(); r++)
    if (fds[r] >= 0 && (fstat(fds[r], &st) != 0 || (st.st_mode & S_IFMT) != (ref.st_mode & S_IFMT) ||
                        st.st_dev != ref.st_dev || st.st_rdev != ref.st_rdev || st.st_size != ref.st_size))
      return r;
  return -1;
}

static void close_all(int fds[]) {
  for (int r = 0; r < PSG_MAX_MEMBERS; r++) {
    if (fds[r] >= 0) close(fds[r]);
    fds[r] = NO_SOCKET;
  }
}

bool psc_share_fds(int mine, int fds[]) {
  for (int r = 0; r < PSG_MAX_MEMBERS; r++) fds[r] = NO_SOCKET;
  if (!star_up()) return false;
  bool ok = true;
  int peer = 0, bad = -1;
  if (me() != 0) {
    int one[PSG_MAX_MEMBERS];
    for (int r = 0; r < nranks(); r++) one[r] = r == me() ? mine : NO_SOCKET;
    ok = relay_fds(psc_state.star[0], one, true) && relay_fds(psc_state.star[0], fds, false);
    ok = ok && (mine < 0 || (bad = unlike_mine(mine, fds)) < 0);
  } else {
    fds[0] = mine >= 0 ? fcntl(mine, F_DUPFD_CLOEXEC, 0) : NO_SOCKET;
    for (int k = 1; ok && k < nranks(); k++) {
      int one[PSG_MAX_MEMBERS];
      ok = relay_fds(psc_state.star[k], one, false);
      peer = k;
      for (int r = 0; ok && r < nranks(); r++)
        if (r == k) fds[k] = one[r];
        else if (one[r] >= 0) close(one[r]);
    }
    ok = ok && (mine < 0 || (bad = unlike_mine(mine, fds)) < 0); /* before passing any on */
    for (int k = 1; ok && k < nranks(); k++) {
      ok = relay_fds(psc_state.star[k], fds, true);
      peer = k;
    }
  }
  if (ok && mine < 0) close_all(fds); /* it takes no part: nothing of the others' to map */
  if (ok) return true;
  if (bad >= 0) {
    psc_errorf("the frame rank %d shared is not like this rank's own (another kind of file, or not "
               "the agreed piece size): chunks are no longer shared from now on", bad);
    psc_star_close();
  }
  star_fail("the exchange of shared frames", peer);
  close_all(fds);
  return false;
}
