/* --perfetto: the trace as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
 * chrome://tracing open. Streams are tracks with launches and copies as slices; paging has
 * a track per direction; memory is counter tracks; iterations and notes are global marks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

/* Host threads keep their own tids (below 2^22 on Linux); the other tracks sit above. */
enum { TID_H2D = 1 << 30, TID_D2H, TID_CHUNKS, STREAM_TID = (1 << 30) + 100 };

struct out {
  FILE *f;
  const struct rp_trace *t;
  bool first;
  uint64_t *streams; /* sorted, unique */
  size_t nstreams;
};

/* Starts one event object: the comma, then the fields every event has. */
static void begin(struct out *o, const char *ph, unsigned tid, uint64_t ts_ns) {
  fprintf(o->f, "%s\n{\"ph\":\"%s\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f", o->first ? "" : ",", ph,
          o->t->hdr.pid, tid, ts_ns > o->t->t0 ? (double)(ts_ns - o->t->t0) / 1e3 : 0.0);
  o->first = false;
}

static void name(struct out *o, const char *s) {
  fputs(",\"name\":\"", o->f);
  rp_json_escape(o->f, s, strlen(s));
  fputc('"', o->f);
}

static void track_name(struct out *o, unsigned tid, const char *s) {
  begin(o, "M", tid, o->t->t0);
  fputs(",\"name\":\"thread_name\",\"args\":{\"name\":\"", o->f);
  rp_json_escape(o->f, s, strlen(s));
  fputs("\"}}", o->f);
}

static unsigned stream_tid(const struct out *o, uint64_t stream) {
  const uint64_t *p = bsearch(&stream, o->streams, o->nstreams, sizeof stream, rp_cmp_u64);
  return STREAM_TID + (unsigned)(p - o->streams);
}

static bool collect_streams(struct out *o) {
  const struct rp_trace *t = o->t;
  o->streams = malloc((t->nev + 1) * sizeof *o->streams);
  if (!o->streams) return false;
  for (size_t i = 0; i < t->nev; i++) {
    if (t->ev[i].type == PST_REC_LAUNCH) o->streams[o->nstreams++] = t->ev[i].launch.stream;
    if (t->ev[i].type == PST_REC_COPY) o->streams[o->nstreams++] = t->ev[i].copy.stream;
  }
  qsort(o->streams, o->nstreams, sizeof *o->streams, rp_cmp_u64);
  size_t k = 0;
  for (size_t i = 0; i < o->nstreams; i++)
    if (!k || o->streams[i] != o->streams[k - 1]) o->streams[k++] = o->streams[i];
  o->nstreams = k;
  return true;
}

static void metadata(struct out *o) {
  char buf[160];
  begin(o, "M", 0, o->t->t0);
  snprintf(buf, sizeof buf, "psshim pid %u on %s", o->t->hdr.pid, o->t->hdr.device);
  fputs(",\"name\":\"process_name\",\"args\":{\"name\":\"", o->f);
  rp_json_escape(o->f, buf, strlen(buf));
  fputs("\"}}", o->f);
  track_name(o, TID_H2D, "paging h2d");
  track_name(o, TID_D2H, "paging d2h");
  track_name(o, TID_CHUNKS, "chunk frames");
  for (size_t i = 0; i < o->nstreams; i++) {
    if (o->streams[i]) snprintf(buf, sizeof buf, "stream 0x%llx", (unsigned long long)o->streams[i]);
    else snprintf(buf, sizeof buf, "default stream");
    track_name(o, STREAM_TID + (unsigned)i, buf);
  }
}

static void event(struct out *o, const struct pst_record *r, uint64_t live) {
  const struct rp_trace *t = o->t;
  FILE *f = o->f;
  char buf[160], b[32];
  switch (r->type) {
  case PST_REC_LAUNCH:
    /* Issue time only: the trace does not see kernels end, so a launch is a point. */
    begin(o, "X", stream_tid(o, r->launch.stream), r->ts_ns);
    name(o, rp_string(t, r->launch.function));
    fprintf(f, ",\"dur\":0,\"cat\":\"launch\",\"args\":{\"seq\":%llu,\"pointers\":%u}}",
            (unsigned long long)r->launch.seq, r->launch.n);
    break;
  case PST_REC_COPY:
    begin(o, "X", stream_tid(o, r->copy.stream), r->copy.start_ns);
    snprintf(buf, sizeof buf, "%s %s", pst_copy_kind_name(r->copy.kind), rp_bytes(r->copy.bytes, b, sizeof b));
    name(o, buf);
    fprintf(f, ",\"dur\":%.3f,\"cat\":\"copy\",\"args\":{\"bytes\":%llu}}",
            r->copy.end_ns > r->copy.start_ns ? (double)(r->copy.end_ns - r->copy.start_ns) / 1e3 : 0.0,
            (unsigned long long)r->copy.bytes);
    break;
  case PST_REC_MIGRATION:
    begin(o, "X", r->migration.direction == PST_DIR_H2D ? TID_H2D : TID_D2H, r->migration.start_ns);
    snprintf(buf, sizeof buf, "chunk %u %s", r->migration.chunk, pst_reason_name(r->migration.reason));
    name(o, buf);
    fprintf(f, ",\"dur\":%.3f,\"cat\":\"paging\",\"args\":{\"bytes\":%llu}}",
            r->migration.end_ns > r->migration.start_ns
                ? (double)(r->migration.end_ns - r->migration.start_ns) / 1e3 : 0.0,
            (unsigned long long)r->migration.bytes);
    break;
  case PST_REC_CHUNK:
    begin(o, "i", TID_CHUNKS, r->ts_ns);
    snprintf(buf, sizeof buf, "chunk %u %s", r->chunk.id, pst_chunk_event_name(r->chunk.event));
    name(o, buf);
    fputs(",\"s\":\"t\"}", f);
    break;
  case PST_REC_SYNC:
    begin(o, "i", r->tid, r->ts_ns);
    snprintf(buf, sizeof buf, "sync %s", pst_sync_what_name(r->sync.what));
    name(o, buf);
    fprintf(f, ",\"s\":\"t\",\"args\":{\"stream\":\"0x%llx\"}}", (unsigned long long)r->sync.stream);
    break;
  case PST_REC_SAMPLE:
    begin(o, "C", 0, r->ts_ns);
    fprintf(f, ",\"name\":\"GPU memory (MiB)\",\"args\":{\"chunks on GPU\":%.1f,\"non-model\":%.1f}}",
            (double)r->sample.gpu_chunk_bytes / 1048576.0, (double)r->sample.nonmodel_gpu_bytes / 1048576.0);
    begin(o, "C", 0, r->ts_ns);
    fprintf(f, ",\"name\":\"host memory (MiB)\",\"args\":{\"chunks on host\":%.1f}}",
            (double)r->sample.host_chunk_bytes / 1048576.0);
    begin(o, "C", 0, r->ts_ns);
    fprintf(f, ",\"name\":\"device free (MiB)\",\"args\":{\"free\":%.1f}}",
            (double)r->sample.device_free_bytes / 1048576.0);
    break;
  case PST_REC_ALLOC:
  case PST_REC_FREE:
    begin(o, "C", 0, r->ts_ns);
    fprintf(f, ",\"name\":\"allocated (MiB)\",\"args\":{\"live\":%.3f}}", (double)live / 1048576.0);
    break;
  case PST_REC_ITERATION:
    begin(o, "i", 0, r->ts_ns);
    snprintf(buf, sizeof buf, "iteration %llu", (unsigned long long)r->iteration.iteration);
    name(o, buf);
    fprintf(f, ",\"s\":\"g\",\"args\":{\"period\":%llu}}", (unsigned long long)r->iteration.period);
    break;
  case PST_REC_NOTE:
    begin(o, "i", 0, r->ts_ns);
    name(o, r->note.text);
    fputs(",\"s\":\"g\",\"cat\":\"note\"}", f);
    break;
  default:
    break;
  }
}

bool rp_perfetto(const struct rp_trace *t, const char *path) {
  struct out o = { .t = t, .first = true };
  o.f = fopen(path, "w");
  if (!o.f) {
    fprintf(stderr, "psshim-report: %s: %s\n", path, strerror(errno));
    return false;
  }
  if (!collect_streams(&o)) {
    fclose(o.f);
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", o.f);
  metadata(&o);
  /* Live allocated bytes: a FREE subtracts the size its ALLOC recorded. */
  struct rp_map sizes = { 0 };
  uint64_t live = 0, size;
  bool ok = true;
  for (size_t i = 0; i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_ALLOC) {
      ok = rp_map_put(&sizes, r->alloc.addr, r->alloc.size);
      live += r->alloc.size;
    }
    if (r->type == PST_REC_FREE && rp_map_del(&sizes, r->free.addr, &size)) live -= size;
    event(&o, r, live);
  }
  fputs("\n]}\n", o.f);
  rp_map_free(&sizes);
  free(o.streams);
  if (fclose(o.f) != 0 || !ok) {
    fprintf(stderr, "psshim-report: %s: %s\n", path, ok ? strerror(errno) : "out of memory");
    return false;
  }
  return true;
}
