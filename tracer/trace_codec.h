/* Private to tracer/: the byte layout of the trace file, in one place for writer and
 * reader. See tracer.h for the format itself. */
#ifndef PSSHIM_TRACE_CODEC_H
#define PSSHIM_TRACE_CODEC_H

#include "tracer/tracer.h"

/* 8 magic + 4 version + 4 size + 4 pid + 3x8 sizes + 64 device + 4x8 + 4 crc */
#define PST_FILE_HEADER_SIZE 144u

uint32_t pst_crc32(const void *data, size_t n);

void pst_encode_file_header(const struct pst_trace_header *h, uint8_t out[PST_FILE_HEADER_SIZE]);
/* Decodes the fixed part (the first PST_FILE_HEADER_SIZE bytes). The caller has checked
 * magic and version and verified the crc over header_size bytes. */
void pst_decode_file_header(const uint8_t *in, struct pst_trace_header *h);

void pst_encode_block_header(uint8_t out[PST_BLOCK_HEADER_SIZE], const uint8_t *payload,
                             uint32_t len);
/* True when the 16 bytes are a block header whose own crc holds; *len and *crc then hold
 * the payload's length and checksum. */
bool pst_decode_block_header(const uint8_t in[PST_BLOCK_HEADER_SIZE], uint32_t *len,
                             uint32_t *crc);

/* Encoded size of r (header included), with launch pointers already deduplicated. */
size_t pst_record_size(const struct pst_record *r);
/* Writes r at out (room for pst_record_size(r) bytes); returns the bytes written. */
size_t pst_encode_record(const struct pst_record *r, uint8_t *out);

/* Growable arrays the decoder fills for STACK frames and LAUNCH pointers. */
struct pst_decode_scratch {
  struct pst_frame *frames;
  uint64_t *ptrs;
  size_t frames_cap, ptrs_cap;
};
enum pst_decode_result { PST_DECODE_OK, PST_DECODE_UNKNOWN, PST_DECODE_BAD };
/* Decodes the record at in[0..avail). *used is its full length (also for UNKNOWN, so the
 * caller can skip it). BAD: the record's length or content does not fit its type. */
enum pst_decode_result pst_decode_record(const uint8_t *in, size_t avail, struct pst_record *out,
                                         size_t *used, struct pst_decode_scratch *s);

#endif
