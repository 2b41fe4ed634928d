/* libFuzzer target for the trace decoder: the input is read two ways.
 * 1. As records, one after another, each decoded from the input itself (libFuzzer's copy
 *    is exactly the input's size, so a read past a record's end is one past the buffer).
 * 2. As the payload of one block of a trace file whose header and checksums this target
 *    writes, so the reader's own loop (blocks, unknown types, a bad record's rest) runs on
 *    it: damage behind sound checksums, which byte flips of a real file rarely reach.
 * 3. As the blocks of a trace file, behind a sound file header: block headers of the input's
 *    own making (a length field past PST_BLOCK_MAX under a sound header checksum,
 *    corpus/trace/block_too_long) reach the reader's block checks.
 * Every record decoded sound must fit in what it was decoded from. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tracer/trace_codec.h"
#include "tracer/tracer.h"

/* Reads every byte a sound record points at, so ASan sees a pointer past its record. */
static uint64_t touch(const struct pst_record *r)
{
  uint64_t sum = 0;
  switch (r->type) {
  case PST_REC_STRING:
    for (uint32_t i = 0; i < r->string.len; i++) sum += (uint8_t)r->string.text[i];
    break;
  case PST_REC_NOTE:
    for (uint32_t i = 0; i < r->note.len; i++) sum += (uint8_t)r->note.text[i];
    break;
  case PST_REC_LAUNCH:
    for (uint32_t i = 0; i < r->launch.n; i++) sum += r->launch.ptrs[i];
    break;
  case PST_REC_STACK:
    for (uint32_t i = 0; i < r->stack.depth; i++) sum += r->stack.frames[i].pc + r->stack.frames[i].symbol;
    break;
  default:
    break;
  }
  return sum;
}

static void decode_all(const uint8_t *data, size_t size)
{
  struct pst_decode_scratch s = {0};
  struct pst_record r;
  for (size_t pos = 0; pos < size;) {
    size_t used = 0;
    enum pst_decode_result res = pst_decode_record(data + pos, size - pos, &r, &used, &s);
    if (res == PST_DECODE_BAD)
      break;
    if (used < PST_RECORD_HEADER_SIZE || used > size - pos)
      abort(); /* a record longer than what it was read from */
    if (res == PST_DECODE_OK) {
      volatile uint64_t sink = touch(&r);
      (void)sink;
    }
    pos += used;
  }
  free(s.frames);
  free(s.ptrs);
}

/* Writes a sound file header, then (when `wrap`) a sound block header for data, then data,
 * and reads the file to its end. */
static void read_as_file(const uint8_t *data, size_t size, bool wrap)
{
  if (wrap && size > PST_BLOCK_MAX)
    return;
  int fd = memfd_create("fuzz_trace", 0);
  if (fd < 0)
    return;
  struct pst_trace_header h = {.pid = 1, .chunk_size = 2u << 20};
  uint8_t head[PST_FILE_HEADER_SIZE], block[PST_BLOCK_HEADER_SIZE];
  pst_encode_file_header(&h, head);
  pst_encode_block_header(block, data, (uint32_t)size);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  if (write(fd, head, sizeof head) == (ssize_t)sizeof head &&
      (!wrap || write(fd, block, sizeof block) == (ssize_t)sizeof block) &&
      (size == 0 || write(fd, data, size) == (ssize_t)size)) {
    char err[256];
    struct pst_reader *rd = pst_reader_open(path, err, sizeof err);
    if (!rd)
      abort(); /* the header is sound: it must open */
    struct pst_record r;
    while (pst_reader_next(rd, &r)) {
      volatile uint64_t sink = touch(&r);
      (void)sink;
    }
    struct pst_read_stats st = pst_reader_stats(rd);
    if (st.good_bytes + st.lost_bytes != st.file_bytes)
      abort(); /* every byte is counted once, good or lost */
    pst_reader_close(rd);
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  decode_all(data, size);
  read_as_file(data, size, true);
  read_as_file(data, size, false);
  return 0;
}
