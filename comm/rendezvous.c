/* The node segment: rank 0 creates it under a name hashed from the job key, the other
 * ranks open it and claim their slots. The name stays while the job runs, so a process that
 * inherited a rank's environment (a spawned helper) finds its slot taken at once instead of
 * waiting out the timeout; the last rank out removes it. A segment left by a crashed run
 * (its creator gone) is replaced by the next rank 0 and ignored by the others, and rank 0
 * removes this user's segments whose processes are all gone.
 *
 * Only a regular file of this user that no other user may open is a segment: anyone can make
 * a file in /dev/shm, and a name derived from the job can be guessed. A name held by anything
 * else is passed over (rank 0 takes the next of PSC_SEGMENT_NAMES, the others look at each),
 * so a squatter can neither enter the group nor stop it from meeting. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/node.h"

/* How long a segment may sit half-made before it is taken for a creator that died. */
#define PSC_HALF_MADE_S 1.0

void psc_segment_name(const char *job_key, int k, char name[48]) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a: names must be short, keys may be long */
  for (const char *p = job_key; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  if (k == 0)
    snprintf(name, 48, "/psshim-%016llx", (unsigned long long)h);
  else
    snprintf(name, 48, "/psshim-%016llx-%d", (unsigned long long)h, k);
}

/* A file this job may use as its segment. */
static bool ours(const struct stat *st) {
  return S_ISREG(st->st_mode) && st->st_uid == geteuid() && (st->st_mode & 077) == 0;
}

static struct psc_node *map_fd(int fd) {
  void *p = mmap(NULL, sizeof(struct psc_node), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

static void unmap(struct psc_node *node) { munmap(node, sizeof *node); }

/* Opens an existing segment once it is whole: NULL if absent, too small or not yet marked
 * ready within `patience` seconds. *foreign is set when it was made by another layout;
 * *taken when the name exists but is not ours (nothing is mapped then). */
static struct psc_node *open_existing(const char *name, double patience, uint64_t *foreign, bool *taken) {
  double until = psg_now() + patience;
  unsigned round = 0;
  for (;;) {
    /* Non-blocking: a FIFO planted under the name must not hold the open. */
    int fd = shm_open(name, O_RDWR | O_NONBLOCK, 0600);
    if (fd < 0) {
      *taken = errno != ENOENT; /* another user's, a directory, a link: it is there, not ours */
      return NULL;
    }
    struct stat st;
    bool known = fstat(fd, &st) == 0;
    if (known && !ours(&st)) {
      close(fd);
      *taken = true;
      return NULL;
    }
    if (known && st.st_size >= (off_t)sizeof(struct psc_node)) {
      struct psc_node *node = map_fd(fd);
      if (!node) return NULL;
      uint64_t magic = atomic_load_explicit(&node->magic, memory_order_acquire);
      if (magic == PSC_NODE_MAGIC) return node;
      if (magic != 0) {
        *foreign = magic;
        unmap(node);
        return NULL;
      }
      unmap(node);
    } else {
      close(fd);
    }
    if (psg_now() >= until) return NULL;
    psg_backoff(&round);
  }
}

static bool foreign_layout(uint64_t magic) {
  psc_errorf("the node segment was made by a different psshim build (layout %llu, this one %u): "
             "every rank must preload the same libpsshim.so",
             (unsigned long long)(magic & 0xff), PSC_NODE_LAYOUT);
  return false;
}

static void init_node(struct psc_node *node, const struct psc_ranks *r) {
  node->creator = psc_proc_self();
  node->nranks = r->local_world_size;
  /* Where the kernel has no randomness yet (early boot), the clock: guessable, so a squatter
   * could hold the star's name; the credentials then find it out and sharing stops. */
  if (getrandom(&node->star_salt, sizeof node->star_salt, GRND_NONBLOCK) != sizeof node->star_salt)
    node->star_salt = (uint64_t)(psg_now() * 1e9) ^ ((uint64_t)getpid() << 32);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&node->host_lock, &a);
  pthread_mutexattr_destroy(&a);
  psg_init(&node->group, r->local_world_size);
  atomic_store_explicit(&node->magic, PSC_NODE_MAGIC, memory_order_release);
}

/* True when no process that made or joined the segment lives on. */
static bool abandoned(struct psc_node *node) {
  if (psc_proc_alive(node->creator.pid, node->creator.start)) return false;
  for (int i = 0; i < node->group.n && i < PSG_MAX_MEMBERS; i++) {
    struct psg_member *m = &node->group.m[i];
    int32_t pid = atomic_load(&m->pid);
    if (pid && psc_proc_alive(pid, atomic_load(&m->start))) return false;
  }
  return true;
}

/* Runs that crashed leave their segment behind (nobody was left to remove it); rank 0 of a
 * new run removes this user's that are abandoned, so they do not pile up in /dev/shm. */
static void sweep_abandoned(void) {
  DIR *dir = opendir("/dev/shm");
  if (!dir) return;
  struct dirent *e;
  while ((e = readdir(dir))) {
    if (strncmp(e->d_name, "psshim-", 7) != 0) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    int fd = shm_open(name, O_RDONLY | O_NONBLOCK, 0); /* a planted FIFO would block */
    if (fd < 0) continue;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && ours(&st) && st.st_size == sizeof(struct psc_node))
      p = mmap(NULL, sizeof(struct psc_node), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) continue;
    struct psc_node *node = p;
    if (atomic_load(&node->magic) == PSC_NODE_MAGIC && abandoned(node))
      shm_unlink(name);
    munmap(p, sizeof(struct psc_node));
  }
  closedir(dir);
}

/* Rank 0, at one name: a fresh segment, replacing a stale one of ours; refuses if a live
 * rank 0 holds it. NULL with *taken, and no line, when the name is not ours. */
static struct psc_node *create_at(const char *name, const struct psc_ranks *r, bool *taken) {
  for (int attempt = 0; attempt < 3; attempt++) {
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, sizeof(struct psc_node)) != 0) {
        psc_errorf("cannot size the node segment %s: %s", name, strerror(errno));
        close(fd);
        shm_unlink(name);
        return NULL;
      }
      struct psc_node *node = map_fd(fd);
      if (!node) {
        psc_errorf("cannot map the node segment %s: %s", name, strerror(errno));
        shm_unlink(name);
        return NULL;
      }
      init_node(node, r);
      return node;
    }
    if (errno != EEXIST) {
      psc_errorf("cannot create the node segment %s: %s", name, strerror(errno));
      return NULL;
    }
    uint64_t foreign = 0;
    struct psc_node *old = open_existing(name, PSC_HALF_MADE_S, &foreign, taken);
    if (*taken) return NULL;
    if (old && psc_proc_alive(old->creator.pid, old->creator.start)) {
      psc_errorf("LOCAL_RANK=0 of this job is already pid %d (segment %s): is this process a "
                 "helper that inherited a rank's environment?", (int)old->creator.pid, name);
      unmap(old);
      return NULL;
    }
    if (old) unmap(old);
    shm_unlink(name); /* stale: its rank 0 is gone */
  }
  psc_errorf("cannot create the node segment %s: another process keeps recreating it", name);
  return NULL;
}

static void all_taken(const char *first) {
  psc_errorf("the node segment's names (%s and %d more) are all taken by files this job may not use "
             "(other users', or open to others): this rank runs without the node's other ranks", first,
             PSC_SEGMENT_NAMES - 1);
}

/* Rank 0: the first name not taken; *name is set to it. */
static struct psc_node *create(const struct psc_ranks *r, char name[48]) {
  sweep_abandoned();
  char first[48];
  psc_segment_name(r->job_key, 0, first);
  for (int k = 0; k < PSC_SEGMENT_NAMES; k++) {
    bool taken = false;
    psc_segment_name(r->job_key, k, name);
    struct psc_node *node = create_at(name, r, &taken);
    if (taken) continue;
    if (node && k > 0)
      psc_errorf("the node segment's name %s is taken by a file this job may not use (another user's, or "
                 "open to others): this job's ranks meet at %s instead", first, name);
    return node;
  }
  all_taken(first);
  return NULL;
}

/* Other ranks: wait for rank 0's live segment, at the first name that holds one; *name is
 * set to it. When every name is taken, rank 0 can make none: fail at once. */
static struct psc_node *attach(const struct psc_ranks *r, char name[48]) {
  double until = psg_now() + r->timeout_s;
  unsigned round = 0;
  char first[48];
  psc_segment_name(r->job_key, 0, first);
  for (;;) {
    int taken = 0;
    for (int k = 0; k < PSC_SEGMENT_NAMES; k++) {
      uint64_t foreign = 0;
      bool not_ours = false;
      psc_segment_name(r->job_key, k, name);
      struct psc_node *node = open_existing(name, 0, &foreign, &not_ours);
      if (foreign) {
        foreign_layout(foreign);
        return NULL;
      }
      taken += not_ours;
      if (node) {
        if (psc_proc_alive(node->creator.pid, node->creator.start)) return node;
        unmap(node); /* a crashed run's: rank 0 will replace it */
      }
    }
    if (taken == PSC_SEGMENT_NAMES) {
      all_taken(first);
      return NULL;
    }
    if (psg_now() >= until) {
      psc_errorf("rank 0 did not open psshim's node group (segment %s) within %gs "
                 "(PSSHIM_COMM_TIMEOUT_S)", first, r->timeout_s);
      return NULL;
    }
    psg_backoff(&round);
  }
}

bool psc_rendezvous_open(const struct psc_ranks *r) {
  char name[48];
  struct psc_node *node = r->local_rank == 0 ? create(r, name) : attach(r, name);
  if (!node) return false;
  if (node->nranks != r->local_world_size) {
    psc_errorf("rank %d has LOCAL_WORLD_SIZE=%d but rank 0 has %d", r->local_rank,
               r->local_world_size, node->nranks);
    unmap(node);
    return false;
  }
  int32_t holder;
  bool holder_alive;
  if (!psg_claim(&node->group, r->local_rank, &holder, &holder_alive)) {
    if (holder_alive)
      psc_errorf("LOCAL_RANK=%d of this job is already pid %d: is this process a helper that "
                 "inherited a rank's environment?", r->local_rank, (int)holder);
    else
      psc_errorf("LOCAL_RANK=%d of this job was pid %d, which died: psshim's node group cannot "
                 "be rejoined", r->local_rank, (int)holder);
    unmap(node);
    return false;
  }
  psc_state.node = node;
  psc_state.joined_pid = (int32_t)getpid();
  memcpy(psc_state.shm_name, name, sizeof name);
  return true;
}

void psc_rendezvous_close(void) {
  struct psc_node *node = psc_state.node;
  if (!node) return;
  /* A forked child (a data-loader worker, say) leaving must not take the rank's slot along. */
  if (getpid() == psc_state.joined_pid && psg_leave(&node->group, psc_state.ranks.local_rank))
    shm_unlink(psc_state.shm_name);
  unmap(node);
  psc_state.node = NULL;
}
