/* comm/ internals: bounded transfers over a connected unix socket, file descriptors riding
 * along (SCM_RIGHTS), and who is at the other end. The node's socket star (star.c) and the
 * legacy CUDA IPC service (ipc.c) both speak through these. */
#ifndef PSSHIM_COMM_SOCK_H
#define PSSHIM_COMM_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#define PSC_SOCK_MAX_FDS 64 /* descriptors one transfer carries at most */

/* Waits for fd to be ready for `events` (poll's) until `until` (psg_now's clock); false
 * with errno ETIMEDOUT past it. */
bool psc_sock_ready(int fd, short events, double until);
/* Sends or receives all len bytes by `until`; the first piece may carry descriptors
 * (fds/nfds: out for a send, at most PSC_SOCK_MAX_FDS; in for a receive, *nfds = room, at
 * most PSC_SOCK_MAX_FDS, then how many came, close-on-exec). False with errno 0 when the
 * peer closed. */
bool psc_sock_transfer(int fd, void *buf, size_t len, bool send, int *fds, int *nfds, double until);
/* Who is at the other end of a connected unix socket, as the kernel saw it at connect() or
 * listen(): no message of theirs is needed, so a stranger cannot stall the asking end. */
bool psc_sock_peer(int fd, struct ucred *who);
/* An abstract socket address (leading NUL: nothing on disk to remove when its owner dies)
 * named by printf's fmt; false when the name does not fit. */
bool psc_sock_abstract(struct sockaddr_un *a, socklen_t *len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
