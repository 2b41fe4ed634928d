/* The options table: every PSSHIM_* variable, its kind, default and what it accepts.
 * Parsed once at start; a bad value is reported with the variable's name and the
 * accepted forms, never silently ignored (the caller stops the process). */
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ps_options ps_options;

enum option_kind { OPT_SIZE, OPT_SIZE_OR_PCT, OPT_CHOICE, OPT_BOOL, OPT_PATH, OPT_UINT, OPT_SECONDS };

struct option_def {
  const char *name;
  enum option_kind kind;
  const char *accepts;   /* shown on a bad value */
  const char *def;       /* default text, NULL = unset */
  void *value;           /* uint64_t, unsigned, bool, int, double or const char * */
  double *pct;           /* for OPT_SIZE_OR_PCT */
  const char *const *choices;
};

static const char *const policy_choices[] = {"static", "auto", "plan", NULL}; /* enum ps_policy_kind's order */
static const char *const log_choices[] = {"off", "error", "warn", "info", "debug", NULL};
static const char *const torch_choices[] = {"async", "keep", NULL};
static const char *const mover_choices[] = {"0", "1", "crowded", NULL}; /* enum ps_mover_kind's order */

static int torch_alloc_choice;
static const char *stats_text;

static const struct option_def option_table[] = {
  {"PSSHIM_GPU_BUDGET", OPT_SIZE_OR_PCT, "a size (e.g. 24G, 512M) or a percentage of device memory (e.g. 80%)",
   NULL, &ps_options.gpu_budget, &ps_options.gpu_budget_frac, NULL},
  {"PSSHIM_GPU_RESERVE", OPT_SIZE, "a size (e.g. 2G) left to memory psshim does not manage",
   NULL, &ps_options.gpu_reserve, NULL, NULL},
  {"PSSHIM_HOST_BUDGET", OPT_SIZE_OR_PCT, "a size (e.g. 64G) or a percentage of RAM (e.g. 50%)",
   NULL, &ps_options.host_budget, &ps_options.host_budget_frac, NULL},
  /* Unset: the allocator picks one for the node (PSA_DEFAULT_CHUNK, allocator/space.c). */
  {"PSSHIM_CHUNK_SIZE", OPT_SIZE, "a non-zero size that is a multiple of 2M (e.g. 16M)",
   NULL, &ps_options.chunk_size, NULL, NULL},
  {"PSSHIM_POLICY", OPT_CHOICE, "auto, static or plan", "auto", &ps_options.policy, NULL, policy_choices},
  {"PSSHIM_RUNAHEAD", OPT_UINT, "a whole number of launches from 1 to 60000", "256", &ps_options.runahead, NULL,
   NULL},
  /* Measured on the H200 (PCIe 5): static placement read and wrote its host frames in
   * place at 43-48 GB/s each way. */
  {"PSSHIM_INPLACE_RATE", OPT_SIZE, "a non-zero size per second (e.g. 40G)", "40G", &ps_options.inplace_rate, NULL,
   NULL},
  /* Crowded: on the H200 the mover made every crowded run faster (the 2.68B GPT at 3x and
   * 4x, the activation set) and every uncrowded one slower or no faster (1.25x-2x), all
   * pairs in one call each (bench/results/mover_2026-12-03_a2eafe8/). */
  {"PSSHIM_MOVER", OPT_CHOICE, "crowded, 1 or 0", "crowded", &ps_options.mover, NULL, mover_choices},
  {"PSSHIM_LOG", OPT_CHOICE, "off, error, warn, info or debug", "error", &ps_options.log_level, NULL,
   log_choices},
  {"PSSHIM_STATS", OPT_PATH, "0, 1 (summary on stderr at exit) or a file path (JSON at exit)", NULL,
   &stats_text, NULL, NULL},
  {"PSSHIM_TRACE", OPT_PATH, "a file path", NULL, &ps_options.trace_path, NULL, NULL},
  {"PSSHIM_SAMPLE_MS", OPT_UINT, "a whole number of milliseconds from 1 to 60000", "10",
   &ps_options.sample_ms, NULL, NULL},
  {"PSSHIM_CUPTI", OPT_PATH, "the path of libcupti.so", NULL, &ps_options.cupti_path, NULL, NULL},
  {"PSSHIM_TORCH_ALLOC", OPT_CHOICE, "async (set backend:cudaMallocAsync when unset) or keep", "async",
   &torch_alloc_choice, NULL, torch_choices},
  {"PSSHIM_DISABLE", OPT_BOOL, "0 or 1", "0", &ps_options.disabled, NULL, NULL},
  {"PSSHIM_LIBCUDA", OPT_PATH, "the CUDA driver library's name or path", "libcuda.so.1", &ps_options.libcuda_path,
   NULL, NULL},
  {"PSSHIM_NCCL", OPT_PATH, "libnccl.so.2's name or path", "libnccl.so.2", &ps_options.nccl_path, NULL, NULL},
  {"PSSHIM_COMM_TIMEOUT_S", OPT_SECONDS, "seconds, more than 0 and at most 1000000", "120",
   &ps_options.comm_timeout_s, NULL, NULL},
};

bool ps_parse_size(const char *text, uint64_t *bytes, double *pct)
{
  if (!text || !*text)
    return false;
  errno = 0;
  char *end;
  double v = strtod(text, &end);
  if (errno || end == text || !(v >= 0) || !isfinite(v))
    return false;
  if (*end == '%') {
    if (!pct || end[1] || v <= 0 || v > 100)
      return false;
    *pct = v / 100.0;
    *bytes = 0;
    return true;
  }
  double mult = 1;
  switch (*end) {
  case 'k': case 'K': mult = 1024.0; end++; break;
  case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
  case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
  case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'B') /* accept 64MiB, 64MB: both mean binary here */
    end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
  if (*end)
    return false;
  double b = v * mult;
  if (b > 18e18 || b != floor(b))
    return false;
  *bytes = (uint64_t)b;
  if (pct)
    *pct = 0;
  return true;
}

static bool parse_one(const struct option_def *o, const char *text)
{
  switch (o->kind) {
  case OPT_SIZE: {
    uint64_t b;
    if (!ps_parse_size(text, &b, NULL) || b == 0)
      return false;
    /* The VMM granularity is only known from the driver; 2 MiB is what every current GPU
     * reports, and allocator init re-checks against the real value. */
    if (o->value == &ps_options.chunk_size && b % (2u << 20))
      return false;
    *(uint64_t *)o->value = b;
    return true;
  }
  case OPT_SIZE_OR_PCT:
    return ps_parse_size(text, (uint64_t *)o->value, o->pct) && (*(uint64_t *)o->value > 0 || *o->pct > 0);
  case OPT_CHOICE:
    for (int i = 0; o->choices[i]; i++)
      if (strcmp(text, o->choices[i]) == 0) {
        *(int *)o->value = i;
        return true;
      }
    return false;
  case OPT_BOOL:
    if (strcmp(text, "0") && strcmp(text, "1"))
      return false;
    *(bool *)o->value = text[0] == '1';
    return true;
  case OPT_PATH:
    if (!*text)
      return false;
    *(const char **)o->value = text;
    return true;
  case OPT_UINT: {
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || *end || end == text || v < 1 || v > 60000 || text[0] == '-')
      return false;
    *(unsigned *)o->value = (unsigned)v;
    return true;
  }
  case OPT_SECONDS: {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v > 0 && v <= 1e6))
      return false;
    *(double *)o->value = v;
    return true;
  }
  }
  return false;
}

const char *ps_policy_name(enum ps_policy_kind p) { return policy_choices[p]; }

bool ps_options_parse(char *err, size_t errlen)
{
  memset(&ps_options, 0, sizeof ps_options);
  stats_text = NULL;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
    const struct option_def *o = &option_table[i];
    const char *text = getenv(o->name);
    if (!text)
      text = o->def;
    if (!text)
      continue;
    if (!parse_one(o, text)) {
      if (err)
        snprintf(err, errlen, "%s=%s is not valid: %s accepts %s%s%s", o->name, text, o->name, o->accepts,
                 o->def ? "; default " : "", o->def ? o->def : "");
      return false;
    }
  }
  ps_options.keep_torch_allocator = torch_alloc_choice == 1;
  ps_options.stats = stats_text && strcmp(stats_text, "0") != 0;
  ps_options.stats_path = (stats_text && strcmp(stats_text, "0") && strcmp(stats_text, "1")) ? stats_text : NULL;
  return true;
}
