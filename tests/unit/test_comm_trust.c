/* comm/: only the job's own ranks get in. A process that is not a rank (of another uid, or of
 * this one) connecting to the socket star is refused, and the ranks' frames reach the ranks
 * alone; a process of another uid holding the star's name is found out by every rank and
 * none maps what it hands out; a frame of another size or kind than the rank's own is
 * refused by every rank; node segment names that another user holds, or that this user's
 * group or others may open, are passed over, and when all are held every rank runs alone at
 * once; this user's own stale segment is replaced. Another uid needs root (the tests switch
 * a forked child to nobody); without root those cases are skipped, saying so. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/node.h"
#include "core/core.h"
#include "rank_procs.h"

#define NRANKS 3
#define MIB (1ull << 20)
#define PIECE (16 * MIB) /* the agreed piece: a 48M chunk in 3 */
#define RANK_MARK 0x5eed
#define STRANGER_MARK 0xbad
#define NOBODY 65534
#define LIMIT_S 20 /* a run that waits for the comm timeout is killed: the test fails */

struct scratch {
  _Atomic int ready;     /* the stranger is in place */
  _Atomic int connected; /* it reached the star */
  _Atomic int got_bytes, got_fds; /* what reached it from the job */
  char squatted[PSC_SEGMENT_NAMES][48]; /* segment names the stranger made: the test removes them */
  char targets[PSC_SEGMENT_NAMES][56];  /* what planted links point at: removed too */
};
static struct scratch *scratch;

static int setup(void **state) {
  (void)state;
  memset(scratch, 0, sizeof *scratch);
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  return ps_options_parse(NULL, 0) ? 0 : -1;
}

static bool root_or_skip(void) {
  if (geteuid() == 0) return true;
  print_message("[  SKIP    ] needs root, to run a stranger under another uid (%d)\n", NOBODY);
  return false;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static bool wait_for(_Atomic int *flag) {
  for (int i = 0; i < 10000 && !atomic_load(flag); i++) nap_ms(1);
  return atomic_load(flag);
}

/* Switches to another uid; the process then ends with the rank that forked it, even one that
 * fails early (a change of uid clears the parent-death signal, so it is set after). */
static bool as_nobody(void) {
  pid_t parent = getppid();
  return setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0 &&
         setresuid(NOBODY, NOBODY, NOBODY) == 0 && prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 &&
         getppid() == parent;
}

static bool join(void) {
  struct psc_config cfg = {3 * PIECE, 0, 0, "auto"};
  return psc_node_join(&cfg, 0) == PSC_GROUP;
}

/* A frame of `bytes` holding {owner, mark}. */
static int frame(int owner, int mark, uint64_t bytes) {
  int fd = memfd_create("trust-test", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return -1;
  int v[2] = {owner, mark};
  return pwrite(fd, v, sizeof v, 0) == sizeof v ? fd : -1;
}

/* What fd's frame holds, or {-1, -1}. */
static void frame_holds(int fd, int v[2]) {
  v[0] = v[1] = -1;
  if (pread(fd, v, 2 * sizeof *v, 0) != 2 * (ssize_t)sizeof *v) v[0] = v[1] = -1;
}

/* Every rank's frame reached this rank and holds what that rank wrote: a run without a
 * stranger ends so. */
static int all_frames_right(const int got[]) {
  for (int r = 0; r < NRANKS; r++) {
    int v[2];
    if (got[r] < 0) return 13;
    frame_holds(got[r], v);
    close(got[r]);
    if (v[0] != r || v[1] != RANK_MARK) return 14;
  }
  return 0;
}

/* Reads what comes on c for up to secs, or until it closes: bytes and descriptors counted
 * into the scratch, descriptors closed. */
static void take_all(int c, double secs) {
  for (int waited = 0; waited < secs * 1000;) {
    struct pollfd p = {.fd = c, .events = POLLIN};
    if (poll(&p, 1, 50) == 0) {
      waited += 50;
      continue;
    }
    char buf[256], ctl[CMSG_SPACE(sizeof(int) * PSC_MAX_RANKS)];
    struct iovec iov = {buf, sizeof buf};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(c, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0) return;
    atomic_fetch_add(&scratch->got_bytes, (int)n);
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
      int k = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int)), fds[PSC_MAX_RANKS];
      memcpy(fds, CMSG_DATA(h), sizeof(int) * (size_t)k);
      for (int i = 0; i < k; i++) close(fds[i]);
      atomic_fetch_add(&scratch->got_fds, k);
    }
  }
}

/* ---- a stranger connects to the star ---- */

/* Forked by rank 0 after the join (so it can read the star's name before it drops to
 * another uid): connects before any rank and speaks as rank 1 would, offering no frame. */
static int connect_as_rank(bool other_uid) {
  struct sockaddr_un a;
  socklen_t len;
  if (!psc_star_address(&a, &len) || (other_uid && !as_nobody())) return 1;
  int c = -1;
  for (int i = 0; i < 10000 && c < 0; i++) {
    c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c >= 0 && connect(c, (struct sockaddr *)&a, len) != 0) {
      close(c);
      c = -1;
      nap_ms(1);
    }
  }
  if (c < 0) return 2;
  atomic_store(&scratch->connected, 1);
  int32_t rank = 1;
  unsigned char none[NRANKS] = {0};
  if (send(c, &rank, sizeof rank, MSG_NOSIGNAL) == sizeof rank) send(c, none, sizeof none, MSG_NOSIGNAL);
  take_all(c, 3);
  close(c);
  return 0;
}

static int ranks_beside_a_stranger(int rank, void *arg) {
  bool other_uid = *(bool *)arg;
  if (!join()) return 10;
  int mine = frame(rank, RANK_MARK, PIECE), got[PSC_MAX_RANKS];
  pid_t stranger = -1;
  if (rank == 0 && (stranger = fork()) == 0) _exit(connect_as_rank(other_uid));
  if (rank != 0 && !wait_for(&scratch->connected)) return 17;
  if (rank == 1) nap_ms(300); /* the stranger took rank 1's turn */
  if (mine < 0 || !psc_share_fds(mine, got)) return 12;
  int bad = all_frames_right(got);
  if (stranger > 0) waitpid(stranger, NULL, 0);
  psc_node_leave();
  return bad;
}

static void stranger_refused(bool other_uid) {
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, ranks_beside_a_stranger, &other_uid, LIMIT_S, res);
  assert_int_equal(atomic_load(&scratch->connected), 1); /* it did reach the star */
  assert_int_equal(atomic_load(&scratch->got_fds), 0);
  assert_int_equal(atomic_load(&scratch->got_bytes), 0);
  for (int r = 0; r < NRANKS; r++) assert_int_equal(res[r].code, 0);
  char uid[32];
  snprintf(uid, sizeof uid, "(uid %d)", other_uid ? NOBODY : (int)geteuid());
  assert_non_null(strstr(res[0].err, "psshim: refused a connection to the ranks' socket star from pid"));
  assert_non_null(strstr(res[0].err, uid));
  assert_null(strstr(strchr(res[0].err, '\n') + 1, "psshim:")); /* one line */
  assert_string_equal(res[1].err, "");
  assert_string_equal(res[2].err, "");
}

static void stranger_of_another_uid_refused(void **state) {
  (void)state;
  if (root_or_skip()) stranger_refused(true);
  else skip();
}

static void same_uid_process_not_a_rank_refused(void **state) {
  (void)state;
  stranger_refused(false);
}

/* ---- each credential the star compares, one at a time ----
 * docs/security.md: the peer's uid must be this process's. Its gid is not looked at: a rank
 * whose gid differs is the job's own, and a process whose uid differs is refused though its
 * gid equals this user's uid (root here: uid 0, gid 0). */

enum field_case { RANK_OTHER_GID, RANK_OTHER_UID };

static int ranks_one_field_off(int rank, void *arg) {
  enum field_case c = *(enum field_case *)arg;
  pid_t parent = getppid();
  if (c == RANK_OTHER_GID && rank == 1 && (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0))
    return 30;
  if (!join()) return 10;
  /* After the join (the segment is open already), the uid alone changes: the gid stays 0. */
  if (c == RANK_OTHER_UID && rank == 1 &&
      (setresuid(NOBODY, NOBODY, NOBODY) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
    return 31;
  int mine = frame(rank, RANK_MARK, PIECE), got[PSC_MAX_RANKS];
  if (mine < 0) return 11;
  if (c == RANK_OTHER_GID) {
    int code = psc_share_fds(mine, got) ? all_frames_right(got) : 12;
    psc_node_leave();
    return code;
  }
  int code = psc_share_fds(mine, got) ? 20 : 0; /* rank 1 is not let in, so the exchange fails */
  for (int r = 0; r < NRANKS; r++)
    if (got[r] >= 0) {
      int v[2];
      frame_holds(got[r], v);
      if (r == 1 || rank == 1) code = 21; /* a frame crossed between rank 1 and the others */
      close(got[r]);
    }
  if (rank != 1) psc_node_leave();
  return code;
}

static void rank_of_another_gid_joins(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  enum field_case c = RANK_OTHER_GID;
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, ranks_one_field_off, &c, LIMIT_S, res);
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
}

static void rank_of_another_uid_same_gid_refused(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  setenv("PSSHIM_COMM_TIMEOUT_S", "3", 1); /* rank 0 waits for rank 1 until then */
  assert_true(ps_options_parse(NULL, 0));
  enum field_case c = RANK_OTHER_UID;
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, ranks_one_field_off, &c, LIMIT_S, res);
  for (int r = 0; r < NRANKS; r++) assert_int_equal(res[r].code, 0);
  assert_non_null(strstr(res[0].err, "psshim: refused a connection to the ranks' socket star from pid"));
  assert_non_null(strstr(res[0].err, "(uid 65534)"));
  /* rank 1, under the other uid, does not take rank 0 for its rank 0 either */
  assert_non_null(strstr(res[1].err, "which is not this job's rank 0"));
}

/* ---- a stranger holds the star's name ---- */

/* Forked by rank 0: binds the star's name as another uid before rank 0 can, then plays
 * rank 0 to whoever connects and says a rank: takes their frames, hands out its own. */
static int squat_the_star(void) {
  struct sockaddr_un a;
  socklen_t len;
  if (!psc_star_address(&a, &len) || !as_nobody()) return 1;
  int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&a, len) != 0 || listen(l, 16) != 0) return 2;
  atomic_store(&scratch->ready, 1);
  int peers[NRANKS], n = 0;
  for (int tries = 0; tries < 8 && n < NRANKS - 1; tries++) {
    struct pollfd p = {.fd = l, .events = POLLIN};
    if (poll(&p, 1, 3000) <= 0) break;
    int c = accept(l, NULL, NULL);
    int32_t rank;
    struct pollfd q = {.fd = c, .events = POLLIN};
    if (c >= 0 && poll(&q, 1, 1000) > 0 && recv(c, &rank, sizeof rank, MSG_WAITALL) == sizeof rank)
      peers[n++] = c;
    else if (c >= 0)
      close(c); /* a rank that looked and left */
  }
  for (int k = 0; k < n; k++) take_all(peers[k], 0.3); /* their frames, if they send them */
  unsigned char all[NRANKS];
  int fakes[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    all[r] = 1;
    fakes[r] = frame(r, STRANGER_MARK, PIECE);
  }
  char ctl[CMSG_SPACE(sizeof fakes)] = {0};
  struct iovec iov = {all, sizeof all};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof fakes);
  memcpy(CMSG_DATA(h), fakes, sizeof fakes);
  for (int k = 0; k < n; k++) sendmsg(peers[k], &m, MSG_NOSIGNAL);
  pause(); /* rank 0 ends it once every rank is done */
  return 0;
}

static int ranks_under_a_squatter(int rank, void *arg) {
  (void)arg;
  if (!join()) return 10;
  int mine = frame(rank, RANK_MARK, PIECE), got[PSC_MAX_RANKS];
  pid_t squatter = -1;
  if (rank == 0 && (squatter = fork()) == 0) _exit(squat_the_star());
  if (mine < 0 || !wait_for(&scratch->ready)) return 17;
  int code = 0;
  if (psc_share_fds(mine, got)) code = 21; /* the exchange went through the stranger */
  for (int r = 0; r < NRANKS; r++) {
    int v[2];
    if (got[r] < 0) continue;
    frame_holds(got[r], v);
    code = v[1] == STRANGER_MARK ? 20 : 22; /* mapping this would read the stranger's bytes */
    close(got[r]);
  }
  psc_barrier(); /* the squatter serves until every rank is past it */
  if (squatter > 0) {
    kill(squatter, SIGKILL);
    waitpid(squatter, NULL, 0);
  }
  psc_node_leave();
  return code;
}

static void squatting_hub_detected_by_every_rank(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, ranks_under_a_squatter, NULL, LIMIT_S, res);
  assert_int_equal(atomic_load(&scratch->ready), 1);
  assert_int_equal(atomic_load(&scratch->got_fds), 0); /* no rank's frame reached it */
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 10); /* found out at once, not at the timeout */
    assert_non_null(strstr(res[r].err, "is held by pid"));
    assert_non_null(strstr(res[r].err, "(uid 65534), which is not"));
    assert_null(strstr(strchr(res[r].err, '\n') + 1, "psshim:"));
  }
}

/* ---- a frame unlike the rank's own ---- */

enum defect { WRONG_SIZE, WRONG_KIND };

static int ranks_with_a_bad_frame(int rank, void *arg) {
  enum defect d = *(enum defect *)arg;
  if (!join()) return 10;
  int mine = frame(rank, RANK_MARK, PIECE), got[PSC_MAX_RANKS];
  if (rank == 2 && d == WRONG_SIZE) {
    close(mine);
    mine = frame(rank, RANK_MARK, 2 * PIECE);
  } else if (rank == 2) { /* a file of the right size, but not a frame */
    FILE *f = tmpfile();
    mine = f && ftruncate(fileno(f), PIECE) == 0 ? dup(fileno(f)) : -1;
    if (f) fclose(f);
  }
  if (mine < 0) return 11;
  int code = psc_share_fds(mine, got) ? 20 : 0;
  for (int r = 0; r < NRANKS; r++)
    if (got[r] >= 0) {
      code = 21; /* the caller would map it */
      close(got[r]);
    }
  psc_node_leave();
  return code;
}

static void bad_frame_refused(enum defect d) {
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, ranks_with_a_bad_frame, &d, LIMIT_S, res);
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 10);
    assert_null(strstr(strchr(res[r].err, '\n') + 1, "psshim:"));
  }
  assert_non_null(strstr(res[0].err, "psshim: the frame rank 2 shared is not like this rank's own"));
}

static void frame_of_wrong_size_refused(void **state) {
  (void)state;
  bad_frame_refused(WRONG_SIZE);
}

static void frame_of_wrong_kind_refused(void **state) {
  (void)state;
  bad_frame_refused(WRONG_KIND);
}

/* ---- node segment names held by a file that is not the job's ----
 * docs/security.md: a segment is accepted only if it is a regular file of this user that no
 * one else may open; anything else is passed over (rank 0 makes the segment under the next
 * name and says so). One of this user's, closed to others, whose creator is gone, is a
 * crashed run's: rank 0 replaces it and no one says anything. */

enum planted { SEGMENT, FIFO, SYMLINK };

struct plant {
  int count;         /* the first `count` names */
  bool other_uid;    /* made as another uid (nobody), else as this user */
  mode_t mode;
  bool dead_creator; /* its creator gone, else the planter itself, alive */
  enum planted kind; /* SEGMENT: a whole one; FIFO: a named pipe; SYMLINK: a link to a whole
                      * segment of this user's under another name (one a follower would join) */
};

/* Forked by rank 0 before the join: makes the first `count` segment names into segments
 * claiming to be this job's, whole and ready. */
static int plant_segments(const struct plant *p) {
  struct psc_ranks r;
  if (psc_ranks_read(&r) != PSC_GROUP) return 1;
  struct psc_proc creator = psc_proc_self();
  if (p->dead_creator) { /* a process that has ended, its start time no one else's */
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    if (gone < 0 || waitpid(gone, NULL, 0) != gone) return 4;
    creator = (struct psc_proc){.pid = gone, .start = 1};
  }
  if (p->other_uid && !as_nobody()) return 1;
  for (int k = 0; k < p->count; k++) {
    char *name = scratch->squatted[k];
    psc_segment_name(r.job_key, k, name);
    char path[80];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    if (p->kind == FIFO) {
      if (mkfifo(path, p->mode) != 0 || chmod(path, p->mode) != 0) return 5;
      continue;
    }
    if (p->kind == SYMLINK) { /* the link's target: name + "-target", a whole segment */
      char target[96];
      memcpy(scratch->targets[k], name, strlen(name));
      strcat(scratch->targets[k], "-target");
      snprintf(target, sizeof target, "/dev/shm%s", scratch->targets[k]);
      if (symlink(target, path) != 0) return 6;
    }
    int fd = shm_open(p->kind == SYMLINK ? scratch->targets[k] : name, O_RDWR | O_CREAT | O_EXCL, p->mode);
    if (fd < 0 || fchmod(fd, p->mode) != 0 || ftruncate(fd, sizeof(struct psc_node)) != 0) return 2;
    struct psc_node *node = mmap(NULL, sizeof *node, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (node == MAP_FAILED) return 3;
    node->creator = creator;
    node->nranks = NRANKS;
    node->group.n = NRANKS;
    atomic_store(&node->magic, PSC_NODE_MAGIC);
  }
  atomic_store(&scratch->ready, 1);
  pause();
  return 0;
}

/* The name the job met at: k of its names, or -1. */
static int met_at(void) {
  struct psc_ranks r;
  if (psc_ranks_read(&r) != PSC_GROUP) return -1;
  for (int k = 0; k < PSC_SEGMENT_NAMES; k++) {
    char name[48];
    psc_segment_name(r.job_key, k, name);
    if (!strcmp(name, psc_state.shm_name)) return k;
  }
  return -1;
}

static int ranks_beside_planted_segments(int rank, void *arg) {
  const struct plant *p = arg;
  pid_t planter = -1;
  if (rank == 0 && (planter = fork()) == 0) _exit(plant_segments(p));
  if (!wait_for(&scratch->ready)) return 17;
  int code = 0;
  if (p->count < PSC_SEGMENT_NAMES) { /* the job meets elsewhere, or replaces a stale one, and shares as usual */
    int mine = frame(rank, RANK_MARK, PIECE), got[PSC_MAX_RANKS];
    if (!join()) code = 10;
    else if (met_at() != (p->dead_creator ? 0 : p->count)) code = 19;
    else code = mine >= 0 && psc_share_fds(mine, got) ? all_frames_right(got) : 12;
    psc_barrier();
  } else if (join()) {
    code = 18;
  }
  if (planter > 0) {
    kill(planter, SIGKILL);
    waitpid(planter, NULL, 0);
  }
  psc_node_leave();
  return code;
}

/* line: what rank 0 (every rank when all names are taken) says, once; NULL: nothing. */
static void segments_planted(struct plant p, const char *line) {
  struct rank_result res[NRANKS];
  memset(scratch, 0, sizeof *scratch); /* a test may plant several times */
  run_ranks(NRANKS, ranks_beside_planted_segments, &p, LIMIT_S, res);
  for (int k = 0; k < PSC_SEGMENT_NAMES; k++) /* the names outlive their maker: removed here */
  {
    if (scratch->squatted[k][0]) shm_unlink(scratch->squatted[k]);
    if (scratch->targets[k][0]) shm_unlink(scratch->targets[k]);
  }
  assert_int_equal(atomic_load(&scratch->ready), 1);
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 10);
    if (line && (r == 0 || p.count == PSC_SEGMENT_NAMES)) {
      assert_non_null(strstr(res[r].err, line));
      assert_null(strstr(strchr(res[r].err, '\n') + 1, "psshim:"));
    } else {
      assert_string_equal(res[r].err, "");
    }
  }
}

static void squatted_segment_name_passed_over(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  segments_planted((struct plant){1, true, 0666, false, SEGMENT}, "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
  /* another uid's, closed to everyone else: its owner alone is enough to refuse it */
  segments_planted((struct plant){1, true, 0600, false, SEGMENT}, "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
}

static void all_segment_names_squatted_every_rank_alone_at_once(void **state) {
  (void)state;
  if (!root_or_skip()) skip();
  segments_planted((struct plant){PSC_SEGMENT_NAMES, true, 0666, false, SEGMENT}, "are all taken by files this job may not use");
}

/* This user's own segment that its group or others may open (read or write) is passed over
 * as another user's would be: whoever else could open it could read the star's salt. */
static void own_segment_others_may_open_passed_over(void **state) {
  (void)state;
  const mode_t modes[] = {0640, 0620, 0610, 0660, 0604, 0602, 0601, 0606};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    segments_planted((struct plant){1, false, modes[i], false, SEGMENT},
                     "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
}

/* A named pipe under the first name, this user's and closed to others in all but kind: no
 * open of it blocks (rank 0's sweep of abandoned segments reads every psshim- name), and it is
 * passed over as a file this job may not use. Another user's, open to all, likewise. */
static void planted_fifo_neither_blocks_nor_joined(void **state) {
  (void)state;
  segments_planted((struct plant){1, false, 0600, false, FIFO},
                   "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
  if (geteuid() == 0)
    segments_planted((struct plant){1, true, 0666, false, FIFO},
                     "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
}

/* A link under the first name to a whole segment of this user's, closed to others, its
 * creator alive: a rank that followed it would join (or wait on) a segment the job never
 * made. No open follows it: the name is passed over. */
static void planted_symlink_not_followed(void **state) {
  (void)state;
  segments_planted((struct plant){1, false, 0600, false, SYMLINK},
                   "is taken by a file this job may not use (another user's, or open to others): this job's ranks meet at");
}

/* This user's own, closed to others, its creator gone: replaced at the same name, silently. */
static void own_stale_segment_replaced(void **state) {
  (void)state;
  segments_planted((struct plant){1, false, 0600, true, SEGMENT}, NULL);
}

int main(void) {
  scratch = shared_scratch(sizeof *scratch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(stranger_of_another_uid_refused, setup),
      cmocka_unit_test_setup(same_uid_process_not_a_rank_refused, setup),
      cmocka_unit_test_setup(squatting_hub_detected_by_every_rank, setup),
      cmocka_unit_test_setup(frame_of_wrong_size_refused, setup),
      cmocka_unit_test_setup(frame_of_wrong_kind_refused, setup),
      cmocka_unit_test_setup(squatted_segment_name_passed_over, setup),
      cmocka_unit_test_setup(all_segment_names_squatted_every_rank_alone_at_once, setup),
      cmocka_unit_test_setup(own_segment_others_may_open_passed_over, setup),
      cmocka_unit_test_setup(own_stale_segment_replaced, setup),
      cmocka_unit_test_setup(planted_fifo_neither_blocks_nor_joined, setup),
      cmocka_unit_test_setup(planted_symlink_not_followed, setup),
      cmocka_unit_test_setup(rank_of_another_gid_joins, setup),
      cmocka_unit_test_setup(rank_of_another_uid_same_gid_refused, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
