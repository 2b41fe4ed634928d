/* Helpers shared by the trace tests (see test_trace_util.h). */
#include "test_trace_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every distinct path handed out, so that a group teardown removes what a failed test (its
 * assertion jumps past its own unlink) left behind. */
static char paths[32][512];
static int npaths;

const char *test_trace_path(const char *name) {
  char p[512];
  const char *dir = getenv("TMPDIR");
  snprintf(p, sizeof p, "%s/psshim-test-%d-%s.trace", dir && *dir ? dir : "/tmp", (int)getpid(), name);
  for (int i = 0; i < npaths; i++)
    if (!strcmp(paths[i], p)) return paths[i];
  if (npaths == 32) abort(); /* more names than a test program uses: raise the bound */
  memcpy(paths[npaths], p, sizeof p);
  return paths[npaths++];
}

int test_trace_remove_all(void **state) {
  (void)state;
  for (int i = 0; i < npaths; i++) unlink(paths[i]);
  return 0;
}

static void *dup_bytes(const void *p, size_t n) {
  void *d = malloc(n ? n : 1);
  if (n) memcpy(d, p, n);
  return d;
}

int test_trace_read(const char *path, struct trace_read *t) {
  memset(t, 0, sizeof *t);
  struct pst_reader *rd = pst_reader_open(path, t->error, sizeof t->error);
  if (!rd) return 0;
  t->opened = 1;
  t->header = *pst_reader_header(rd);
  size_t cap = 0;
  struct pst_record r;
  while (pst_reader_next(rd, &r)) {
    if (t->n == cap) {
      cap = cap ? cap * 2 : 256;
      t->recs = realloc(t->recs, cap * sizeof *t->recs);
    }
    /* Deep copies: the reader's pointers die at its next record. */
    if (r.type == PST_REC_STRING) r.string.text = dup_bytes(r.string.text, r.string.len);
    if (r.type == PST_REC_NOTE) r.note.text = dup_bytes(r.note.text, r.note.len);
    if (r.type == PST_REC_STACK)
      r.stack.frames = dup_bytes(r.stack.frames, r.stack.depth * sizeof *r.stack.frames);
    if (r.type == PST_REC_LAUNCH) r.launch.ptrs = dup_bytes(r.launch.ptrs, r.launch.n * 8u);
    t->recs[t->n++] = r;
  }
  t->stats = pst_reader_stats(rd);
  if (pst_reader_error(rd)) snprintf(t->error, sizeof t->error, "%s", pst_reader_error(rd));
  pst_reader_close(rd);
  return 1;
}

void test_trace_read_free(struct trace_read *t) {
  for (size_t i = 0; i < t->n; i++) {
    struct pst_record *r = &t->recs[i];
    if (r->type == PST_REC_STRING) free((void *)r->string.text);
    if (r->type == PST_REC_NOTE) free((void *)r->note.text);
    if (r->type == PST_REC_STACK) free((void *)r->stack.frames);
    if (r->type == PST_REC_LAUNCH) free((void *)r->launch.ptrs);
  }
  free(t->recs);
  memset(t, 0, sizeof *t);
}

const char *test_trace_string(const struct trace_read *t, unsigned id) {
  static char text[4200];
  for (size_t i = 0; i < t->n; i++)
    if (t->recs[i].type == PST_REC_STRING && t->recs[i].string.id == id) {
      snprintf(text, sizeof text, "%.*s", (int)t->recs[i].string.len, t->recs[i].string.text);
      return text;
    }
  return NULL;
}

size_t test_trace_count(const struct trace_read *t, unsigned type) {
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++) n += t->recs[i].type == type;
  return n;
}

void test_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (n && fwrite(data, 1, n, f) != n) abort();
  fclose(f);
}

unsigned char *test_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) abort();
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *d = malloc(*n ? *n : 1);
  if (*n && fread(d, 1, *n, f) != *n) abort();
  fclose(f);
  return d;
}
