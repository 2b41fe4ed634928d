/* The reader on damaged traces: cut at every byte, random corruption, corruption behind
 * valid checksums (a bad record in a sound block is named and counted), foreign files. It
 * must never crash, and must say what it lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_trace_util.h"
#include "tracer/trace_codec.h"
#include "tracer/tracer.h"

/* A small trace of several blocks, each flush making one. */
static const char *small_trace(void) {
  static char path[512];
  if (path[0]) return path;
  snprintf(path, sizeof path, "%s", test_trace_path("small"));
  const struct pst_trace_header h = { .chunk_size = 1 << 20, .device = "fake" };
  assert_true(pst_trace_open(path, &h));
  for (uint64_t b = 0; b < 4; b++) {
    const uint64_t ptrs[] = { 0x1000 * b, 0x2000 };
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_LAUNCH,
                                         .launch = { 1, b, pst_trace_intern(b % 2 ? "odd" : "even"), 2, ptrs } });
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_ALLOC,
                                         .alloc = { 0x1000 * b, 64, 1, pst_trace_stack_here(0), 0, 0 } });
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_COPY, .copy = { PST_COPY_H2D, 100 * b, 1, 2, 1, 5, 9 } });
    pst_trace_emit(&(struct pst_record){ .type = PST_REC_NOTE, .note = { 0, "note" } });
    pst_trace_flush();
  }
  pst_trace_close();
  return path;
}

/* The same records, in the same order, as a prefix of the whole trace. */
static void assert_prefix(const struct trace_read *part, const struct trace_read *whole) {
  assert_true(part->n <= whole->n);
  for (size_t i = 0; i < part->n; i++) {
    assert_int_equal(part->recs[i].type, whole->recs[i].type);
    assert_int_equal(part->recs[i].ts_ns, whole->recs[i].ts_ns);
  }
}

static void test_truncated_everywhere(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = test_read_file(small_trace(), &size);
  struct trace_read whole, part;
  assert_true(test_trace_read(small_trace(), &whole));
  assert_true(whole.stats.clean_end && whole.stats.blocks >= 4);
  const char *cut = test_trace_path("cut");
  size_t clean_cuts = 0;
  for (size_t k = 0; k < size; k++) {
    test_write_file(cut, data, k);
    if (!test_trace_read(cut, &part)) {
      assert_true(k < PST_FILE_HEADER_SIZE);
      assert_non_null(strstr(part.error, "truncated at byte"));
      continue;
    }
    assert_true(k >= PST_FILE_HEADER_SIZE);
    assert_prefix(&part, &whole);
    assert_false(part.stats.clean_end);
    if (part.error[0]) {
      char want[64];
      snprintf(want, sizeof want, "truncated at byte %zu", k);
      assert_non_null(strstr(part.error, want));
      assert_true(part.stats.torn_tail);
      assert_int_equal(part.stats.good_bytes + part.stats.lost_bytes, k);
    } else {
      clean_cuts++; /* cut exactly between two blocks: nothing to tell */
    }
    test_trace_read_free(&part);
  }
  assert_true(clean_cuts >= 4);
  test_trace_read_free(&whole);
  free(data);
  unlink(cut);
}

/* Fixed-seed generator, so a failure reproduces. */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_random_corruption(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = test_read_file(small_trace(), &size), *bad = malloc(size);
  const char *path = test_trace_path("fuzz");
  struct trace_read t;
  for (int round = 0; round < 3000; round++) {
    memcpy(bad, data, size);
    const int flips = 1 + (int)(next_random() % 8);
    for (int i = 0; i < flips; i++) bad[next_random() % size] ^= (unsigned char)(1 + next_random() % 255);
    test_write_file(path, bad, size);
    const int opened = test_trace_read(path, &t);
    /* Every change is caught by some checksum: silence would mean a missed corruption. */
    assert_true(t.error[0] != '\0');
    if (opened) assert_true(t.stats.lost_bytes > 0 || t.stats.bad_blocks > 0);
    test_trace_read_free(&t);
  }
  free(bad);
  free(data);
  unlink(path);
}

/* Recomputes every block's checksums, so damage reaches the record decoder. */
static void reseal(unsigned char *d, size_t size) {
  size_t at = PST_FILE_HEADER_SIZE;
  while (at + PST_BLOCK_HEADER_SIZE <= size) {
    uint32_t len;
    memcpy(&len, d + at + 4, 4);
    if (len > size - at - PST_BLOCK_HEADER_SIZE) return;
    pst_encode_block_header(d + at, d + at + PST_BLOCK_HEADER_SIZE, len);
    at += PST_BLOCK_HEADER_SIZE + len;
  }
}

static void test_corruption_behind_checksums(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = test_read_file(small_trace(), &size), *bad = malloc(size);
  const char *path = test_trace_path("resealed");
  struct trace_read t;
  for (int round = 0; round < 3000; round++) {
    memcpy(bad, data, size);
    const int flips = 1 + (int)(next_random() % 4);
    for (int i = 0; i < flips; i++) {
      size_t at = PST_FILE_HEADER_SIZE + next_random() % (size - PST_FILE_HEADER_SIZE);
      bad[at] = (unsigned char)next_random();
    }
    reseal(bad, size);
    test_write_file(path, bad, size);
    assert_true(test_trace_read(path, &t));
    test_trace_read_free(&t);
  }
  free(bad);
  free(data);
  unlink(path);
}

/* The small trace's bytes (*size of them), the trace read whole, and where its second
 * block starts. */
static unsigned char *small_trace_bytes(size_t *size, struct trace_read *whole, size_t *second) {
  unsigned char *data = test_read_file(small_trace(), size);
  assert_true(test_trace_read(small_trace(), whole));
  uint32_t len1;
  memcpy(&len1, data + PST_FILE_HEADER_SIZE + 4, 4);
  *second = PST_FILE_HEADER_SIZE + PST_BLOCK_HEADER_SIZE + len1;
  return data;
}

static void test_reads_past_a_bad_block(void **state) {
  (void)state;
  size_t size, second;
  struct trace_read whole, t;
  unsigned char *data = small_trace_bytes(&size, &whole, &second);
  const char *path = test_trace_path("badblock");
  char want[64];
  snprintf(want, sizeof want, "corrupt block at byte %zu", second);
  /* Damage in the payload (its checksum fails) and in the header (found again by magic). */
  const size_t where[] = { second + PST_BLOCK_HEADER_SIZE + 3, second + 5 };
  for (size_t w = 0; w < 2; w++) {
    data[where[w]] ^= 0x40;
    test_write_file(path, data, size);
    data[where[w]] ^= 0x40;
    assert_true(test_trace_read(path, &t));
    assert_non_null(strstr(t.error, want));
    assert_int_equal(t.stats.bad_blocks, 1);
    assert_true(t.stats.clean_end); /* the blocks after it were read */
    assert_true(t.n < whole.n && t.n > whole.n / 2);
    assert_int_equal(t.recs[t.n - 1].type, PST_REC_END);
    assert_int_equal(t.stats.good_bytes + t.stats.lost_bytes, size);
    test_trace_read_free(&t);
  }
  test_trace_read_free(&whole);
  free(data);
  unlink(path);
}

/* A record the decoder rejects inside a block whose checksum holds (the writer made it so):
 * the reader names it, counts the rest of its block as lost, and reads the blocks after. */
static void test_corrupt_record_in_a_sound_block(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = test_read_file(small_trace(), &size);
  struct trace_read whole, t;
  assert_true(test_trace_read(small_trace(), &whole));
  uint32_t len1, len2;
  memcpy(&len1, data + PST_FILE_HEADER_SIZE + 4, 4);
  const size_t second = PST_FILE_HEADER_SIZE + PST_BLOCK_HEADER_SIZE + len1, record = second + PST_BLOCK_HEADER_SIZE;
  memcpy(&len2, data + second + 4, 4);
  const uint32_t too_long = 0xFFFFFFF0u; /* the record's length field: past its block */
  memcpy(data + record + 4, &too_long, 4);
  reseal(data, size);
  const char *path = test_trace_path("badrecord");
  test_write_file(path, data, size);
  assert_true(test_trace_read(path, &t));
  char want[64];
  snprintf(want, sizeof want, "corrupt record at byte %zu", record);
  assert_non_null(strstr(t.error, want));
  assert_int_equal(t.stats.bad_blocks, 0); /* the block itself is sound */
  assert_int_equal(t.stats.lost_bytes, len2);
  assert_int_equal(t.stats.good_bytes + t.stats.lost_bytes, size);
  assert_true(t.stats.clean_end); /* the blocks after it were read */
  assert_true(t.n < whole.n && t.n > whole.n / 2);
  assert_int_equal(t.recs[t.n - 1].type, PST_REC_END);
  test_trace_read_free(&t);
  test_trace_read_free(&whole);
  free(data);
  unlink(path);
}

/* A block whose length field exceeds PST_BLOCK_MAX is refused even when both its checksums
 * hold (a crafted file: the writer never makes one), so the reader never reads more than its
 * buffer holds; the blocks after it are still read. One of exactly PST_BLOCK_MAX is read. */
static unsigned char *block_of(uint32_t len, const unsigned char *records, size_t nrecords) {
  unsigned char *b = calloc(1, PST_BLOCK_HEADER_SIZE + (size_t)len);
  assert_non_null(b);
  assert_true(nrecords + PST_RECORD_HEADER_SIZE <= len);
  memcpy(b + PST_BLOCK_HEADER_SIZE, records, nrecords);
  /* the rest: one record of a type no version has, skipped by its length */
  const uint16_t unknown = 0x7777;
  const uint32_t rest = len - (uint32_t)nrecords - PST_RECORD_HEADER_SIZE;
  memcpy(b + PST_BLOCK_HEADER_SIZE + nrecords, &unknown, 2);
  memcpy(b + PST_BLOCK_HEADER_SIZE + nrecords + 4, &rest, 4);
  pst_encode_block_header(b, b + PST_BLOCK_HEADER_SIZE, len);
  return b;
}

static void test_block_longer_than_max_refused(void **state) {
  (void)state;
  size_t size, second;
  struct trace_read whole, t;
  unsigned char *data = small_trace_bytes(&size, &whole, &second);
  const size_t first = PST_FILE_HEADER_SIZE;
  const uint32_t len1 = (uint32_t)(second - first - PST_BLOCK_HEADER_SIZE);
  const char *path = test_trace_path("longblock");
  for (uint32_t extra = 0; extra <= 8; extra += 8) {
    /* the first block's records, carried in a block of PST_BLOCK_MAX + extra bytes */
    const uint32_t len = PST_BLOCK_MAX + extra;
    unsigned char *b = block_of(len, data + first + PST_BLOCK_HEADER_SIZE, len1);
    uint32_t got_len, crc;
    assert_int_equal(pst_decode_block_header(b, &got_len, &crc), extra == 0);
    const size_t crafted = PST_FILE_HEADER_SIZE + PST_BLOCK_HEADER_SIZE + (size_t)len + (size - second);
    unsigned char *file = malloc(crafted);
    assert_non_null(file);
    memcpy(file, data, PST_FILE_HEADER_SIZE);
    memcpy(file + PST_FILE_HEADER_SIZE, b, PST_BLOCK_HEADER_SIZE + (size_t)len);
    memcpy(file + PST_FILE_HEADER_SIZE + PST_BLOCK_HEADER_SIZE + len, data + second, size - second);
    test_write_file(path, file, crafted);
    assert_true(test_trace_read(path, &t));
    assert_true(t.stats.clean_end); /* the blocks after it were read */
    assert_int_equal(t.stats.good_bytes + t.stats.lost_bytes, crafted);
    if (extra == 0) { /* at the maximum: read whole, the same records as the trace */
      assert_int_equal(t.stats.bad_blocks, 0);
      assert_int_equal(t.n, whole.n);
      assert_int_equal(t.stats.unknown_records, 1);
    } else {
      char want[64];
      snprintf(want, sizeof want, "corrupt block at byte %zu", first);
      assert_non_null(strstr(t.error, want));
      assert_int_equal(t.stats.bad_blocks, 1);
      assert_true(t.n < whole.n && t.n > whole.n / 2); /* the first block's records are not read */
      assert_int_equal(t.stats.unknown_records, 0);
    }
    test_trace_read_free(&t);
    free(file);
    free(b);
  }
  test_trace_read_free(&whole);
  free(data);
  unlink(path);
}

/* An ITERATION record as version 1 first wrote it (16 bytes, no pager totals), or cut inside
 * the totals, reads as a mark without them; a whole one keeps them. */
static void test_iteration_without_pager_totals(void **state) {
  (void)state;
  const struct pst_record in = { .type = PST_REC_ITERATION, .ts_ns = 7,
                                 .iteration = { .iteration = 3, .period = 433, .pager_ns = 9, .turns_ns = 8,
                                                .late_waits = 2, .late_wait_ns = 1 } };
  uint8_t buf[128];
  const size_t n = pst_encode_record(&in, buf);
  assert_int_equal(n, PST_RECORD_HEADER_SIZE + 16 + 32);
  struct pst_decode_scratch s = { 0 };
  struct pst_record got;
  size_t used;
  assert_int_equal(pst_decode_record(buf, n, &got, &used, &s), PST_DECODE_OK);
  assert_true(got.iteration.has_pager);
  assert_int_equal(got.iteration.pager_ns, 9);
  assert_int_equal(got.iteration.late_wait_ns, 1);
  for (uint32_t len = 16; len < 48; len += 8) {
    memcpy(buf + 4, &len, sizeof len); /* the payload length, after u16 type and u16 flags */
    assert_int_equal(pst_decode_record(buf, PST_RECORD_HEADER_SIZE + len, &got, &used, &s), PST_DECODE_OK);
    assert_int_equal(used, PST_RECORD_HEADER_SIZE + len);
    assert_int_equal(got.iteration.iteration, 3);
    assert_int_equal(got.iteration.period, 433);
    assert_false(got.iteration.has_pager);
    assert_int_equal(got.iteration.pager_ns, 0);
  }
  free(s.frames);
  free(s.ptrs);
}

/* ---- records whose own counts do not fit their own length ----
 * LAUNCH carries n pointers (8 bytes each) after 24 fixed bytes, STACK depth frames (16
 * bytes each) after 8. Each record lies alone in a buffer of exactly its size, so a read
 * past it is also one past the allocation (ASan's and valgrind's to see). */

/* A record of `type` with payload `fixed` bytes of zeros (the count field at count_at set
 * to count) and `tail` bytes after them; decoded from an exactly-sized copy. */
static enum pst_decode_result decode_counted(uint16_t type, uint32_t fixed, uint32_t count_at, uint32_t count,
                                             uint32_t tail, struct pst_record *got, struct pst_decode_scratch *s) {
  const uint32_t len = fixed + tail;
  const size_t size = PST_RECORD_HEADER_SIZE + len;
  uint8_t *rec = calloc(1, size);
  assert_non_null(rec);
  const uint16_t flags = 0;
  memcpy(rec, &type, 2);
  memcpy(rec + 2, &flags, 2);
  memcpy(rec + 4, &len, 4);
  memcpy(rec + PST_RECORD_HEADER_SIZE + count_at, &count, 4);
  for (uint32_t i = 0; i < tail; i++) rec[PST_RECORD_HEADER_SIZE + fixed + i] = (uint8_t)(i + 1);
  size_t used = 0;
  enum pst_decode_result r = pst_decode_record(rec, size, got, &used, s);
  if (r != PST_DECODE_BAD) assert_int_equal(used, size);
  if (r == PST_DECODE_OK && type == PST_REC_LAUNCH) /* the pointers are the record's own bytes */
    for (uint32_t i = 0; i < got->launch.n; i++)
      assert_memory_equal(&got->launch.ptrs[i], rec + PST_RECORD_HEADER_SIZE + fixed + 8 * i, 8);
  if (r == PST_DECODE_OK && type == PST_REC_STACK)
    for (uint32_t i = 0; i < got->stack.depth; i++)
      assert_memory_equal(&got->stack.frames[i].pc, rec + PST_RECORD_HEADER_SIZE + fixed + 16 * i, 8);
  free(rec);
  return r;
}

static void test_counts_against_length(void **state) {
  (void)state;
  const struct { uint16_t type; uint32_t fixed, count_at, item; } kinds[] = {
    { PST_REC_LAUNCH, 24, 20, 8 }, /* u64 stream | u64 seq | u32 function | u32 n */
    { PST_REC_STACK, 8, 4, 16 },   /* u32 id | u32 depth */
  };
  struct pst_decode_scratch s = { 0 };
  struct pst_record got;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const uint32_t fixed = kinds[k].fixed, at = kinds[k].count_at, item = kinds[k].item;
    for (uint32_t n = 0; n <= 3; n++) {
      /* exactly n items: sound, and n read back */
      assert_int_equal(decode_counted(kinds[k].type, fixed, at, n, n * item, &got, &s), PST_DECODE_OK);
      assert_int_equal(kinds[k].type == PST_REC_LAUNCH ? got.launch.n : got.stack.depth, n);
      /* a byte short of the n-th item, or one item more than the bytes hold: rejected */
      if (n) assert_int_equal(decode_counted(kinds[k].type, fixed, at, n, n * item - 1, &got, &s), PST_DECODE_BAD);
      assert_int_equal(decode_counted(kinds[k].type, fixed, at, n + 1, n * item, &got, &s), PST_DECODE_BAD);
      assert_int_equal(decode_counted(kinds[k].type, fixed, at, n + 1, n * item + item - 1, &got, &s), PST_DECODE_BAD);
      /* the largest count: rejected, without allocating for it */
      assert_int_equal(decode_counted(kinds[k].type, fixed, at, UINT32_MAX, n * item, &got, &s), PST_DECODE_BAD);
      /* bytes past the items (a later version's fields): ignored */
      assert_int_equal(decode_counted(kinds[k].type, fixed, at, n, n * item + 5, &got, &s), PST_DECODE_OK);
    }
    /* a payload shorter than the fixed fields, and a length past what is there */
    assert_int_equal(decode_counted(kinds[k].type, fixed - 1, at - 4, 0, 0, &got, &s), PST_DECODE_BAD);
    uint8_t hdr[PST_RECORD_HEADER_SIZE + 24] = { 0 };
    const uint32_t past = fixed + 1;
    memcpy(hdr, &kinds[k].type, 2);
    memcpy(hdr + 4, &past, 4);
    size_t used;
    assert_int_equal(pst_decode_record(hdr, PST_RECORD_HEADER_SIZE + fixed, &got, &used, &s), PST_DECODE_BAD);
  }
  free(s.frames);
  free(s.ptrs);
}

static void test_foreign_files(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = test_read_file(small_trace(), &size);
  const char *path = test_trace_path("foreign");
  struct trace_read t;

  test_write_file(path, "#!/bin/sh\necho hello, this is not a trace\n", 42);
  assert_false(test_trace_read(path, &t));
  assert_non_null(strstr(t.error, "not a psshim trace"));

  const uint32_t v3 = 3;
  memcpy(data + 8, &v3, 4);
  test_write_file(path, data, size);
  assert_false(test_trace_read(path, &t));
  assert_non_null(strstr(t.error, "version 3 not supported (this tool reads 1)"));

  test_write_file(path, "", 0);
  assert_false(test_trace_read(path, &t));
  assert_non_null(strstr(t.error, "truncated at byte 0"));

  assert_false(test_trace_read("/nonexistent/x.trace", &t));
  assert_non_null(strstr(t.error, "No such file"));
  free(data);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_truncated_everywhere),
    cmocka_unit_test(test_random_corruption),
    cmocka_unit_test(test_corruption_behind_checksums),
    cmocka_unit_test(test_corrupt_record_in_a_sound_block),
    cmocka_unit_test(test_reads_past_a_bad_block),
    cmocka_unit_test(test_block_longer_than_max_refused),
    cmocka_unit_test(test_foreign_files),
    cmocka_unit_test(test_iteration_without_pager_totals),
    cmocka_unit_test(test_counts_against_length),
  };
  return cmocka_run_group_tests(tests, NULL, test_trace_remove_all);
}
