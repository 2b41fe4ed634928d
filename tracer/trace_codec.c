/* The trace file's byte layout: checksums, file and block headers, records. */
#include "tracer/trace_codec.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the trace is little-endian and encoded by memcpy");

/* CRC-32 (IEEE 802.3, reflected 0xEDB88320): a fixed table, so no init race in the host
 * process. */
static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

uint32_t pst_crc32(const void *data, size_t n) {
  const uint8_t *p = data;
  uint32_t c = 0xFFFFFFFFu;
  while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/* ---- little helpers: a cursor that writes or reads fixed-width fields ---- */
#define PUT(p, v) do { __typeof__(v) v_ = (v); memcpy((p), &v_, sizeof v_); (p) += sizeof v_; } while (0)
#define GET(p, v) do { memcpy(&(v), (p), sizeof(v)); (p) += sizeof(v); } while (0)

void pst_encode_file_header(const struct pst_trace_header *h, uint8_t out[PST_FILE_HEADER_SIZE]) {
  uint8_t *p = out;
  memcpy(p, PST_TRACE_MAGIC, 8);
  p += 8;
  PUT(p, (uint32_t)PST_TRACE_VERSION);
  PUT(p, (uint32_t)PST_FILE_HEADER_SIZE);
  PUT(p, h->pid);
  PUT(p, h->chunk_size);
  PUT(p, h->gpu_budget);
  PUT(p, h->host_budget);
  memset(p, 0, PST_DEVICE_NAME_MAX);
  memcpy(p, h->device, strnlen(h->device, PST_DEVICE_NAME_MAX - 1));
  p += PST_DEVICE_NAME_MAX;
  PUT(p, h->space_base);
  PUT(p, h->space_size);
  PUT(p, h->start_ns);
  PUT(p, h->wall_ns);
  PUT(p, pst_crc32(out, (size_t)(p - out)));
}

void pst_decode_file_header(const uint8_t *in, struct pst_trace_header *h) {
  const uint8_t *p = in + 8;
  uint32_t size;
  memset(h, 0, sizeof *h);
  GET(p, h->version);
  GET(p, size);
  GET(p, h->pid);
  GET(p, h->chunk_size);
  GET(p, h->gpu_budget);
  GET(p, h->host_budget);
  memcpy(h->device, p, PST_DEVICE_NAME_MAX);
  h->device[PST_DEVICE_NAME_MAX - 1] = '\0';
  p += PST_DEVICE_NAME_MAX;
  GET(p, h->space_base);
  GET(p, h->space_size);
  GET(p, h->start_ns);
  GET(p, h->wall_ns);
}

void pst_encode_block_header(uint8_t out[PST_BLOCK_HEADER_SIZE], const uint8_t *payload,
                             uint32_t len) {
  uint8_t *p = out;
  PUT(p, (uint32_t)PST_BLOCK_MAGIC);
  PUT(p, len);
  PUT(p, pst_crc32(payload, len));
  PUT(p, pst_crc32(out, 12));
}

bool pst_decode_block_header(const uint8_t in[PST_BLOCK_HEADER_SIZE], uint32_t *len,
                             uint32_t *crc) {
  const uint8_t *p = in;
  uint32_t magic, hcrc;
  GET(p, magic);
  GET(p, *len);
  GET(p, *crc);
  GET(p, hcrc);
  return magic == PST_BLOCK_MAGIC && hcrc == pst_crc32(in, 12) && *len <= PST_BLOCK_MAX;
}

/* ---- records ---- */

/* Each type's fixed fields in file order, as (where in struct pst_record, how many bytes):
 * one list that the encoder and the decoder both walk. PAD is 4 zero bytes in the file. */
struct field {
  uint16_t at, size;
};
#define PAD UINT16_MAX
#define F(member) {offsetof(struct pst_record, member), sizeof(((struct pst_record *)0)->member)}

static const struct field string_fields[] = {F(string.id)};
static const struct field stack_fields[] = {F(stack.id), F(stack.depth)};
static const struct field alloc_fields[] = {F(alloc.addr),  F(alloc.size),  F(alloc.stream),
                                            F(alloc.stack), F(alloc.chunk), F(alloc.placement)};
static const struct field free_fields[] = {F(free.addr), F(free.stream)};
static const struct field chunk_fields[] = {F(chunk.id), F(chunk.event), F(chunk.base), F(chunk.size)};
static const struct field launch_fields[] = {F(launch.stream), F(launch.seq), F(launch.function), F(launch.n)};
static const struct field copy_fields[] = {F(copy.kind),   {PAD, 4},          F(copy.bytes),   F(copy.src),
                                           F(copy.dst),    F(copy.stream),    F(copy.start_ns), F(copy.end_ns)};
static const struct field migration_fields[] = {F(migration.chunk), F(migration.direction), F(migration.reason),
                                                F(migration.bytes), F(migration.start_ns),  F(migration.end_ns)};
static const struct field sync_fields[] = {F(sync.what), {PAD, 4}, F(sync.stream)};
static const struct field sample_fields[] = {F(sample.gpu_chunk_bytes), F(sample.host_chunk_bytes),
                                             F(sample.nonmodel_gpu_bytes), F(sample.device_free_bytes)};
static const struct field iteration_fields[] = {F(iteration.iteration), F(iteration.period)};
/* The pager's totals, appended to version 1's ITERATION record: its variable tail. */
static const struct field pager_fields[] = {F(iteration.pager_ns), F(iteration.turns_ns), F(iteration.late_waits),
                                            F(iteration.late_wait_ns)};

#define NFIELDS(list) (sizeof list / sizeof list[0])
#define FIELDS(list) {list, NFIELDS(list)}
static const struct {
  const struct field *f;
  size_t n;
} fixed_fields[PST_REC_TYPE_COUNT] = {
    [PST_REC_STRING] = FIELDS(string_fields),   [PST_REC_STACK] = FIELDS(stack_fields),
    [PST_REC_ALLOC] = FIELDS(alloc_fields),     [PST_REC_FREE] = FIELDS(free_fields),
    [PST_REC_CHUNK] = FIELDS(chunk_fields),     [PST_REC_LAUNCH] = FIELDS(launch_fields),
    [PST_REC_COPY] = FIELDS(copy_fields),       [PST_REC_MIGRATION] = FIELDS(migration_fields),
    [PST_REC_SYNC] = FIELDS(sync_fields),       [PST_REC_SAMPLE] = FIELDS(sample_fields),
    [PST_REC_ITERATION] = FIELDS(iteration_fields), /* NOTE and END: none */
};

static size_t fields_bytes(const struct field *f, size_t n) {
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) bytes += f[i].size;
  return bytes;
}

/* Fixed payload bytes of a type; the variable tail is added by var_bytes. */
static size_t fixed_size(unsigned type) {
  return fields_bytes(fixed_fields[type].f, fixed_fields[type].n);
}

static uint8_t *put_fields(uint8_t *p, const struct pst_record *r, const struct field *f, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (f[i].at == PAD)
      memset(p, 0, f[i].size);
    else
      memcpy(p, (const uint8_t *)r + f[i].at, f[i].size);
    p += f[i].size;
  }
  return p;
}

static const uint8_t *get_fields(const uint8_t *p, struct pst_record *r, const struct field *f, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (f[i].at != PAD)
      memcpy((uint8_t *)r + f[i].at, p, f[i].size);
    p += f[i].size;
  }
  return p;
}

static size_t var_bytes(const struct pst_record *r) {
  switch (r->type) {
  case PST_REC_STRING: return r->string.len;
  case PST_REC_STACK: return (size_t)r->stack.depth * 16;
  case PST_REC_LAUNCH: return (size_t)r->launch.n * 8;
  case PST_REC_NOTE: return r->note.len;
  case PST_REC_ITERATION: return fields_bytes(pager_fields, NFIELDS(pager_fields));
  default: return 0;
  }
}

size_t pst_record_size(const struct pst_record *r) {
  return PST_RECORD_HEADER_SIZE + fixed_size(r->type) + var_bytes(r);
}

size_t pst_encode_record(const struct pst_record *r, uint8_t *out) {
  uint8_t *p = out;
  const uint32_t payload = (uint32_t)(fixed_size(r->type) + var_bytes(r));
  PUT(p, r->type);
  PUT(p, r->flags);
  PUT(p, payload);
  PUT(p, r->ts_ns);
  PUT(p, r->tid);
  p = put_fields(p, r, fixed_fields[r->type].f, fixed_fields[r->type].n);
  switch (r->type) { /* the variable tails */
  case PST_REC_STRING:
    memcpy(p, r->string.text, r->string.len);
    p += r->string.len;
    break;
  case PST_REC_STACK:
    for (uint32_t i = 0; i < r->stack.depth; i++) {
      PUT(p, r->stack.frames[i].pc);
      PUT(p, r->stack.frames[i].symbol);
      PUT(p, r->stack.frames[i].offset);
    }
    break;
  case PST_REC_LAUNCH:
    memcpy(p, r->launch.ptrs, (size_t)r->launch.n * 8);
    p += (size_t)r->launch.n * 8;
    break;
  case PST_REC_ITERATION:
    p = put_fields(p, r, pager_fields, NFIELDS(pager_fields));
    break;
  case PST_REC_NOTE:
    memcpy(p, r->note.text, r->note.len);
    p += r->note.len;
    break;
  default:
    break;
  }
  return (size_t)(p - out);
}

/* Makes room for n items in a scratch array; false if memory ran out. */
static bool grow(void **arr, size_t *cap, size_t n, size_t item) {
  if (n <= *cap) return true;
  size_t c = *cap ? *cap : 64;
  while (c < n) c *= 2;
  void *a = realloc(*arr, c * item);
  if (!a) return false;
  *arr = a;
  *cap = c;
  return true;
}

enum pst_decode_result pst_decode_record(const uint8_t *in, size_t avail, struct pst_record *r,
                                         size_t *used, struct pst_decode_scratch *s) {
  const uint8_t *p = in;
  uint32_t len;
  if (avail < PST_RECORD_HEADER_SIZE) return PST_DECODE_BAD;
  memset(r, 0, sizeof *r);
  GET(p, r->type);
  GET(p, r->flags);
  GET(p, len);
  GET(p, r->ts_ns);
  GET(p, r->tid);
  if (len > avail - PST_RECORD_HEADER_SIZE) return PST_DECODE_BAD;
  *used = PST_RECORD_HEADER_SIZE + (size_t)len;
  if (r->type == 0 || r->type >= PST_REC_TYPE_COUNT) return PST_DECODE_UNKNOWN;
  const size_t fixed = fixed_size(r->type);
  if (len < fixed) return PST_DECODE_BAD;
  const size_t tail = len - fixed; /* bytes after the fixed fields */
  p = get_fields(p, r, fixed_fields[r->type].f, fixed_fields[r->type].n);
  switch (r->type) { /* the variable tails */
  case PST_REC_STRING:
    r->string.len = (uint32_t)tail;
    r->string.text = (const char *)p;
    break;
  case PST_REC_STACK:
    if (r->stack.depth > tail / 16) return PST_DECODE_BAD;
    if (!grow((void **)&s->frames, &s->frames_cap, r->stack.depth, sizeof *s->frames))
      return PST_DECODE_BAD;
    for (uint32_t i = 0; i < r->stack.depth; i++) {
      GET(p, s->frames[i].pc);
      GET(p, s->frames[i].symbol);
      GET(p, s->frames[i].offset);
    }
    r->stack.frames = s->frames;
    break;
  case PST_REC_LAUNCH:
    if (r->launch.n > tail / 8) return PST_DECODE_BAD;
    if (!grow((void **)&s->ptrs, &s->ptrs_cap, r->launch.n, sizeof *s->ptrs))
      return PST_DECODE_BAD;
    if (r->launch.n) /* none: the scratch may not exist yet, and memcpy wants a real pointer */
      memcpy(s->ptrs, p, (size_t)r->launch.n * 8);
    r->launch.ptrs = s->ptrs;
    break;
  case PST_REC_ITERATION:
    r->iteration.has_pager = tail >= fields_bytes(pager_fields, NFIELDS(pager_fields));
    if (r->iteration.has_pager)
      get_fields(p, r, pager_fields, NFIELDS(pager_fields));
    break;
  case PST_REC_NOTE:
    r->note.len = (uint32_t)tail;
    r->note.text = (const char *)p;
    break;
  default:
    break;
  }
  return PST_DECODE_OK;
}
