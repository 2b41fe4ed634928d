#include "comm/sock.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/shm_group.h"

bool psc_sock_ready(int fd, short events, double until) {
  for (;;) {
    double left = until - psg_now();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return false;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool psc_sock_transfer(int fd, void *buf, size_t len, bool send, int *fds, int *nfds, double until) {
  char ctl[CMSG_SPACE(sizeof(int) * PSC_SOCK_MAX_FDS)];
  size_t done = 0;
  if (nfds && (*nfds < 0 || *nfds > PSC_SOCK_MAX_FDS)) {
    errno = EINVAL;
    return false;
  }
  while (done < len) {
    if (!psc_sock_ready(fd, send ? POLLOUT : POLLIN, until)) return false;
    struct iovec iov = {(char *)buf + done, len - done};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    bool first = done == 0 && nfds && (send ? *nfds > 0 : true);
    if (first) {
      memset(ctl, 0, sizeof ctl);
      m.msg_control = ctl;
      m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)*nfds);
      if (send) {
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)*nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)*nfds);
      }
    }
    ssize_t n = send ? sendmsg(fd, &m, MSG_NOSIGNAL) : recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      if (n == 0) errno = 0; /* the peer closed: it died or gave up */
      return false;
    }
    if (first && !send) {
      int got = 0, room = *nfds;
      for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
          for (int i = 0; i < k; i++) {
            int d;
            memcpy(&d, CMSG_DATA(c) + sizeof(int) * (size_t)i, sizeof d);
            if (got < room) fds[got++] = d;
            else close(d); /* more than asked for: not the caller's to hold */
          }
        }
      *nfds = got;
    }
    done += (size_t)n;
  }
  return true;
}

bool psc_sock_peer(int fd, struct ucred *who) {
  socklen_t len = sizeof *who;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, who, &len) == 0 && len == sizeof *who;
}

bool psc_sock_abstract(struct sockaddr_un *a, socklen_t *len, const char *fmt, ...) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(a->sun_path + 1, sizeof a->sun_path - 1, fmt, ap);
  va_end(ap);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  return n > 0 && (size_t)n < sizeof a->sun_path - 1;
}
