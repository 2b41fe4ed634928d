/* The trace reader: streams blocks, checks every checksum, and reads on past damage. */
#include "tracer/tracer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tracer/trace_codec.h"

struct pst_reader {
  int fd;
  uint64_t off; /* file offset of the next block */
  bool done;
  struct pst_trace_header hdr;
  uint8_t *buf; /* the current block's payload */
  size_t len, pos;
  uint64_t buf_off; /* file offset of buf[0] */
  struct pst_decode_scratch scratch;
  struct pst_read_stats st;
  char err[200];
};

static void fail(struct pst_reader *rd, const char *fmt, ...) {
  if (rd->err[0]) return; /* keep the first problem: later ones often follow from it */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rd->err, sizeof rd->err, fmt, ap);
  va_end(ap);
}

/* pread until n bytes or the end of the file; returns the bytes read. */
static size_t read_at(int fd, void *p, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

static struct pst_reader *open_error(struct pst_reader *rd, char *err, size_t errlen,
                                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  pst_reader_close(rd);
  return NULL;
}

struct pst_reader *pst_reader_open(const char *path, char *err, size_t errlen) {
  struct pst_reader *rd = calloc(1, sizeof *rd);
  if (!rd) return open_error(NULL, err, errlen, "%s: out of memory", path);
  rd->fd = -1;
  rd->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (rd->fd < 0) return open_error(rd, err, errlen, "%s: %s", path, strerror(errno));
  struct stat sb = { 0 };
  if (fstat(rd->fd, &sb) == 0) rd->st.file_bytes = (uint64_t)sb.st_size;
  /* A directory opens, and every read of it fails: say so rather than "truncated at byte 0". */
  if (S_ISDIR(sb.st_mode)) return open_error(rd, err, errlen, "%s: is a directory, not a trace file", path);
  uint8_t fixed[PST_FILE_HEADER_SIZE];
  const size_t got = read_at(rd->fd, fixed, sizeof fixed, 0);
  const size_t magic_seen = got < 8 ? got : 8;
  if (memcmp(fixed, PST_TRACE_MAGIC, magic_seen) != 0)
    return open_error(rd, err, errlen, "%s: not a psshim trace (it does not start with %s)", path,
                      PST_TRACE_MAGIC);
  uint32_t version = 0, size = 0;
  if (got >= 16) {
    memcpy(&version, fixed + 8, 4);
    memcpy(&size, fixed + 12, 4);
    if (version != PST_TRACE_VERSION)
      return open_error(rd, err, errlen, "%s: version %u not supported (this tool reads %u)",
                        path, version, PST_TRACE_VERSION);
    if (size < PST_FILE_HEADER_SIZE || size > 65536)
      return open_error(rd, err, errlen, "%s: corrupt file header (size %u)", path, size);
  }
  if (got < sizeof fixed || rd->st.file_bytes < size)
    return open_error(rd, err, errlen, "%s: truncated at byte %llu (in the file header)", path,
                      (unsigned long long)(got < sizeof fixed ? got : rd->st.file_bytes));
  /* The crc covers the header's first size - 4 bytes, fields appended within version 1 included. */
  uint8_t *whole = malloc(size);
  if (!whole) return open_error(rd, err, errlen, "%s: out of memory", path);
  const size_t all = read_at(rd->fd, whole, size, 0);
  uint32_t crc = 0;
  if (all == size) memcpy(&crc, whole + size - 4, 4);
  const bool ok = all == size && crc == pst_crc32(whole, size - 4);
  free(whole);
  if (all < size)
    return open_error(rd, err, errlen, "%s: truncated at byte %zu (in the file header)", path, all);
  if (!ok) return open_error(rd, err, errlen, "%s: corrupt file header (checksum mismatch)", path);
  pst_decode_file_header(fixed, &rd->hdr);
  rd->buf = malloc(PST_BLOCK_MAX);
  if (!rd->buf) return open_error(rd, err, errlen, "%s: out of memory", path);
  rd->off = size;
  rd->st.good_bytes = size;
  return rd;
}

const struct pst_trace_header *pst_reader_header(const struct pst_reader *rd) {
  return &rd->hdr;
}

/* After a block header that is not one: the next offset past `from` where a valid block
 * header starts, or the end of the file. */
static uint64_t resync(struct pst_reader *rd, uint64_t from) {
  enum { WINDOW = 1 << 16 };
  uint8_t *w = rd->buf; /* free while no block is loaded */
  for (uint64_t at = from;;) {
    const size_t got = read_at(rd->fd, w, WINDOW + PST_BLOCK_HEADER_SIZE, at);
    if (got < PST_BLOCK_HEADER_SIZE) return at + got;
    for (size_t i = 0; i + PST_BLOCK_HEADER_SIZE <= got; i++) {
      uint32_t len, crc;
      if (w[i] == (PST_BLOCK_MAGIC & 0xFF) && pst_decode_block_header(w + i, &len, &crc))
        return at + i;
    }
    at += got - PST_BLOCK_HEADER_SIZE + 1;
  }
}

/* Loads the next good block into buf; false at the end of what is readable. */
static bool load_block(struct pst_reader *rd) {
  while (!rd->done) {
    uint8_t h[PST_BLOCK_HEADER_SIZE];
    uint32_t len, crc;
    const uint64_t at = rd->off;
    const size_t got = read_at(rd->fd, h, sizeof h, at);
    if (got == 0) break;
    if (got < sizeof h) {
      fail(rd, "truncated at byte %llu: the block that starts at byte %llu is incomplete",
           (unsigned long long)(at + got), (unsigned long long)at);
      rd->st.lost_bytes += got;
      rd->st.torn_tail = true;
      break;
    }
    if (!pst_decode_block_header(h, &len, &crc)) {
      fail(rd, "corrupt block at byte %llu", (unsigned long long)at);
      rd->st.bad_blocks++;
      rd->off = resync(rd, at + 1);
      rd->st.lost_bytes += rd->off - at;
      continue;
    }
    const size_t body = read_at(rd->fd, rd->buf, len, at + sizeof h);
    if (body < len) {
      fail(rd, "truncated at byte %llu: the block that starts at byte %llu is incomplete",
           (unsigned long long)(at + sizeof h + body), (unsigned long long)at);
      rd->st.lost_bytes += sizeof h + body;
      rd->st.torn_tail = true;
      break;
    }
    rd->off = at + sizeof h + len;
    if (pst_crc32(rd->buf, len) != crc) {
      fail(rd, "corrupt block at byte %llu (checksum mismatch)", (unsigned long long)at);
      rd->st.bad_blocks++;
      rd->st.lost_bytes += sizeof h + len;
      continue;
    }
    rd->st.blocks++;
    rd->st.good_bytes += sizeof h + len;
    rd->len = len;
    rd->pos = 0;
    rd->buf_off = at + sizeof h;
    return true;
  }
  rd->done = true;
  return false;
}

bool pst_reader_next(struct pst_reader *rd, struct pst_record *out) {
  for (;;) {
    if (rd->pos >= rd->len) {
      rd->len = rd->pos = 0;
      if (!load_block(rd)) return false;
      continue;
    }
    size_t used = 0;
    switch (pst_decode_record(rd->buf + rd->pos, rd->len - rd->pos, out, &used, &rd->scratch)) {
    case PST_DECODE_OK:
      rd->pos += used;
      rd->st.records++;
      if (out->type == PST_REC_END) rd->st.clean_end = true;
      return true;
    case PST_DECODE_UNKNOWN:
      rd->pos += used;
      rd->st.unknown_records++;
      break;
    case PST_DECODE_BAD:
      /* The block's checksum held, so the writer made it: the rest of it is unusable. */
      fail(rd, "corrupt record at byte %llu", (unsigned long long)(rd->buf_off + rd->pos));
      rd->st.lost_bytes += rd->len - rd->pos;
      rd->st.good_bytes -= rd->len - rd->pos;
      rd->pos = rd->len;
      break;
    }
  }
}

const char *pst_reader_error(const struct pst_reader *rd) {
  return rd->err[0] ? rd->err : NULL;
}

struct pst_read_stats pst_reader_stats(const struct pst_reader *rd) {
  return rd->st;
}

void pst_reader_close(struct pst_reader *rd) {
  if (!rd) return;
  if (rd->fd >= 0) close(rd->fd);
  free(rd->buf);
  free(rd->scratch.frames);
  free(rd->scratch.ptrs);
  free(rd);
}
