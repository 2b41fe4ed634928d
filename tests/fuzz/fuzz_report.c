/* libFuzzer target for psshim-report's analyses and renderers on decoded traces: the
 * input's first bytes are the file header's numbers (chunk size, budgets, the chunk space,
 * the start), the rest the records of one block behind sound checksums, so every record
 * reaches the report as the reader decodes it. Then all of what psshim-report does with a
 * trace runs on it: residency, the text summary (phases, DATA MOVE, PAGE-OUTS, MOVES,
 * sites), the accesses, LEAST TRAFFIC, PLAN, chunk-size advice, Perfetto JSON and the HTML
 * page, each written to /dev/null. A crash, an overflow or undefined behaviour fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tools/report.h"
#include "tracer/trace_codec.h"

/* The header's numbers as the input gives them: u64 chunk_size, gpu_budget, host_budget,
 * space_base, space_size, start_ns. */
enum { HEAD = 6 * 8 };

static uint64_t u64_at(const uint8_t *p)
{
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A trace file of the input (header numbers, then one block of records) in a memfd; its
 * path in path. -1 when the input is too short or too long for one. */
static int write_trace(const uint8_t *data, size_t size, char *path, size_t len)
{
  if (size < HEAD || size - HEAD > PST_BLOCK_MAX)
    return -1;
  struct pst_trace_header h = {.pid = 1, .chunk_size = u64_at(data), .gpu_budget = u64_at(data + 8),
                               .host_budget = u64_at(data + 16), .space_base = u64_at(data + 24),
                               .space_size = u64_at(data + 32), .start_ns = u64_at(data + 40),
                               .device = "fuzzed"};
  const uint8_t *records = data + HEAD;
  const size_t n = size - HEAD;
  uint8_t head[PST_FILE_HEADER_SIZE], block[PST_BLOCK_HEADER_SIZE];
  pst_encode_file_header(&h, head);
  pst_encode_block_header(block, records, (uint32_t)n);
  int fd = memfd_create("fuzz_report", 0);
  if (fd < 0)
    return -1;
  if (write(fd, head, sizeof head) != (ssize_t)sizeof head || write(fd, block, sizeof block) != (ssize_t)sizeof block ||
      (n && write(fd, records, n) != (ssize_t)n)) {
    close(fd);
    return -1;
  }
  snprintf(path, len, "/proc/self/fd/%d", fd);
  return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char path[64], err[512];
  const int fd = write_trace(data, size, path, sizeof path);
  if (fd < 0)
    return 0;
  struct rp_trace t;
  if (!rp_load(path, &t, err, sizeof err)) {
    close(fd);
    return 0;
  }
  FILE *null = fopen("/dev/null", "w");
  struct rp_chunks cs;
  struct rp_accesses acc = {0};
  /* Sizes the advice replays: a candidate below, at and above the trace's own chunk. */
  const uint64_t sizes[] = {2u << 20, 4u << 20, 64u << 20};
  const uint64_t budget = t.hdr.gpu_budget ? t.hdr.gpu_budget : 16u << 20;
  bool ok = null && rp_chunks_build(&t, &cs);
  if (ok) {
    ok = rp_accesses_gather(&t, &acc) && rp_text(&t, &cs, &acc, null);
    if (ok)
      ok = rp_least_traffic(&t, &acc, &budget, 1, null) && rp_plan(&t, &acc, RP_DEFAULT_LAG, null) &&
           rp_chunk_advice(&acc, sizes, sizeof sizes / sizeof sizes[0], budget, null);
    if (ok)
      ok = rp_perfetto(&t, "/dev/null") && rp_html(&t, &cs, &acc, "/dev/null");
    rp_accesses_free(&acc);
    rp_chunks_free(&cs);
  }
  (void)ok; /* out of memory on a huge claim is an answer, not a failure */
  if (null)
    fclose(null);
  rp_free(&t);
  close(fd);
  return 0;
}
