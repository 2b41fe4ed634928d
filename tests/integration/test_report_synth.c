/* Writes a synthetic psshim trace through the writer API: a 24-layer model in 64 MiB
 * chunks, a 12-chunk GPU budget, six iterations of forward, backward and optimizer with
 * LRU paging, then two of an evaluation loop, app copies, samples and iteration marks. On a
 * synthetic clock, so the numbers are exact.
 *
 * usage: test_report_synth OUT.trace
 * Prints "expect <DATA MOVE row name>|<MB>|<times>" for each kind of transfer it wrote,
 * "where <the parameters' site's where line>" at the last peak of live bytes, and
 * "in-place <the state site's in-place line>", "least <GPU budget in MiB> <MB>" for the LEAST
 * TRAFFIC bound of the last steady iteration at three budgets, "least-run <MiB>" the run's
 * budget among them, "least-paged <MB>", what was paged in during that iteration, and
 * "lap <iteration> <starts at s> <s> <launches> <GB in> <GB named in host frames> <GB out>
 * <pager ms> <late waits>"
 * for each steady iteration (the HTML's table row). Every allocation's stack starts in a
 * frame named like torch's allocator (c10::cuda::CUDACachingAllocator::allocate, mangled)
 * that the report skips; the state's site is a mangled C++ name, synth::Adam::init_state().
 * It also prints "pageouts <N> <back untouched> <still out>": the steady phase's page-outs
 * (they all come back before a launch names them, or stay out).
 *
 * usage: test_report_synth OUT.trace fates
 * Writes a small trace instead whose steady phase pages out one chunk for each way a
 * page-out can end (PAGE-OUTS), and prints the section's lines it must give, "fate <name>|<count>",
 * and "fates <page-outs> <launches that named them while out>"; and the MOVES rows it must
 * give, "moves <direction>|<in place>|<moves>|<median us>|<p90 us>|<mean us>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracer/tracer.h"

enum { LAYERS = 24, SLOTS = 12, ITERS = 6, WARMUP = 2, EVALS = 2 };
#define MIB (1ull << 20)
#define CHUNK (64 * MIB)
#define BASE 0x7f0000000000ull
#define T0 1000000000ull          /* the synthetic clock starts at 1 s */
#define MIGRATE_NS 1220000ull     /* 64 MiB at ~55 GB/s */
#define SAMPLE_NS 5000000ull

static uint64_t now = T0, next_sample = T0;
static bool on_gpu[LAYERS + 1];
/* Device memory psshim does not manage (the CUDA context, libraries' workspaces): it lies
 * outside PSSHIM_GPU_BUDGET, so the report's plan must not take it from the budget; more
 * than the budget here, so a plan that did would leave every chunk in host memory. */
#define CONTEXT_BYTES (2048 * MIB)
static uint64_t last_use[LAYERS + 1], nonmodel = CONTEXT_BYTES, launches;
static uint64_t moved_bytes[2][3], moved_times[2][3]; /* [direction][reason] */
static uint64_t params_gpu_mib; /* the parameters' MiB on the GPU at the last peak of live bytes */
static uint64_t paged_in[ITERS + EVALS], paged_out[ITERS + EVALS]; /* bytes paged during each iteration */
static uint64_t mark_ns[ITERS + EVALS + 1]; /* when each iteration's mark was written */
static int current;
static bool pending[LAYERS + 1];     /* paged out in the steady phase, not back yet */
static uint64_t steady_outs, steady_back; /* those page-outs, and those that came back */

static void emit(struct pst_record r) {
  if (!r.ts_ns) r.ts_ns = now;
  pst_trace_emit(&r);
}

static uint64_t resident(void) {
  uint64_t n = 0;
  for (int c = 0; c <= LAYERS; c++) n += on_gpu[c];
  return n;
}

/* Moves the clock, sampling memory every SAMPLE_NS on the way. */
static void advance(uint64_t ns) {
  now += ns;
  for (; next_sample <= now; next_sample += SAMPLE_NS) {
    const uint64_t gpu = resident() * CHUNK;
    emit((struct pst_record){ .type = PST_REC_SAMPLE, .ts_ns = next_sample,
                              .sample = { gpu, (LAYERS + 1) * CHUNK - gpu, nonmodel, 141ull * 1024 * MIB - gpu - nonmodel } });
  }
}

static void migrate(uint32_t chunk, int dir, int reason) {
  emit((struct pst_record){ .type = PST_REC_MIGRATION, .migration = { chunk, (uint16_t)dir, (uint16_t)reason, CHUNK, now, now + MIGRATE_NS } });
  advance(MIGRATE_NS);
  emit((struct pst_record){ .type = PST_REC_CHUNK,
                            .chunk = { chunk, dir == PST_DIR_H2D ? PST_CHUNK_FRAME_GPU : PST_CHUNK_FRAME_HOST, BASE + chunk * CHUNK, CHUNK } });
  on_gpu[chunk] = dir == PST_DIR_H2D;
  if (dir == PST_DIR_D2H && current >= WARMUP && current < ITERS - 1) { /* between the steady marks */
    pending[chunk] = true;
    steady_outs++;
  } else if (dir == PST_DIR_H2D && pending[chunk]) {
    pending[chunk] = false;
    steady_back++;
  }
  moved_bytes[dir][reason] += CHUNK;
  *(dir == PST_DIR_H2D ? &paged_in[current] : &paged_out[current]) += CHUNK;
  moved_times[dir][reason]++;
}

/* Pages chunk in if needed, evicting the least recently used (never the workspace). */
static void touch(uint32_t chunk, int iteration) {
  last_use[chunk] = now;
  if (on_gpu[chunk]) return;
  if (resident() >= SLOTS + 1) {
    uint32_t victim = 0;
    for (uint32_t c = 0; c < LAYERS; c++)
      if (on_gpu[c] && c != chunk && (!on_gpu[victim] || last_use[c] < last_use[victim])) victim = c;
    migrate(victim, PST_DIR_D2H, PST_REASON_EVICT);
  }
  migrate(chunk, PST_DIR_H2D, iteration < WARMUP ? PST_REASON_DEMAND : PST_REASON_PREFETCH);
}

#define WORKSPACE (BASE + LAYERS * CHUNK)

/* The layer's chunk is paged in first; `in_place` (0: none) is a pointer the kernel also
 * names, read where it is; `workspace`: it names the iteration's workspace too. */
static void launch(const char *kernel, uint32_t layer, int iteration, uint64_t in_place, bool workspace) {
  const uint64_t w = BASE + layer * CHUNK;
  uint64_t ptrs[6] = { w, w + 48 * MIB, w + 4096, 0x10000000ull + layer };
  uint32_t n = 4;
  if (in_place) ptrs[n++] = in_place;
  if (workspace) ptrs[n++] = WORKSPACE;
  touch(layer, iteration);
  emit((struct pst_record){ .type = PST_REC_LAUNCH,
                            .launch = { 0x100, launches++, pst_trace_intern(kernel), n, ptrs } });
  advance(1000000);
}

/* The stack of an allocation, captured in a frame named as torch's caching allocator's
 * would be (the report starts a site's stack past it). The asm keeps the call from becoming
 * a tail call, which would leave no frame. */
__attribute__((visibility("default"), noinline)) uint32_t synth_allocate(void)
    __asm__("_ZN3c104cuda20CUDACachingAllocator8allocateEm");
uint32_t synth_allocate(void) {
  uint32_t id = pst_trace_stack_here(0);
  __asm__ volatile("" : "+r"(id));
  return id;
}

__attribute__((visibility("default"), noinline)) void synth_alloc_params(void) {
  const uint32_t stack = synth_allocate();
  for (uint32_t l = 0; l < LAYERS; l++) {
    const uint32_t place = l < SLOTS ? PST_PLACE_GPU : PST_PLACE_HOST;
    emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { l, PST_CHUNK_CREATED, BASE + l * CHUNK, CHUNK } });
    emit((struct pst_record){ .type = PST_REC_CHUNK,
                              .chunk = { l, place == PST_PLACE_GPU ? PST_CHUNK_FRAME_GPU : PST_CHUNK_FRAME_HOST, BASE + l * CHUNK, CHUNK } });
    emit((struct pst_record){ .type = PST_REC_ALLOC, .alloc = { BASE + l * CHUNK, 48 * MIB, 0x100, stack, l, place } });
    emit((struct pst_record){ .type = PST_REC_ALLOC, .alloc = { BASE + l * CHUNK + 48 * MIB, 8 * MIB, 0x100, stack, l, place } });
    on_gpu[l] = place == PST_PLACE_GPU;
    last_use[l] = now;
  }
  emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { LAYERS, PST_CHUNK_CREATED, BASE + LAYERS * CHUNK, CHUNK } });
  emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { LAYERS, PST_CHUNK_FRAME_GPU, BASE + LAYERS * CHUNK, CHUNK } });
  on_gpu[LAYERS] = true;
}

/* Optimizer state that never leaves its host frame: every optimizer launch reads it in
 * place (a chunk past the layers' and the workspace's). */
#define STATE_CHUNK (LAYERS + 1)
#define STATE_ADDR (BASE + STATE_CHUNK * CHUNK)
__attribute__((visibility("default"), noinline)) void synth_alloc_state(void) __asm__("_ZN5synth4Adam10init_stateEv");
void synth_alloc_state(void) {
  emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { STATE_CHUNK, PST_CHUNK_CREATED, STATE_ADDR, CHUNK } });
  emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { STATE_CHUNK, PST_CHUNK_FRAME_HOST, STATE_ADDR, CHUNK } });
  emit((struct pst_record){ .type = PST_REC_ALLOC,
                            .alloc = { STATE_ADDR, 16 * MIB, 0x100, synth_allocate(), STATE_CHUNK, PST_PLACE_HOST } });
}

__attribute__((visibility("default"), noinline)) void synth_alloc_workspace(bool alloc) {
  const uint64_t addr = WORKSPACE;
  if (alloc) { /* live bytes peak here, every iteration: the last time is the report's */
    params_gpu_mib = 0;
    for (uint32_t l = 0; l < LAYERS; l++) params_gpu_mib += on_gpu[l] ? 56 : 0;
    emit((struct pst_record){ .type = PST_REC_ALLOC, .alloc = { addr, 4 * MIB, 0x100, synth_allocate(), LAYERS, PST_PLACE_GPU } });
  } else
    emit((struct pst_record){ .type = PST_REC_FREE, .free = { addr, 0x100 } });
}

/* Warm-up marks: the first with no period, the next with a short period taken for the
 * iteration (as the tracer's early guesses are), then the step's own. */
static uint64_t pager_total_ns, late_total; /* the pager's totals the marks carry */

/* The pager's host time in iteration it (ms) and the launches that waited for a remap in it. */
static uint64_t pager_ms(int it) { return 2 + (uint64_t)it; }
static uint64_t late_in(int it) { return (uint64_t)it % 3; }

static void mark(int it, uint64_t period) {
  emit((struct pst_record){ .type = PST_REC_ITERATION,
                            .iteration = { .iteration = (uint64_t)it, .period = period, .pager_ns = pager_total_ns,
                                           .turns_ns = pager_total_ns / 2, .late_waits = late_total } });
}

static void iteration(int it) {
  current = it;
  mark_ns[it] = now;
  const uint64_t period = it == 0 ? 0 : it < WARMUP ? 7 : LAYERS * 5;
  mark(it, period);
  pager_total_ns += pager_ms(it) * 1000000;
  late_total += late_in(it);
  emit((struct pst_record){ .type = PST_REC_COPY, .copy = { PST_COPY_H2D, 8000000, 0x5000, BASE + LAYERS * CHUNK, 0x100, now, now + 200000 } });
  advance(200000);
  synth_alloc_workspace(true);
  for (uint32_t l = 0; l < LAYERS; l++) {
    launch("ampere_bf16_gemm_fwd", l, it, 0, l == 0); /* writes the workspace first */
    launch("gelu_fwd", l, it, 0, false);
    nonmodel += 8 * MIB;
  }
  for (uint32_t l = LAYERS; l-- > 0;) {
    launch("ampere_bf16_gemm_bwd", l, it, 0, false);
    launch("gelu_bwd", l, it, 0, false);
    nonmodel -= 8 * MIB;
  }
  for (uint32_t l = 0; l < LAYERS; l++) launch("multi_tensor_apply_adamw", l, it, STATE_ADDR, true);
  synth_alloc_workspace(false);
  emit((struct pst_record){ .type = PST_REC_COPY, .copy = { PST_COPY_D2H, 4000, BASE, 0x6000, 0x100, now, now + 10000 } });
  advance(10000);
  emit((struct pst_record){ .type = PST_REC_SYNC, .sync = { PST_SYNC_DEVICE, 0 } });
  pst_trace_flush(); /* the synthetic clock outruns the flush thread's */
}

/* After training, an evaluation loop with its own period: a forward pass over the last
 * four layers. */
static void evaluation(int it) {
  current = it;
  mark_ns[it] = now;
  mark(it, 4);
  for (uint32_t l = LAYERS - 4; l < LAYERS; l++) launch("ampere_bf16_gemm_eval", l, it, 0, false);
}

/* The fates trace: 2 MiB chunks; three marks of one period, the steady phase between the
 * first and the last; in it, one chunk paged out for each ending (chunk 6 before it). */
#define FBASE 0x7e0000000000ull
#define FCHUNK (2 * MIB)
static void fate_alloc(uint64_t chunk, uint64_t off, uint64_t size) {
  emit((struct pst_record){ .type = PST_REC_ALLOC, .alloc = { FBASE + chunk * FCHUNK + off, size, 0x100, 0, (uint32_t)chunk, PST_PLACE_GPU } });
  advance(1000);
}
static void fate_free(uint64_t chunk, uint64_t off) {
  emit((struct pst_record){ .type = PST_REC_FREE, .free = { FBASE + chunk * FCHUNK + off, 0x100 } });
  advance(1000);
}
/* A move whose thread spent us microseconds on it (MOVES). */
static void fate_move_took(uint32_t chunk, int dir, uint64_t us) {
  emit((struct pst_record){ .type = PST_REC_MIGRATION, .migration = { chunk, (uint16_t)dir, dir == PST_DIR_H2D ? PST_REASON_PREFETCH : PST_REASON_EVICT, FCHUNK, now, now + us * 1000 } });
  advance(us * 1000);
}
static void fate_move(uint32_t chunk, int dir) { fate_move_took(chunk, dir, 1); }
static void fate_launch(uint64_t chunk, uint64_t off) {
  const uint64_t ptrs[] = { FBASE + chunk * FCHUNK + off };
  emit((struct pst_record){ .type = PST_REC_LAUNCH, .launch = { 0x100, launches++, pst_trace_intern("k"), 1, ptrs } });
  advance(1000);
}
static void fate_mark(uint64_t it) {
  emit((struct pst_record){ .type = PST_REC_ITERATION, .iteration = { .iteration = it, .period = 10 } });
  advance(1000);
}

static int fates(const char *path) {
  const struct pst_trace_header h = { .chunk_size = FCHUNK, .gpu_budget = 8 * FCHUNK, .host_budget = 64 * FCHUNK,
                                      .device = "NVIDIA H200 (synthetic)", .space_base = FBASE,
                                      .space_size = 64 * FCHUNK, .start_ns = T0, .wall_ns = 1764403200000000000ull };
  if (!pst_trace_open(path, &h)) return 1;
  for (uint64_t c = 0; c < 8; c++) fate_alloc(c, 0, c == 4 ? MIB : c == 7 ? 2 * FCHUNK : FCHUNK);
  fate_alloc(4, MIB, MIB);            /* chunk 4 holds two allocations */
  fate_alloc(9, 0, UINT64_MAX / 2);   /* damaged sizes and ids count for nothing, and grow nothing */
  fate_move(6, PST_DIR_D2H);          /* before the steady phase: not counted */
  fate_mark(0);
  fate_mark(1);
  fate_move_took(6, PST_DIR_H2D, 100);
  for (uint32_t c = 0; c < 6; c++) fate_move_took(c, PST_DIR_D2H, 100 * (c + 1));
  fate_move_took(8, PST_DIR_D2H, 700); /* the second chunk of chunk 7's allocation */
  fate_move_took(UINT32_MAX - 1, PST_DIR_D2H, 800);
  fate_move_took(0, PST_DIR_H2D, 300); /* back untouched */
  fate_launch(1, 0);
  fate_launch(1, 0);
  fate_move_took(1, PST_DIR_H2D, 900); /* read in place twice, then back: after an in-place launch */
  fate_free(2, 0);                    /* freed untouched */
  fate_launch(3, 0);
  fate_free(3, 0);                    /* read in place, then freed */
  fate_free(4, 0);                    /* half of it freed: its data lives on */
  fate_launch(4, MIB);
  fate_free(4, MIB);                  /* read in place, then freed */
  fate_launch(7, 0);                  /* names chunk 8 too */
  emit((struct pst_record){ .type = PST_REC_CHUNK, .chunk = { 8, PST_CHUNK_RELEASED, FBASE + 8 * FCHUNK, FCHUNK } });
  advance(1000);
  fate_mark(2);                       /* chunk 5 stays out */
  pst_trace_close();
  printf("fate back on the GPU before any launch named them|1\n");
  printf("fate read in place, then back on the GPU|1\n");
  printf("fate freed untouched (the copy out bought nothing)|1\n");
  printf("fate read in place, then freed|3\n");
  printf("fate still out at the end|1\n");
  printf("fates 7 5\n");
  /* MOVES (median: the upper middle one; p90: the one at nine tenths, rounded down) */
  printf("moves in (h2d)|yes|1|900|900|900\n");
  printf("moves in (h2d)|no|2|300|300|200\n");
  printf("moves out (d2h)|no|8|500|800|450\n");
  return 0;
}

/* GPU memory that moves between chunks and non-model memory, its sum the budget at every
 * sample: two samples a bin of the HTML's chart, so a chart that stacks each class's peak
 * apart draws half as much again above the budget, at no moment in use. */
static int stack(const char *path) {
  const struct pst_trace_header h = { .chunk_size = FCHUNK, .gpu_budget = 64 * FCHUNK, .host_budget = 64 * FCHUNK,
                                      .device = "NVIDIA H200 (synthetic)", .space_base = FBASE,
                                      .space_size = 64 * FCHUNK, .start_ns = T0, .wall_ns = 1764403200000000000ull };
  if (!pst_trace_open(path, &h)) return 1;
  for (uint64_t k = 0; k < 1200; k++) {
    const uint64_t gpu = k % 2 ? h.gpu_budget : h.gpu_budget / 2;
    emit((struct pst_record){ .type = PST_REC_SAMPLE, .ts_ns = T0 + k * 1000000,
                              .sample = { gpu, 0, h.gpu_budget - gpu, 8 * h.gpu_budget } });
  }
  pst_trace_close();
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[2], "fates")) return fates(argv[1]);
  if (argc == 3 && !strcmp(argv[2], "stack")) return stack(argv[1]);
  /* far: one sample's time far ahead of the rest (2^63 - 1 ns), in a trace that is
   * otherwise the one below: valid, and a test of every time scale the report draws */
  const bool far = argc == 3 && !strcmp(argv[2], "far");
  if (argc != 2 && !far) {
    fprintf(stderr, "usage: test_report_synth OUT.trace [fates|stack|far]\n");
    return 1;
  }
  const struct pst_trace_header h = { .chunk_size = CHUNK, .gpu_budget = (SLOTS + 1) * CHUNK + 256 * MIB,
                                      .host_budget = 8192 * MIB, .device = "NVIDIA H200 (synthetic)",
                                      .space_base = BASE, .space_size = 1ull << 40, .start_ns = T0,
                                      .wall_ns = 1764403200000000000ull /* 2025-11-29 08:00 UTC */ };
  if (!pst_trace_open(argv[1], &h)) return 1;
  emit((struct pst_record){ .type = PST_REC_NOTE, .note = { 0, "synthetic trace written by test_report_synth" } });
  synth_alloc_params();
  synth_alloc_state();
  advance(2000000);
  for (int it = 0; it < ITERS; it++) iteration(it);
  for (int it = ITERS; it < ITERS + EVALS; it++) evaluation(it);
  if (far)
    emit((struct pst_record){ .type = PST_REC_SAMPLE, .ts_ns = INT64_MAX, .sample = { CHUNK, 0, nonmodel, CHUNK } });
  pst_trace_close();

  printf("where %llu MiB on the GPU, %llu MiB in host frames\n", (unsigned long long)params_gpu_mib,
         (unsigned long long)(LAYERS * 56 - params_gpu_mib));
  printf("in-place %d launches, %d MiB\n", LAYERS, LAYERS * 16); /* a steady iteration's, of the state */
  /* Each pass of a steady iteration reads every layer's 56 MiB, written before it; the
   * optimizer's also the state's 16 MiB and the workspace's 4, which the forward wrote
   * first (so it costs the forward nothing): what does not fit in the budget crosses in each
   * pass. A brute force over every cut of the 120 launches finds no better bound at these
   * budgets than the cuts between the passes (nor any at 2 GiB, where all fits). */
  const uint64_t pass = LAYERS * 56, opt = pass + 16 + 4, budgets[] = { h.gpu_budget / MIB, 512, 2048 };
  for (int b = 0; b < 3; b++) {
    const uint64_t over = pass > budgets[b] ? pass - budgets[b] : 0, over_opt = opt > budgets[b] ? opt - budgets[b] : 0;
    printf("least %llu %.1f\n", (unsigned long long)budgets[b], (double)((2 * over + over_opt) * MIB) / 1e6);
  }
  printf("least-run %llu\n", (unsigned long long)budgets[0]);
  printf("pageouts %llu %llu %llu\n", (unsigned long long)steady_outs, (unsigned long long)steady_back,
         (unsigned long long)(steady_outs - steady_back));
  printf("least-paged %.1f\n", (double)paged_in[ITERS - 2] / 1e6); /* the report's window */
  for (int it = WARMUP; it < ITERS - 1; it++) /* the laps between the steady marks */
    printf("lap %d %.3f %.3f %d %.2f %.2f %.2f %llu %llu\n", it, (double)(mark_ns[it] - T0) / 1e9,
           (double)(mark_ns[it + 1] - mark_ns[it]) / 1e9, LAYERS * 5, (double)paged_in[it] / 1e9,
           (double)(LAYERS * 16 * MIB) / 1e9, (double)paged_out[it] / 1e9, (unsigned long long)pager_ms(it),
           (unsigned long long)late_in(it));
  printf("expect app copy h2d|%.3f|%d\n", 8.0 * ITERS, ITERS);
  printf("expect app copy d2h|%.3f|%d\n", 0.004 * ITERS, ITERS);
  for (int d = 0; d < 2; d++)
    for (int r = 0; r < 3; r++)
      if (moved_times[d][r])
        printf("expect paging %s (%s)|%.3f|%llu\n", pst_direction_name((unsigned)d), pst_reason_name((unsigned)r),
               (double)moved_bytes[d][r] / 1e6, (unsigned long long)moved_times[d][r]);
  return 0;
}
