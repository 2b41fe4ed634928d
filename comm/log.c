#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "comm/node.h"

static void (*error_sink)(const char *line);

void psc_set_error_sink(void (*sink)(const char *line)) { error_sink = sink; }

void psc_errorf(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (error_sink) {
    error_sink(line);
    return;
  }
  /* One write, so lines of ranks sharing a terminal do not interleave. */
  char out[sizeof line + 16];
  int n = snprintf(out, sizeof out, "psshim: %s\n", line);
  if (n > (int)sizeof out - 1) n = (int)sizeof out - 1;
  ssize_t w = write(STDERR_FILENO, out, (size_t)n);
  (void)w;
}

void psc_report_wait(const char *during, struct psg_failure f) {
  int rank = f.who;
  switch (f.kind) {
  case PSG_TIMEOUT:
    if (f.pid == 0)
      psc_errorf("rank %d never joined %s within %gs (PSSHIM_COMM_TIMEOUT_S)", rank, during,
                 psc_state.ranks.timeout_s);
    else
      psc_errorf("rank %d (pid %d) did not reach %s within %gs (PSSHIM_COMM_TIMEOUT_S)", rank,
                 (int)f.pid, during, psc_state.ranks.timeout_s);
    break;
  case PSG_DEAD:
    psc_errorf("rank %d (pid %d) died before %s", rank, (int)f.pid, during);
    break;
  case PSG_GAVE_UP:
    psc_errorf("rank %d gave up before %s (its own log says why)", rank, during);
    break;
  case PSG_LEFT:
    psc_errorf("rank %d left psshim's node group before %s", rank, during);
    break;
  case PSG_OK:
    break;
  }
}

const char *psc_format_size(uint64_t bytes, char buf[32]) {
  static const char suffix[] = "KMGT";
  int i = -1;
  while (bytes != 0 && bytes % 1024 == 0 && i < 3) {
    bytes /= 1024;
    i++;
  }
  if (i < 0)
    snprintf(buf, 32, "%llu", (unsigned long long)bytes);
  else
    snprintf(buf, 32, "%llu%c", (unsigned long long)bytes, suffix[i]);
  return buf;
}
