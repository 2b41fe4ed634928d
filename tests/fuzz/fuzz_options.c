/* libFuzzer target for the options parser: the first byte picks an option of the table,
 * the rest is its value. Whatever the parser accepts must lie within what the option says
 * it accepts; a refusal must name the option. ps_parse_size gets the value too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table itself, as tests/unit/test_options.c takes it. */
#include "core/options.c"

#define NOPTIONS (sizeof option_table / sizeof option_table[0])

static void check_size(const char *text)
{
  uint64_t bytes = 1;
  double pct = -1;
  if (ps_parse_size(text, &bytes, &pct) && (pct < 0 || pct > 1 || (pct > 0 && bytes != 0) || bytes > 18e18))
    abort();
  if (ps_parse_size(text, &bytes, NULL) && bytes > 18e18)
    abort();
}

static void check_option(const struct option_def *o)
{
  switch (o->kind) {
  case OPT_SIZE:
    if (*(uint64_t *)o->value == 0 ||
        (o->value == &ps_options.chunk_size && *(uint64_t *)o->value % (2u << 20)))
      abort();
    break;
  case OPT_SIZE_OR_PCT:
    if (!(*(uint64_t *)o->value > 0 || (*o->pct > 0 && *o->pct <= 1)))
      abort();
    break;
  case OPT_UINT:
    if (*(unsigned *)o->value < 1 || *(unsigned *)o->value > 60000)
      abort();
    break;
  case OPT_SECONDS:
    if (!(*(double *)o->value > 0 && *(double *)o->value <= 1e6))
      abort();
    break;
  case OPT_OUTPUT: /* a file to write: never "", which names none */
    if (!**(const char **)o->value)
      abort();
    break;
  case OPT_CHOICE: case OPT_BOOL: case OPT_PATH:
    break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1 || size > 256)
    return 0;
  char text[256];
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  check_size(text);
  const struct option_def *o = &option_table[data[0] % NOPTIONS];
  for (size_t i = 0; i < NOPTIONS; i++)
    unsetenv(option_table[i].name);
  /* putenv, not setenv: glibc keeps every string setenv was given, millions of them here */
  static char var[320];
  snprintf(var, sizeof var, "%s=%s", o->name, text);
  putenv(var);
  char err[512] = "";
  if (ps_options_parse(err, sizeof err))
    check_option(o);
  else if (!strstr(err, o->name))
    abort();
  unsetenv(o->name);
  return 0;
}
