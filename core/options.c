/* The options table: every PSSHIM_* variable, its kind, default and what it accepts.
 * Parsed once at start; a bad value is reported with the variable's name and the
 * accepted forms, never silently ignored (the caller stops the process). */
#include "core/core.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ps_options ps_options;

/* OPT_OUTPUT: a file psshim writes, checked at start so that a bad path stops the process
 * before the program runs, not when the file is first written. */
enum option_kind { OPT_SIZE, OPT_SIZE_OR_PCT, OPT_CHOICE, OPT_BOOL, OPT_PATH, OPT_OUTPUT, OPT_UINT, OPT_SECONDS };

struct option_def {
  const char *name;
  enum option_kind kind;
  const char *accepts;   /* shown on a bad value */
  const char *def;       /* default text, NULL = unset */
  void *value;           /* uint64_t, unsigned, bool, int, double or const char * */
  double *pct;           /* for OPT_SIZE_OR_PCT */
  const char *const *choices;
};

static const char *const policy_choices[] = {"static", "auto", NULL}; /* enum ps_policy_kind's order */
static const char *const log_choices[] = {"off", "error", "warn", "info", "debug", NULL};
static const char *const torch_choices[] = {"async", "keep", NULL};

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
  {"PSSHIM_POLICY", OPT_CHOICE, "auto or static", "auto", &ps_options.policy, NULL, policy_choices},
  {"PSSHIM_LOG", OPT_CHOICE, "off, error, warn, info or debug", "error", &ps_options.log_level, NULL,
   log_choices},
  {"PSSHIM_STATS", OPT_OUTPUT, "0, 1 (summary on stderr at exit) or a file path (JSON at exit)", NULL,
   &stats_text, NULL, NULL},
  {"PSSHIM_TRACE", OPT_OUTPUT, "the path of a file to write, in a folder that exists", NULL,
   &ps_options.trace_path, NULL, NULL},
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

/* Why a size was refused, where one reason stands out from what the variable accepts:
 * written to why, else why is left empty. */
static void size_refusal(const char *text, bool pct_ok, char *why, size_t whylen)
{
  char *end;
  double v = strtod(text, &end);
  const bool pct = strcmp(end, "%") == 0;
  if (end == text || (pct && !pct_ok))
    return;
  if (pct && v > 100)
    snprintf(why, whylen, "a percentage is at most 100%%");
  else if (v == 0 && (pct || ps_parse_size(text, &(uint64_t){0}, NULL)))
    snprintf(why, whylen, "zero is not allowed");
}

/* Whether a file can be made or rewritten at path, asking without making it: a process
 * that stops before it writes (a launcher, a program that fails) leaves nothing behind.
 * On refusal, the reason in why. */
static bool writable_file(const char *path, char *why, size_t whylen)
{
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (S_ISDIR(sb.st_mode))
      snprintf(why, whylen, "it is a directory");
    else if (access(path, W_OK) != 0)
      snprintf(why, whylen, "the file is not writable (%s)", strerror(errno));
    return !*why;
  }
  if (errno != ENOENT && errno != ENOTDIR) {
    snprintf(why, whylen, "%s", strerror(errno));
    return false;
  }
  char copy[PATH_MAX];
  snprintf(copy, sizeof copy, "%s", path);
  const char *dir = dirname(copy);
  if (stat(dir, &sb) != 0)
    snprintf(why, whylen, "%s: %s", dir, errno == ENOENT ? "no such directory" : strerror(errno));
  else if (!S_ISDIR(sb.st_mode))
    snprintf(why, whylen, "%s is not a directory", dir);
  else if (access(dir, W_OK | X_OK) != 0)
    snprintf(why, whylen, "no file can be made in %s (%s)", dir, strerror(errno));
  return !*why;
}

/* Parses text for o into its value; false if it is refused, with a reason in why when
 * one stands out. */
static bool parse_one(const struct option_def *o, const char *text, char *why, size_t whylen)
{
  switch (o->kind) {
  case OPT_SIZE:
  case OPT_SIZE_OR_PCT: {
    uint64_t b;
    double pct = 0;
    if (!ps_parse_size(text, &b, o->pct ? &pct : NULL) || (b == 0 && pct == 0)) {
      size_refusal(text, o->pct != NULL, why, whylen);
      return false;
    }
    /* The VMM granularity is only known from the driver; 2 MiB is what every current GPU
     * reports, and allocator init re-checks against the real value. */
    if (o->value == &ps_options.chunk_size && b % (2u << 20))
      return false;
    *(uint64_t *)o->value = b;
    if (o->pct)
      *o->pct = pct;
    return true;
  }
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
  case OPT_OUTPUT:
  case OPT_PATH:
    if (!*text)
      return false;
    /* PSSHIM_STATS's 0 and 1 name no file. */
    if (o->kind == OPT_OUTPUT && !(o->value == &stats_text && (!strcmp(text, "0") || !strcmp(text, "1"))) &&
        !writable_file(text, why, whylen))
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

const char *ps_size_text(uint64_t bytes, char *buf, size_t len)
{
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes;
  unsigned u = 0;
  while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu bytes", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

/* The launcher's options (tools/psshim.in), by the variable each sets: a message about a
 * value found after start names the option as well, since the user may have typed it. */
static const char *const launcher_options[][2] = {
    {"PSSHIM_GPU_BUDGET", "--budget"}, {"PSSHIM_HOST_BUDGET", "--host-budget"},
    {"PSSHIM_CHUNK_SIZE", "--chunk-size"}, {"PSSHIM_POLICY", "--policy"}, {"PSSHIM_TRACE", "--trace"},
    {"PSSHIM_STATS", "--stats"}, {"PSSHIM_LOG", "--log"},
};

const char *ps_setting_text(const char *var, char *buf, size_t len)
{
  const char *value = getenv(var), *option = NULL;
  for (size_t i = 0; i < sizeof launcher_options / sizeof launcher_options[0]; i++)
    if (strcmp(var, launcher_options[i][0]) == 0)
      option = launcher_options[i][1];
  snprintf(buf, len, "%s%s%s%s%s%s", var, value ? "=" : "'s default", value ? value : "", option ? " (psshim " : "",
           option ? option : "", option ? ")" : "");
  return buf;
}

/* Edits (insert, delete, replace) from a to b, for names up to 63 characters (else 99). */
static unsigned edits(const char *a, const char *b)
{
  size_t n = strlen(a), m = strlen(b);
  if (n > 63 || m > 63)
    return 99;
  unsigned row[64];
  for (size_t j = 0; j <= m; j++)
    row[j] = (unsigned)j;
  for (size_t i = 1; i <= n; i++) {
    unsigned diag = row[0];
    row[0] = (unsigned)i;
    for (size_t j = 1; j <= m; j++) {
      unsigned up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[m];
}

/* The table's name nearest a misspelt one: a name containing it (PSSHIM_BUDGET in
 * PSSHIM_GPU_BUDGET), else one at most two edits away (one, for a short name); NULL if
 * none. */
static const char *nearest_name(const char *name)
{
  const char *best = NULL;
  unsigned best_edits = strlen(name) > strlen("PSSHIM_") + 4 ? 3 : 2;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
    const char *known = option_table[i].name;
    if (strstr(known, name + strlen("PSSHIM")))
      return known;
    unsigned e = edits(name, known);
    if (e < best_edits) {
      best = known;
      best_edits = e;
    }
  }
  return best;
}

const char *ps_options_settings(char *buf, size_t len)
{
  size_t used = (size_t)snprintf(buf, len, "policy %s; given:", ps_policy_name(ps_options.policy));
  bool any = false;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0] && used < len; i++) {
    const char *value = getenv(option_table[i].name);
    if (value) {
      used += (size_t)snprintf(buf + used, len - used, " %s=%s", option_table[i].name, value);
      any = true;
    }
  }
  if (!any && used < len)
    snprintf(buf + used, len - used, " nothing (every default)");
  return buf;
}

void ps_options_say_unknown(void)
{
  extern char **environ;
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    char name[128];
    if (strncmp(*e, "PSSHIM_", 7) || len >= sizeof name)
      continue;
    memcpy(name, *e, len);
    name[len] = '\0';
    bool known = false;
    for (size_t i = 0; !known && i < sizeof option_table / sizeof option_table[0]; i++)
      known = strcmp(name, option_table[i].name) == 0;
    if (known)
      continue;
    const char *near = nearest_name(name);
    ps_error("%s is not a psshim setting, so it is ignored%s%s%s; README.md's Configuration lists them", name,
             near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
  }
}

static const char *option_table_accepts(const char *name)
{
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++)
    if (strcmp(option_table[i].name, name) == 0)
      return option_table[i].accepts;
  return "";
}

/* Whether two paths writable_file accepted name one file: the same file where it exists,
 * else the same name in the same folder (./s.json and s.json). */
static bool same_file(const char *a, const char *b)
{
  struct stat sa, sb;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char ca[PATH_MAX], cb[PATH_MAX], da[PATH_MAX], db[PATH_MAX];
  snprintf(ca, sizeof ca, "%s", a);
  snprintf(cb, sizeof cb, "%s", b);
  if (!realpath(dirname(ca), da) || !realpath(dirname(cb), db))
    return false;
  snprintf(ca, sizeof ca, "%s", a);
  snprintf(cb, sizeof cb, "%s", b);
  return strcmp(da, db) == 0 && strcmp(basename(ca), basename(cb)) == 0;
}

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
    char why[PATH_MAX + 64] = "";
    if (!parse_one(o, text, why, sizeof why)) {
      if (err)
        snprintf(err, errlen, "%s=%s is not valid: %s%s%s accepts %s%s%s", o->name, text, why, *why ? "; " : "",
                 o->name, o->accepts, o->def ? "; default " : "", o->def ? o->def : "");
      return false;
    }
  }
  /* Trace and statistics written to one file would overwrite each other at exit. */
  if (ps_options.trace_path && stats_text && strcmp(stats_text, "0") && strcmp(stats_text, "1") &&
      same_file(ps_options.trace_path, stats_text)) {
    if (err)
      snprintf(err, errlen, "PSSHIM_STATS=%s is not valid: it names PSSHIM_TRACE's file too; PSSHIM_STATS accepts %s",
               stats_text, option_table_accepts("PSSHIM_STATS"));
    return false;
  }
  ps_options.keep_torch_allocator = torch_alloc_choice == 1;
  ps_options.stats = stats_text && strcmp(stats_text, "0") != 0;
  ps_options.stats_path = (stats_text && strcmp(stats_text, "0") && strcmp(stats_text, "1")) ? stats_text : NULL;
  return true;
}
