/* Formatting helpers shared by psshim-report's outputs. */
#include <dlfcn.h>
#include <stdio.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

const char *rp_bytes(uint64_t b, char *buf, size_t len) {
  static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)b);
  else snprintf(buf, len, v == (double)(uint64_t)v ? "%.0f %s" : "%.1f %s", v, unit[u]);
  return buf;
}

double rp_secs(const struct rp_trace *t, uint64_t ns) {
  return ns > t->t0 ? (double)(ns - t->t0) / 1e9 : 0.0;
}

void rp_json_escape(FILE *f, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c); /* traces hold bytes, not UTF-8 */
    else fputc(c, f);
  }
}

void rp_html_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    default: fputc(*s, f);
    }
  }
}

bool rp_parse_size(const char *s, uint64_t *out) {
  char *end;
  if (!s || !isdigit((unsigned char)*s)) return false;
  double v = strtod(s, &end);
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K': shift = 10; end++; break;
  case 'M': shift = 20; end++; break;
  case 'G': shift = 30; end++; break;
  case 'T': shift = 40; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'I') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v <= 0 || v * (double)(1ull << shift) >= 18e18) return false;
  *out = (uint64_t)(v * (double)(1ull << shift));
  return true;
}

/* C++ symbols (torch's) read better demangled. libstdc++'s demangler is used when the
 * library can be loaded; otherwise the name stays as recorded. */
const char *rp_demangle(const char *name, char *buf, size_t len) {
  static char *(*demangle)(const char *, char *, size_t *, int *);
  static bool looked;
  if (strncmp(name, "_Z", 2) != 0) return name;
  if (!looked) {
    looked = true;
    void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (lib) demangle = (char *(*)(const char *, char *, size_t *, int *))dlsym(lib, "__cxa_demangle");
  }
  int status = -1;
  char *out = demangle ? demangle(name, NULL, NULL, &status) : NULL;
  if (!out || status != 0) {
    free(out);
    return name;
  }
  snprintf(buf, len, "%s", out);
  free(out);
  return buf;
}
