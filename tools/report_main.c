/* psshim-report: reads a psshim trace and tells what happened (see usage below). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_TRACE = 2, EXIT_OUTPUT = 3 };
#define DEFAULT_SIZES "4M,8M,16M,32M,64M,128M"

static void usage(void) {
  printf(
          "usage: psshim-report FILE [options]\n"
          "\n"
          "Reads a trace written by libpsshim.so (PSSHIM_TRACE=FILE) and prints a summary: the run,\n"
          "time per phase (warm-up, steady and later iterations) and the bytes each iteration paged\n"
          "in and out and at most read in place, a DATA MOVE table of every kind of transfer,\n"
          "PAGE-OUTS: what came of the chunks the steady iterations paged out (back on the GPU,\n"
          "read in place, freed in host frames), MOVES: what each steady move cost the thread that\n"
          "made it, with and without kernels reading host frames just before, the top allocation\n"
          "sites (where their bytes were at the last peak of live bytes, and how often kernels\n"
          "named them while they sat in host frames), where each chunk lived, LEAST TRAFFIC: a\n"
          "lower bound on what any placement must bring onto the GPU in a steady iteration at the\n"
          "run's budget, and PLAN: what policy/'s plan for that iteration would copy and how long\n"
          "it would take.\n"
          "\n"
          "options:\n"
          "  --perfetto OUT.json    Chrome trace-event JSON: open it in ui.perfetto.dev or\n"
          "                         chrome://tracing (streams as tracks, memory as counters)\n"
          "  --html OUT.html        one self-contained page: each steady iteration's time and bytes\n"
          "                         against LEAST TRAFFIC, memory over time against the budgets,\n"
          "                         one iteration up close, chunk residency, allocation sites\n"
          "  --chunk-size[=LIST]    replay the recorded accesses with each chunk size in LIST\n"
          "                         (multiples of 2M, default " DEFAULT_SIZES "; those larger\n"
          "                         than the budget left out) through the OPT and LRU\n"
          "                         simulators and name the one that moves the fewest bytes\n"
          "                         across PCIe, copied or read in place (under demand paging:\n"
          "                         a ranking of bytes, not of step time)\n"
          "  --budget SIZE          GPU budget for --chunk-size (default: the run's)\n"
          "  --least=LIST           the LEAST TRAFFIC bound at each GPU budget in LIST (default:\n"
          "                         the run's): the bytes any placement must bring onto the GPU\n"
          "                         in the steady iteration, whatever pages or is read in place\n"
          "  --lag N                the launches a chunk stays busy after a use in PLAN (default:\n"
          "                         0, as auto's owner plans): what the plan could do were\n"
          "                         moves kept that far behind the launches\n"
          "  --help, --version\n"
          "\n"
          "Sizes take K, M, G, T (binary) suffixes. Exit status: 0 ok; 1 bad usage; 2 the file\n"
          "cannot be read or is damaged (what was readable is still reported); 3 a report could\n"
          "not be written whole (an output that fails to write, memory that runs out).\n");
}

static bool parse_sizes(const char *list, uint64_t **out, size_t *n) {
  char *copy = strdup(list), *save = NULL;
  *out = calloc(strlen(list) / 2 + 2, sizeof **out);
  *n = 0;
  bool ok = copy && *out;
  for (char *tok = ok ? strtok_r(copy, ",", &save) : NULL; tok && ok; tok = strtok_r(NULL, ",", &save))
    ok = rp_parse_size(tok, &(*out)[(*n)++]);
  free(copy);
  return ok && *n > 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
    { "perfetto", required_argument, NULL, 'p' }, { "html", required_argument, NULL, 'w' },
    { "chunk-size", optional_argument, NULL, 'c' }, { "budget", required_argument, NULL, 'b' },
    { "least", required_argument, NULL, 'l' },    { "lag", required_argument, NULL, 'g' },
    { "help", no_argument, NULL, 'h' },           { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  const char *perfetto = NULL, *html = NULL, *sizes_arg = NULL, *least_arg = NULL;
  uint64_t budget = 0;
  uint32_t lag = RP_DEFAULT_LAG;
  int c;
  /* The leading ':' silences getopt's own messages, which name argv[0], the full path
   * psshim-report was run by: ours name the program and the option, on one line. */
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (c) {
    case 'p': perfetto = optarg; break;
    case 'w': html = optarg; break;
    case 'c': sizes_arg = optarg ? optarg : DEFAULT_SIZES; break;
    case 'l': least_arg = optarg; break;
    case 'b':
      if (!rp_parse_size(optarg, &budget)) {
        fprintf(stderr, "psshim-report: --budget takes a size like 16G, not '%s'\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'g': {
      char *end;
      unsigned long v = strtoul(optarg, &end, 10);
      if (!*optarg || *end || *optarg == '-' || v > UINT32_MAX) {
        fprintf(stderr, "psshim-report: --lag takes a count of launches like 32, not '%s'\n", optarg);
        return EXIT_USAGE;
      }
      lag = (uint32_t)v;
      break;
    }
    case 'h': usage(); return EXIT_OK;
    case 'V': printf("psshim-report %s (reads trace format version %u)\n", PSSHIM_VERSION, PST_TRACE_VERSION); return EXIT_OK;
    case ':':
      fprintf(stderr, "psshim-report: %s needs a value (psshim-report --help)\n", argv[optind - 1]);
      return EXIT_USAGE;
    default: { /* an unknown short option is optopt; a long one, the argument just passed */
      const char *arg = argv[optind - 1];
      if (optopt && strncmp(arg, "--", 2) != 0)
        fprintf(stderr, "psshim-report: -%c: unknown option (psshim-report --help lists them)\n", optopt);
      else
        fprintf(stderr, "psshim-report: %s: unknown option (psshim-report --help lists them)\n", arg);
      return EXIT_USAGE;
    }
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "psshim-report: give exactly one trace FILE (usage: psshim-report FILE [options])\n");
    return EXIT_USAGE;
  }
  uint64_t *sizes = NULL;
  size_t nsizes = 0;
  if (sizes_arg && !parse_sizes(sizes_arg, &sizes, &nsizes)) {
    fprintf(stderr, "psshim-report: --chunk-size takes sizes like 32M,64M, not '%s'\n", sizes_arg);
    free(sizes);
    return EXIT_USAGE;
  }
  for (size_t i = 0; i < nsizes; i++)
    if (sizes[i] % (2u << 20)) { /* advice the library would refuse is no advice */
      fprintf(stderr, "psshim-report: --chunk-size takes multiples of 2M, as PSSHIM_CHUNK_SIZE does, not '%s'\n",
              sizes_arg);
      free(sizes);
      return EXIT_USAGE;
    }

  uint64_t *least = NULL;
  size_t nleast = 0;
  if (least_arg && !parse_sizes(least_arg, &least, &nleast)) {
    fprintf(stderr, "psshim-report: --least takes sizes like 16G,24G, not '%s'\n", least_arg);
    free(sizes);
    free(least);
    return EXIT_USAGE;
  }

  struct rp_trace t;
  char err[512];
  if (!rp_load(argv[optind], &t, err, sizeof err)) {
    fprintf(stderr, "psshim-report: %s\n", err);
    free(sizes);
    free(least);
    return EXIT_TRACE;
  }
  if (sizes && !budget) budget = t.hdr.gpu_budget;
  if (sizes && !budget) {
    fprintf(stderr, "psshim-report: the trace records no GPU budget: give --budget SIZE with --chunk-size\n");
    rp_free(&t);
    free(sizes);
    free(least);
    return EXIT_USAGE;
  }
  struct rp_chunks cs;
  bool ok = rp_chunks_build(&t, &cs);
  if (!ok) fprintf(stderr, "psshim-report: out of memory\n");
  /* WHAT TO CHANGE, the least-traffic bound, the chunk-size replay and the HTML read one gathering */
  struct rp_accesses acc = { 0 };
  ok = ok && rp_accesses_gather(&t, &acc);
  ok = ok && rp_text(&t, &cs, &acc, stdout);
  if (ok) ok = least ? rp_least_traffic(&t, &acc, least, nleast, stdout)
                    : rp_least_traffic(&t, &acc, &t.hdr.gpu_budget, t.hdr.gpu_budget != 0, stdout);
  if (ok) ok = rp_plan(&t, &acc, lag, stdout);
  if (ok && sizes) ok = rp_chunk_advice(&acc, sizes, nsizes, budget, stdout);
  if (ok && perfetto) ok = rp_perfetto(&t, perfetto);
  if (ok && html) ok = rp_html(&t, &cs, &acc, html);
  rp_accesses_free(&acc);
  if (t.error[0])
    fprintf(stderr, "psshim-report: %s: %s (the report covers what was readable)\n", t.path, t.error);
  /* Standard output to a full disk fails at the flush, after every line was "written". */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "psshim-report: writing the report to standard output failed: %s\n", strerror(errno));
    ok = false;
  }
  const int rc = t.error[0] ? EXIT_TRACE : !ok ? EXIT_OUTPUT : EXIT_OK;
  rp_chunks_free(&cs);
  rp_free(&t);
  free(sizes);
  free(least);
  return rc;
}
