/* psshim-report's model of a trace, and the outputs drawn from it. */
#ifndef PSSHIM_REPORT_H
#define PSSHIM_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "policy/policy.h"
#include "tracer/tracer.h"

/* A trace read whole, events sorted by time (file order among equal times). */
struct rp_stack {
  uint32_t depth;
  struct pst_frame *frames;
};

struct rp_trace {
  const char *path;
  struct pst_trace_header hdr;
  struct pst_read_stats stats;
  char error[256]; /* the reader's first problem, "" if none */
  char **strings;  /* by id; NULL where never defined */
  size_t nstrings;
  struct rp_stack *stacks; /* by id */
  size_t nstacks;
  struct pst_record *ev; /* everything but STRING and STACK; own copies of arrays, texts */
  size_t nev;
  uint64_t t0, t1;       /* start (the header's) and the last timestamp seen */
};

/* Reads path. False (with a message in err) when it cannot be read at all; otherwise the
 * trace holds what was readable and t->error says what was not. */
bool rp_load(const char *path, struct rp_trace *t, char *err, size_t errlen);
void rp_free(struct rp_trace *t);
const char *rp_string(const struct rp_trace *t, uint32_t id); /* "?" when unknown */
/* The run's settings as the library recorded them at the trace's start (a NOTE that opens
 * with RP_SETTINGS): "policy auto; given: PSSHIM_GPU_BUDGET=24G ...", after the prefix;
 * NULL in a trace without one. */
#define RP_SETTINGS "settings: "
const char *rp_settings(const struct rp_trace *t);

/* ---- derived: chunk residency, computed once and shared by text and HTML ---- */
enum rp_where { RP_NONE = 0, RP_GPU, RP_HOST };
struct rp_span { uint64_t from, to; uint8_t where; };
struct rp_chunk {
  uint32_t id;
  uint64_t size;
  struct rp_span *spans; /* consecutive, from first sight to release or the trace's end */
  size_t nspans;
  uint64_t gpu_ns, host_ns;
  uint64_t ins, outs, bytes_in, bytes_out;
};
struct rp_chunks {
  struct rp_chunk *c; /* sorted by id */
  size_t n;
};
/* From CHUNK frame events, and MIGRATION ends where a chunk has no frame events. */
bool rp_chunks_build(const struct rp_trace *t, struct rp_chunks *out);
/* Where chunk id was at time ts (RP_NONE: not mapped then, or never seen). */
enum rp_where rp_chunk_at(const struct rp_chunks *cs, uint32_t id, uint64_t ts);
enum rp_where rp_chunk_where(const struct rp_chunk *c, uint64_t ts); /* of one chunk */
void rp_chunks_free(struct rp_chunks *cs);

/* ---- derived: the steady phase ---- */
/* The run of consecutive ITERATION records with one nonzero period whose marks span the
 * most time: the tracer may first take short stretches of a first step for the iteration
 * (36 and 40 launches on the 2.68B GPT), and a script may end with another loop (an
 * evaluation). Sets *first and *last (indices into t->ev); false when no mark has a period. */
bool rp_steady_marks(const struct rp_trace *t, size_t *first, size_t *last);

/* The laps between consecutive ITERATION marks: what each took and moved. */
enum rp_phase { RP_WARMUP = 0, RP_STEADY, RP_LATER }; /* before, within, after the steady marks */
struct rp_lap {
  size_t mark, end;           /* indices into t->ev of the marks that open and close it */
  uint64_t iteration, period; /* the opening mark's */
  uint64_t from, to;          /* the marks' times */
  uint64_t launches, bytes_in, bytes_out; /* its launches; paged in (h2d) and out (d2h) */
  /* its launches that named a live allocation by its start while some of it was in host
   * frames (rp_in_place), and those bytes: at most what they read across PCIe */
  uint64_t in_place, in_place_bytes;
  /* the pager's, from the marks' totals where both have them (has_pager): the launching
   * threads' time in it, its turns' time, and launches that waited for a remap */
  bool has_pager;
  uint64_t pager_ns, turns_ns, late_waits;
  enum rp_phase phase;
};
struct rp_laps {
  struct rp_lap *l; /* in time order */
  size_t n;
};
/* False (after one line on stderr): out of memory. */
bool rp_laps_build(const struct rp_trace *t, const struct rp_chunks *cs, struct rp_laps *out);
void rp_laps_free(struct rp_laps *laps);

/* ---- derived: kernels reading host frames in place ---- */
/* The bytes of an allocation at addr of size bytes that lie in the trace's chunk space (a
 * damaged size reaches no further than its end); 0 when addr is outside it. */
uint64_t rp_in_space(const struct rp_trace *t, uint64_t addr, uint64_t size);
/* An allocation's (alloc, an ALLOC record) bytes in chunks on the GPU and in host frames
 * at time ts, added to *gpu and *host. */
void rp_split(const struct rp_trace *t, const struct rp_chunks *cs, const struct pst_record *alloc, uint64_t ts,
              uint64_t *gpu, uint64_t *host);
/* Calls fn for each pointer of a launch among t->ev[from..to] that is the start of a live
 * allocation while some of it sits in host frames (the kernel reads it there, across
 * PCIe): ev the launch's index, alloc the ALLOC's, host those bytes. False: out of memory. */
typedef void (*rp_in_place_fn)(void *user, size_t ev, size_t alloc, uint64_t host);
bool rp_in_place(const struct rp_trace *t, const struct rp_chunks *cs, size_t from, size_t to, rp_in_place_fn fn,
                 void *user);

/* ---- derived: allocation sites (by stack) ---- */
struct rp_site {
  uint32_t stack;
  uint64_t bytes, allocs, live, peak;
  uint64_t at_gpu, at_host;        /* its bytes on each side at the last peak of all live bytes */
  uint64_t in_place, in_place_bytes; /* rp_in_place over the steady phase (the trace without one) */
};
struct rp_sites {
  struct rp_site *s; /* those that allocated, by peak live bytes, largest first */
  size_t n;
  uint64_t peak, peak_ts; /* the last peak of all live bytes, and when */
  size_t laps;            /* the steady phase's iterations (0: none): in_place / laps is one's */
  bool placed;            /* any site has where or in-place numbers */
};
/* False (after one line on stderr): out of memory. */
bool rp_sites_build(const struct rp_trace *t, const struct rp_chunks *cs, struct rp_sites *out);
void rp_sites_free(struct rp_sites *sites);

/* ---- derived: the recorded accesses of one window of the run ---- */
struct rp_access_op { uint32_t alloc; bool free; uint64_t ts; };
struct rp_access_alloc {
  uint64_t size;
  /* the window's moments after which it holds data a kernel may read: -1 from before the
   * window (a launch before it named it), m from its first touch, moment m, INT64_MAX
   * never touched */
  int64_t holds_from;
};
struct rp_accesses {
  struct rp_access_alloc *alloc; /* by allocation number (ALLOC records in time order) */
  size_t nallocs;
  struct rp_access_op *ops; /* ALLOC and FREE in time order */
  size_t nops;
  uint32_t *touch;  /* allocations touched, moment after moment */
  size_t ntouch;
  size_t *first;    /* moment m (a launch of the window) touches touch[first[m] .. first[m + 1]) */
  size_t nmoments;
  uint64_t launches, pointers, matched;
  uint64_t from, to; /* the window: [from, to) in trace time */
  bool periodic;     /* the window is one iteration */
  char window[64];
};
/* The steady phase's last complete iteration, else the whole run. False (after one line on
 * stderr): out of memory. */
bool rp_accesses_gather(const struct rp_trace *t, struct rp_accesses *a);
void rp_accesses_free(struct rp_accesses *a);

/* ---- WHAT TO CHANGE: the report's first section, shared by the text and the HTML ---- */
enum { RP_VERDICT_LINES = 8, RP_VERDICT_LEN = 640 };
struct rp_verdict {
  char line[RP_VERDICT_LINES][RP_VERDICT_LEN]; /* sentences, in order */
  size_t n, tries;                             /* lines; those that name a setting to try */
};
/* From the steady iterations, the accesses' window (a: NULL, none gathered) and the
 * samples. False: out of memory. */
bool rp_verdict_build(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a,
                      struct rp_verdict *v);
/* What a replay of the accesses under OPT at chunk_size and budget moves in its last
 * iteration: bytes copied in and out, and bytes of chunks read in place. False: out of memory. */
bool rp_chunk_across(const struct rp_accesses *a, uint64_t chunk_size, uint64_t budget, uint64_t *moved,
                     uint64_t *in_place);

/* ---- outputs; each returns false after one line on stderr ---- */
/* The text summary, WHAT TO CHANGE from a (NULL: that section left out) after RUN. */
bool rp_text(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a, FILE *out);
/* The PAGE-OUTS section: what came of each chunk the steady phase paged out, up to its next
 * page-in (nothing when there is no steady phase or it paged nothing out). */
bool rp_pageouts(const struct rp_trace *t, FILE *out);
/* The MOVES section: the steady phase's moves' cost to the thread that made each, by
 * direction and by whether kernels read host frames in place just before (nothing when
 * there is no steady phase or it moved nothing). */
bool rp_moves(const struct rp_trace *t, const struct rp_chunks *cs, FILE *out);
bool rp_perfetto(const struct rp_trace *t, const char *path);
bool rp_html(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a, const char *path);
/* The recorded accesses packed by best fit into chunks of chunk_size, as the allocator
 * packs its spans, as a sealed schedule; every touch counts as a write (the trace does not say
 * which pointers a kernel wrote), and a chunk is empty (psp_schedule_empty) between the
 * last touch of what was freed in it and the first touch of what was allocated in it.
 * Sets *chunks and the chunks' peak *footprint. NULL: out of memory. */
psp_schedule *rp_schedule(const struct rp_accesses *a, uint64_t chunk_size, size_t *chunks, uint64_t *footprint);
/* Replays the recorded accesses with each chunk size in sizes[0..n) at budget bytes. */
bool rp_chunk_advice(const struct rp_accesses *a, const uint64_t *sizes, size_t n, uint64_t budget,
                     FILE *out);
/* The least bytes any placement must bring onto the GPU in the accesses' window, at each of
 * budgets[0..n) into best[0..n), and all it read that it did not write first into
 * *read_all (report_least.c says why it is a bound). False: out of memory. */
bool rp_least_bound(const struct rp_accesses *a, const uint64_t *budgets, size_t n, uint64_t *best,
                    uint64_t *read_all);
/* A PLAN section: policy/'s steady plan for the accesses' window at the run's budget
 * and chunk size, beside the least traffic and what the run paged then. */
#define RP_DEFAULT_LAG 0 /* auto's owner waits for the GPU: a chunk is movable once its use has run */
bool rp_plan(const struct rp_trace *t, const struct rp_accesses *a, uint32_t lag, FILE *out);
/* The same as a LEAST TRAFFIC section; t gives what was paged in then. */
bool rp_least_traffic(const struct rp_trace *t, const struct rp_accesses *a, const uint64_t *budgets, size_t n,
                      FILE *out);

/* ---- a map from 64-bit keys (addresses) to 64-bit values ---- */
struct rp_map {
  uint64_t *keys, *vals; /* key 0 is free: addresses are never 0 */
  size_t cap, n;
};
/* False: out of memory. Key 0 is never stored (lookups of 0 find nothing). */
bool rp_map_put(struct rp_map *m, uint64_t key, uint64_t val);
bool rp_map_get(const struct rp_map *m, uint64_t key, uint64_t *val); /* false: not there */
bool rp_map_del(struct rp_map *m, uint64_t key, uint64_t *val);
void rp_map_free(struct rp_map *m);

/* Grows *arr (of item-sized elements, new ones zeroed) to hold index i; false: out of memory. */
bool rp_reserve(void **arr, size_t *cap, size_t i, size_t item);
/* qsort/bsearch order of uint64_t, ascending. */
int rp_cmp_u64(const void *a, const void *b);

/* ---- formatting helpers ---- */
/* "1.5 GiB", "64 MiB", "512 B" into buf. */
const char *rp_bytes(uint64_t b, char *buf, size_t len);
/* Seconds since the trace's start. */
double rp_secs(const struct rp_trace *t, uint64_t ns);
/* Writes s (n bytes) as a JSON string body / HTML text, escaped. */
void rp_json_escape(FILE *f, const char *s, size_t n);
void rp_html_escape(FILE *f, const char *s);
/* name demangled into buf when it is a C++ symbol, else name. */
const char *rp_demangle(const char *name, char *buf, size_t len);
/* A demangled name without its parameter list ("at::native::to(...) const" -> "at::native::to"). */
const char *rp_short_name(const char *name, char *buf, size_t len);
/* Whether a frame (demangled, or "[module]" when unnamed) is an allocator's: psshim's,
 * libcudart's or the driver's allocation functions, torch's c10::cuda allocators. */
bool rp_allocator_frame(const char *name);
/* The first frame of s outside the allocators: where a person's code asked for memory
 * (0 when every frame is an allocator's). */
uint32_t rp_stack_start(const struct rp_trace *t, const struct rp_stack *s);
/* Parses "64M", "1G", "512K", "4096" (binary multiples). */
bool rp_parse_size(const char *s, uint64_t *out);

#endif
