/* Logging that is safe inside someone else's process: no stdio (it may lock or malloc
 * in ways the host program does not expect), one write(2) per line, always prefixed. */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

int ps_log_level = PS_LOG_ERROR;

void ps_log_write(int level, const char *fmt, ...)
{
  (void)level;
  char line[1024];
  int n = snprintf(line, sizeof line, "psshim: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0)
    return;
  size_t len = (size_t)n + ((size_t)m < sizeof line - (size_t)n - 1 ? (size_t)m : sizeof line - (size_t)n - 2);
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w; /* nowhere left to report a failed write to stderr */
}
