/* A named check for the integration programs: prints the name and "ok" or "FAILED", and
 * counts failures (the program exits non-zero when there were any). */
#ifndef PSSHIM_TESTS_CHECK_H
#define PSSHIM_TESTS_CHECK_H

#include <stdbool.h>
#include <stdio.h>

static int failures;

#define CHECK(name, cond) \
  do { \
    bool ok_ = (cond); \
    printf("%-60s %s\n", name, ok_ ? "ok" : "FAILED"); \
    failures += !ok_; \
  } while (0)

#endif
