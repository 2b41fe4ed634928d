/* Names of the trace's enumerations, for reports and messages. */
#include "tracer/tracer.h"

#define NAME_OF(table, i) ((i) < sizeof(table) / sizeof *(table) && (table)[i] ? (table)[i] : "?")

const char *pst_record_type_name(unsigned type) {
  static const char *const names[] = {
    [PST_REC_STRING] = "STRING", [PST_REC_STACK] = "STACK",   [PST_REC_ALLOC] = "ALLOC",
    [PST_REC_FREE] = "FREE",     [PST_REC_CHUNK] = "CHUNK",   [PST_REC_LAUNCH] = "LAUNCH",
    [PST_REC_COPY] = "COPY",     [PST_REC_MIGRATION] = "MIGRATION", [PST_REC_SYNC] = "SYNC",
    [PST_REC_SAMPLE] = "SAMPLE", [PST_REC_ITERATION] = "ITERATION", [PST_REC_NOTE] = "NOTE",
    [PST_REC_END] = "END",
  };
  return NAME_OF(names, type);
}

const char *pst_copy_kind_name(unsigned kind) {
  static const char *const names[] = { "h2d", "d2h", "d2d", "memset" };
  return NAME_OF(names, kind);
}

const char *pst_direction_name(unsigned dir) {
  static const char *const names[] = { "h2d", "d2h" };
  return NAME_OF(names, dir);
}

const char *pst_reason_name(unsigned reason) {
  static const char *const names[] = { "prefetch", "evict", "demand" };
  return NAME_OF(names, reason);
}

const char *pst_chunk_event_name(unsigned event) {
  static const char *const names[] = { "created", "frame gpu", "frame host", "released" };
  return NAME_OF(names, event);
}

const char *pst_sync_what_name(unsigned what) {
  static const char *const names[] = { "device", "stream", "event" };
  return NAME_OF(names, what);
}
