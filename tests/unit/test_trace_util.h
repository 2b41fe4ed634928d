/* Helpers shared by the trace tests: temporary paths and reading a whole trace back. */
#ifndef PSSHIM_TEST_TRACE_UTIL_H
#define PSSHIM_TEST_TRACE_UTIL_H

#include <stddef.h>

#include "tracer/tracer.h"

/* Records read back, with their texts and arrays copied so they outlive the reader. */
struct trace_read {
  struct pst_trace_header header;
  struct pst_record *recs;
  size_t n;
  struct pst_read_stats stats;
  char error[256]; /* the reader's first problem, or pst_reader_open's message */
  int opened;
};

/* A path under $TMPDIR (or /tmp) with name and the process id in it; the same name gives
 * the same path. */
const char *test_trace_path(const char *name);
/* Removes every file test_trace_path named (a cmocka group teardown). */
int test_trace_remove_all(void **state);
/* Reads path to its end. Returns opened (the reader could read the header). */
int test_trace_read(const char *path, struct trace_read *out);
void test_trace_read_free(struct trace_read *t);
/* Text of STRING id in t, or NULL. */
const char *test_trace_string(const struct trace_read *t, unsigned id);
size_t test_trace_count(const struct trace_read *t, unsigned type);
/* Writes n bytes of data to path (for damaged copies of a trace). */
void test_write_file(const char *path, const void *data, size_t n);
/* Whole file into a malloc'd buffer; *n its size. */
unsigned char *test_read_file(const char *path, size_t *n);

#endif
