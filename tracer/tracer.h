/* tracer/ — the trace file: its format, the writer and the reader. Observation of the
 * process (CUPTI) has its own header, tracer/observe.h.
 *
 * No CUDA header here: pointers and streams are uint64_t, so the report tool and the
 * unit tests build on any machine. */
#ifndef PSSHIM_TRACER_H
#define PSSHIM_TRACER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Format, version 1. Little-endian, no padding, every integer at its stated width.
 *
 *   file header   "PSSHIMTR" | u32 version | u32 header_size | fields below | u32 crc32
 *                 (crc over every byte before it; header_size counts all of it, so
 *                 fields appended to the header within version 1 are skipped; a file of
 *                 any other version is refused)
 *     u32 pid | u64 chunk_size | u64 gpu_budget | u64 host_budget | char device[64]
 *     | u64 space_base | u64 space_size | u64 start_ns (CLOCK_MONOTONIC) | u64 wall_ns
 *     (CLOCK_REALTIME at the same moment, to date the run)
 *   blocks        u32 "PSTB" | u32 payload_len | u32 crc32(payload) | u32 crc32(first 12
 *                 bytes), then payload_len bytes of whole records (payload_len <=
 *                 PST_BLOCK_MAX). A torn tail or a damaged block is detected by its
 *                 checksums; blocks before it stay readable, and the reader finds the
 *                 next good block by its magic and header crc.
 *   record        u16 type | u16 flags | u32 payload_len | u64 ts_ns (CLOCK_MONOTONIC) |
 *                 u32 tid, then the payload. An unknown type is skipped by its length; a
 *                 known type with a longer payload than listed is read for the fields
 *                 listed and the rest ignored, except STRING and NOTE, whose text is all
 *                 the rest (a field appended to those needs a new version).
 *     STRING    u32 id | text (payload_len - 4 bytes, no NUL)        ids start at 1; 0 = none
 *     STACK     u32 id | u32 depth | depth x (u64 pc | u32 symbol string id | u32 pc -
 *               symbol start). The symbol is the function name dladdr found, else the
 *               module's file name in brackets with the offset from the module's base.
 *     ALLOC     u64 addr | u64 size | u64 stream | u32 stack id | u32 chunk id | u32 placement
 *     FREE      u64 addr | u64 stream
 *     CHUNK     u32 chunk id | u32 event | u64 base | u64 size
 *     LAUNCH    u64 stream | u64 seq | u32 function string id | u32 n | n x u64 pointer
 *               (sorted, unique; flag PST_RF_TRUNCATED when more than PST_LAUNCH_MAX_PTRS)
 *     COPY      u32 kind | u32 0 | u64 bytes | u64 src | u64 dst | u64 stream | u64 start_ns
 *               | u64 end_ns
 *     MIGRATION u32 chunk id | u16 direction | u16 reason | u64 bytes | u64 start_ns | u64 end_ns
 *     SYNC      u32 what | u32 0 | u64 stream
 *     SAMPLE    u64 gpu chunk bytes | u64 host chunk bytes | u64 non-model GPU bytes | u64
 *               device free bytes
 *     ITERATION u64 iteration | u64 period in launches (0 = not known yet), then (appended;
 *               absent in older traces) the pager's totals so far, summed over devices:
 *               u64 pager_ns (the launching threads' time in the pager, waits for
 *               their moments included) | u64 turns_ns (the moves' host time, on
 *               whichever thread makes them) | u64 late_waits | u64 late_wait_ns (launches that
 *               reached a chunk mid-remap, and their wait)
 *     NOTE      text (payload_len bytes, no NUL)
 *     END       (empty) written by a clean close; its absence means the process died.
 *
 * Strings and stacks always come before the first record that names them (the writer
 * flushes them first), so a reader may resolve ids as it streams. Records of different
 * threads are not in time order across blocks: sort by ts_ns when order matters. */

#define PST_TRACE_MAGIC "PSSHIMTR"
#define PST_TRACE_VERSION 1u
#define PST_BLOCK_MAGIC 0x42545350u /* "PSTB" */
#define PST_BLOCK_HEADER_SIZE 16u
#define PST_BLOCK_MAX (4u << 20)
#define PST_RECORD_HEADER_SIZE 20u
#define PST_DEVICE_NAME_MAX 64u
#define PST_LAUNCH_MAX_PTRS 512u
#define PST_NOTE_MAX 1024u
#define PST_STACK_MAX_DEPTH 32u
#define PST_NO_CHUNK UINT32_MAX

enum pst_record_type {
  PST_REC_STRING = 1,
  PST_REC_STACK,
  PST_REC_ALLOC,
  PST_REC_FREE,
  PST_REC_CHUNK,
  PST_REC_LAUNCH,
  PST_REC_COPY,
  PST_REC_MIGRATION,
  PST_REC_SYNC,
  PST_REC_SAMPLE,
  PST_REC_ITERATION,
  PST_REC_NOTE,
  PST_REC_END,
  PST_REC_TYPE_COUNT
};
enum { PST_RF_TRUNCATED = 1 }; /* record flags */

enum pst_placement { PST_PLACE_GPU = 0, PST_PLACE_HOST = 1 };
enum pst_chunk_event {
  PST_CHUNK_CREATED = 0, PST_CHUNK_FRAME_GPU, PST_CHUNK_FRAME_HOST, PST_CHUNK_RELEASED
};
enum pst_copy_kind { PST_COPY_H2D = 0, PST_COPY_D2H, PST_COPY_D2D, PST_COPY_MEMSET };
enum pst_direction { PST_DIR_H2D = 0, PST_DIR_D2H = 1 };
enum pst_reason { PST_REASON_PREFETCH = 0, PST_REASON_EVICT, PST_REASON_DEMAND };
enum pst_sync_what { PST_SYNC_DEVICE = 0, PST_SYNC_STREAM, PST_SYNC_EVENT };

struct pst_trace_header {
  uint32_t version;     /* filled by the writer */
  uint32_t pid;         /* 0: the writer fills getpid() */
  uint64_t chunk_size, gpu_budget, host_budget;
  char device[PST_DEVICE_NAME_MAX]; /* NUL-terminated (truncated to fit) */
  uint64_t space_base, space_size;  /* the chunk-space VA reservation */
  uint64_t start_ns, wall_ns;       /* 0: the writer fills them at open */
};

struct pst_frame {
  uint64_t pc;
  uint32_t symbol; /* string id, 0 = unknown */
  uint32_t offset;
};

/* One record. The writer takes it by pointer (ts_ns 0 = now; tid is always the caller's);
 * the reader fills it, and its pointers stay valid until the next pst_reader_next. */
struct pst_record {
  uint16_t type, flags;
  uint32_t tid;
  uint64_t ts_ns;
  union {
    struct { uint32_t id, len; const char *text; } string;
    struct { uint32_t id, depth; const struct pst_frame *frames; } stack;
    struct { uint64_t addr, size, stream; uint32_t stack, chunk, placement; } alloc;
    struct { uint64_t addr, stream; } free;
    struct { uint32_t id, event; uint64_t base, size; } chunk;
    struct { uint64_t stream, seq; uint32_t function, n; const uint64_t *ptrs; } launch;
    struct { uint32_t kind; uint64_t bytes, src, dst, stream, start_ns, end_ns; } copy;
    struct { uint32_t chunk; uint16_t direction, reason; uint64_t bytes, start_ns, end_ns; } migration;
    struct { uint32_t what; uint64_t stream; } sync;
    struct { uint64_t gpu_chunk_bytes, host_chunk_bytes, nonmodel_gpu_bytes, device_free_bytes; } sample;
    struct {
      uint64_t iteration, period;
      bool has_pager; /* the totals below were recorded (reader); the writer always writes them */
      uint64_t pager_ns, turns_ns, late_waits, late_wait_ns;
    } iteration;
    struct { uint32_t len; const char *text; } note; /* writer: len 0 = strlen(text) */
  };
};

/* ---- writer ----
 * One trace per process. Each thread appends to its own mmap'd ring (no malloc and no lock
 * when emitting); a background thread drains the rings every ~100 ms into checksummed
 * blocks. A full ring drops records (counted, and reported in a NOTE at close) rather than
 * grow. A crash loses at most what the rings held since the last flush; the file before it
 * stays readable. After fork() the child stops tracing (the parent's file is untouched);
 * it may open a trace of its own. Errors: one line on stderr, "psshim: ...". */

/* Creates path (truncating it) and starts the flush thread. False after one stderr line. */
bool pst_trace_open(const char *path, const struct pst_trace_header *h);
bool pst_trace_enabled(void);
/* Appends one record of any type but STRING, STACK and END (those are the writer's).
 * Lock-free and malloc-free; not async-signal-safe (a handler must not emit). */
void pst_trace_emit(const struct pst_record *r);
/* Id of s, written to the trace the first time it is seen; 0 if tracing is off or full. */
uint32_t pst_trace_intern(const char *s);
/* Id of the calling thread's stack, starting skip frames above the caller. Captures
 * return addresses only; symbols are looked up at flush time. 0 if off or full. */
uint32_t pst_trace_stack_here(int skip);
/* Writes what the rings hold now (the flush thread does this every ~100 ms). It looks up
 * stack symbols with dladdr: do not call it with the dynamic loader's lock held. */
void pst_trace_flush(void);
/* Flushes, writes the drop NOTE and END, and closes the file. Safe to call when closed. */
void pst_trace_close(void);

/* ---- reader ----
 * Streams a trace block by block in bounded memory. Damage does not stop it: a corrupt
 * block is skipped (the reader resumes at the next good block), a torn tail ends the read;
 * pst_reader_stats tells what was lost and pst_reader_error names the first problem. */
struct pst_reader;
struct pst_read_stats {
  uint64_t file_bytes, good_bytes, lost_bytes;
  uint64_t blocks, bad_blocks, records, unknown_records;
  bool torn_tail, clean_end;
};
/* NULL with a message in err when the file cannot be read at all (missing, not a trace,
 * an unsupported version, a damaged or truncated file header). */
struct pst_reader *pst_reader_open(const char *path, char *err, size_t errlen);
const struct pst_trace_header *pst_reader_header(const struct pst_reader *rd);
/* Next record into *out; false at the end of what is readable. */
bool pst_reader_next(struct pst_reader *rd, struct pst_record *out);
/* The first problem met so far ("corrupt block at byte N", "truncated at byte N ..."),
 * or NULL when everything read so far was whole. */
const char *pst_reader_error(const struct pst_reader *rd);
struct pst_read_stats pst_reader_stats(const struct pst_reader *rd);
void pst_reader_close(struct pst_reader *rd);

/* Sorts v[0..n) and removes repeats in place; returns the new count. O(n) when v is
 * already strictly increasing, as launch pointers usually are. */
uint32_t pst_sort_unique(uint64_t *v, uint32_t n);

/* Names for reports and messages ("ALLOC", "h2d", "prefetch", ...); "?" if out of range. */
const char *pst_record_type_name(unsigned type);
const char *pst_copy_kind_name(unsigned kind);
const char *pst_direction_name(unsigned dir);
const char *pst_reason_name(unsigned reason);
const char *pst_chunk_event_name(unsigned event);
const char *pst_sync_what_name(unsigned what);

#endif
