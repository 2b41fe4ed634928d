/* Helpers shared by psshim-report's parts: growing arrays, ordering, formatting. */
#include <stdio.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

bool rp_reserve(void **arr, size_t *cap, size_t i, size_t item) {
  if (i < *cap) return true;
  size_t c = *cap ? *cap : 1024;
  while (c <= i) c *= 2;
  void *a = realloc(*arr, c * item);
  if (!a) return false;
  memset((char *)a + *cap * item, 0, (c - *cap) * item);
  *arr = a;
  *cap = c;
  return true;
}

int rp_cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

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

/* libstdc++'s demangler (the Itanium C++ ABI's __cxa_demangle), declared here so that C
 * links it: psshim-report links libstdc++, the preloaded library never does. */
extern char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status);

const char *rp_demangle(const char *name, char *buf, size_t len) {
  if (strncmp(name, "_Z", 2) != 0) return name;
  int status = -1;
  char *out = __cxa_demangle(name, NULL, NULL, &status);
  if (!out || status != 0) {
    free(out);
    return name;
  }
  snprintf(buf, len, "%s", out);
  free(out);
  return buf;
}

/* Frames of the allocators between a tensor's maker and psshim: psshim's own doors,
 * libcudart's and the driver's allocation entry points, torch's c10::cuda allocators
 * (CUDACachingAllocator, the cudaMallocAsync backend; their internals are often unnamed
 * frames of libc10_cuda.so). `name` is demangled or an unnamed frame's "[module]". */
bool rp_allocator_frame(const char *name) {
  static const char *const prefix[] = { "[libpsshim", "[libcudart", "[libcuda.so", "[libc10_cuda", "psshim_",
                                        "cudaMalloc", "cuMemAlloc", "c10::cuda::" };
  for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
    if (strncmp(name, prefix[i], strlen(prefix[i])) == 0) return true;
  return strstr(name, "CUDACachingAllocator") || strstr(name, "CudaMallocAsync");
}

uint32_t rp_stack_start(const struct rp_trace *t, const struct rp_stack *s) {
  char buf[1024];
  uint32_t i = 0;
  while (i < s->depth && rp_allocator_frame(rp_demangle(rp_string(t, s->frames[i].symbol), buf, sizeof buf))) i++;
  return i < s->depth ? i : 0; /* all of it the allocators': show it whole */
}

/* A demangled name without its parameter list and what follows it ("at::native::to(at::
 * Tensor const&, ...) const" -> "at::native::to"): the list starts at the first '(' outside
 * template brackets and braces ("{lambda()#1}"), past an operator's own name ("operator()",
 * "operator<<"). */
const char *rp_short_name(const char *name, char *buf, size_t len) {
  int depth = 0;
  size_t i = 0;
  while (name[i]) {
    const bool op = i >= 8 && strncmp(name + i - 8, "operator", 8) == 0 && (i == 8 || name[i - 9] == ':');
    const size_t skip = !op ? 0 : name[i] == '(' && name[i + 1] == ')' ? 2 : strspn(name + i, "<>=!+-*/%^&|~[],");
    if (skip) {
      i += skip;
      continue;
    }
    const char c = name[i];
    if (c == '<' || c == '{') depth++;
    else if ((c == '>' || c == '}') && depth > 0) depth--;
    else if (c == '(' && depth == 0) break;
    i++;
  }
  snprintf(buf, len, "%.*s", (int)(i < len ? i : len - 1), name);
  return buf;
}
