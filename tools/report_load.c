/* Reads a trace whole into psshim-report's model. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

static void *copy_of(const void *p, size_t n) {
  void *d = malloc(n + 1); /* +1: texts get a NUL */
  if (d) {
    if (n) memcpy(d, p, n); /* an empty array may have no storage (a LAUNCH of no pointers) */
    ((char *)d)[n] = '\0';
  }
  return d;
}

/* Distinct strings or stacks a trace may name: 4M, far above a real run's thousands. */
#define RP_MAX_ID (1u << 22)
/* Chunks a device's space may hold: 8M, 16 TiB of 2 MiB chunks, twice the frames of the
 * largest host budget of today's machines. */
#define RP_MAX_CHUNKS (1ull << 23)

struct order { uint64_t ts; size_t i; };
static int by_time(const void *a, const void *b) {
  const struct order *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* Records of different threads arrive out of order; sort, keeping file order on ties. */
static bool sort_events(struct rp_trace *t) {
  bool sorted = true;
  for (size_t i = 1; i < t->nev && sorted; i++) sorted = t->ev[i - 1].ts_ns <= t->ev[i].ts_ns;
  if (sorted) return true;
  struct order *o = malloc(t->nev * sizeof *o);
  struct pst_record *ev = malloc(t->nev * sizeof *ev);
  if (!o || !ev) {
    free(o);
    free(ev);
    return false;
  }
  for (size_t i = 0; i < t->nev; i++) o[i] = (struct order){ t->ev[i].ts_ns, i };
  qsort(o, t->nev, sizeof *o, by_time);
  for (size_t i = 0; i < t->nev; i++) ev[i] = t->ev[o[i].i];
  free(o);
  free(t->ev);
  t->ev = ev;
  return true;
}

bool rp_load(const char *path, struct rp_trace *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  t->path = path;
  struct pst_reader *rd = pst_reader_open(path, err, errlen);
  if (!rd) return false;
  t->hdr = *pst_reader_header(rd);
  /* More chunks than any device's space holds: a damaged header, whose tables by chunk
   * would not fit in memory. The space is left out (nothing lies in it). */
  if (t->hdr.chunk_size && t->hdr.space_size / t->hdr.chunk_size > RP_MAX_CHUNKS) {
    snprintf(t->error, sizeof t->error, "the header's chunk space (%llu bytes in chunks of %llu) is past any device's "
             "(damaged?); nothing is placed in it", (unsigned long long)t->hdr.space_size,
             (unsigned long long)t->hdr.chunk_size);
    t->hdr.space_size = 0;
  }
  size_t cap_ev = 0, cap_str = 0, cap_stk = 0;
  struct pst_record r;
  bool ok = true;
  while (ok && pst_reader_next(rd, &r)) {
    /* The run's span is its activity: strings and stacks are stamped when the dictionary
     * was written, END when the file was closed. */
    if (r.type > PST_REC_STACK && r.type != PST_REC_END && r.ts_ns > t->t1) t->t1 = r.ts_ns;
    /* Ids are handed out one by one from 1: one past any real run's count is damage, and
     * a table of its size would not fit in memory. */
    const uint32_t id = r.type == PST_REC_STRING ? r.string.id : r.type == PST_REC_STACK ? r.stack.id : 0;
    if (id > RP_MAX_ID) {
      if (!t->error[0])
        snprintf(t->error, sizeof t->error, "a %s record's id %u is past any real run's (damaged?); it is skipped",
                 r.type == PST_REC_STRING ? "STRING" : "STACK", id);
      continue;
    }
    switch (r.type) {
    case PST_REC_STRING:
      ok = rp_reserve((void **)&t->strings, &cap_str, r.string.id, sizeof *t->strings);
      if (ok && !t->strings[r.string.id]) t->strings[r.string.id] = copy_of(r.string.text, r.string.len);
      if (r.string.id >= t->nstrings) t->nstrings = r.string.id + 1;
      continue;
    case PST_REC_STACK:
      ok = rp_reserve((void **)&t->stacks, &cap_stk, r.stack.id, sizeof *t->stacks);
      if (ok && !t->stacks[r.stack.id].frames) {
        t->stacks[r.stack.id].depth = r.stack.depth;
        t->stacks[r.stack.id].frames = copy_of(r.stack.frames, r.stack.depth * sizeof *r.stack.frames);
      }
      if (r.stack.id >= t->nstacks) t->nstacks = r.stack.id + 1;
      continue;
    case PST_REC_LAUNCH:
      ok = (r.launch.ptrs = copy_of(r.launch.ptrs, r.launch.n * sizeof *r.launch.ptrs)) != NULL;
      break;
    case PST_REC_NOTE:
      ok = (r.note.text = copy_of(r.note.text, r.note.len)) != NULL;
      break;
    default:
      break;
    }
    ok = rp_reserve((void **)&t->ev, &cap_ev, t->nev, sizeof *t->ev);
    if (ok) t->ev[t->nev++] = r;
  }
  t->stats = pst_reader_stats(rd);
  if (pst_reader_error(rd) && !t->error[0]) snprintf(t->error, sizeof t->error, "%s", pst_reader_error(rd));
  pst_reader_close(rd);
  if (!ok || !sort_events(t)) {
    snprintf(err, errlen, "%s: out of memory", path);
    rp_free(t);
    return false;
  }
  t->t0 = t->hdr.start_ns;
  if (t->nev && t->ev[0].ts_ns && t->ev[0].ts_ns < t->t0) t->t0 = t->ev[0].ts_ns;
  if (t->t1 < t->t0) t->t1 = t->t0;
  return true;
}

void rp_free(struct rp_trace *t) {
  for (size_t i = 0; i < t->nstrings; i++) free(t->strings[i]);
  for (size_t i = 0; i < t->nstacks; i++) free(t->stacks[i].frames);
  for (size_t i = 0; i < t->nev; i++) {
    if (t->ev[i].type == PST_REC_LAUNCH) free((void *)t->ev[i].launch.ptrs);
    if (t->ev[i].type == PST_REC_NOTE) free((void *)t->ev[i].note.text);
  }
  free(t->strings);
  free(t->stacks);
  free(t->ev);
  memset(t, 0, sizeof *t);
}

const char *rp_string(const struct rp_trace *t, uint32_t id) {
  return id < t->nstrings && t->strings[id] ? t->strings[id] : "?";
}

const char *rp_settings(const struct rp_trace *t) {
  for (size_t i = 0; i < t->nev; i++)
    if (t->ev[i].type == PST_REC_NOTE && strncmp(t->ev[i].note.text, RP_SETTINGS, strlen(RP_SETTINGS)) == 0)
      return t->ev[i].note.text + strlen(RP_SETTINGS);
  return NULL;
}
