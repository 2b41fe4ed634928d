/* Kernels are host functions registered by the test. A launch copies the arguments
 * into a real parameter buffer laid out at the registered offsets — from the
 * kernelParams array or from the extra CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE form — at
 * call time (the caller may reuse its arguments at once, as on CUDA), then the stream's
 * worker calls fn(args, user) with args[i] pointing into that buffer. The grid and
 * block dimensions are checked and otherwise ignored: fn runs once. A kernel touching
 * an unmapped address kills the process by SIGSEGV, as a GPU fault kills a job. */
#include <stdlib.h>
#include <string.h>

#include "fakecuda_internal.h"

static struct fc_handles kernels = FC_HANDLES_INIT;

static CUfunction register_kernel(const char *name, fakecuda_kernel_fn fn, void *user, size_t nparams,
                                  const size_t *sizes, const size_t *offsets) {
  if (!name || !fn || (nparams && !sizes)) return NULL;
  struct CUfunc_st *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->name = strdup(name);
  f->fn = fn;
  f->user = user;
  f->nparams = nparams;
  f->sizes = calloc(nparams ? nparams : 1, sizeof *f->sizes);
  f->offsets = calloc(nparams ? nparams : 1, sizeof *f->offsets);
  bool ok = f->name && f->sizes && f->offsets;
  size_t end = 0;
  for (size_t i = 0; ok && i < nparams; i++) {
    size_t size = sizes[i], align = 1;
    ok = size > 0 && size <= 4096; /* CUDA's classic parameter-space limit */
    while (align * 2 <= size && align < 8) align *= 2;
    f->sizes[i] = size;
    f->offsets[i] = offsets ? offsets[i] : (end + align - 1) & ~(align - 1);
    if (f->offsets[i] + size > end) end = f->offsets[i] + size;
    for (size_t j = 0; ok && offsets && j < i; j++) /* explicit layouts must not overlap */
      ok = f->offsets[i] >= f->offsets[j] + f->sizes[j] || f->offsets[j] >= f->offsets[i] + size;
  }
  f->bufsize = end;
  if (!ok || !fc_handles_add(&kernels, f)) {
    free(f->name);
    free(f->sizes);
    free(f->offsets);
    free(f);
    return NULL;
  }
  return f;
}

FC_EXPORT CUfunction fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn, void *user, size_t nparams,
                                              const size_t *param_sizes) {
  return register_kernel(name, fn, user, nparams, param_sizes, NULL);
}

FC_EXPORT CUfunction fakecuda_register_kernel_layout(const char *name, fakecuda_kernel_fn fn, void *user,
                                                     size_t nparams, const size_t *param_sizes,
                                                     const size_t *param_offsets) {
  if (!param_offsets && nparams) return NULL;
  return register_kernel(name, fn, user, nparams, param_sizes, param_offsets);
}

/* The kernel runs on device dev: the reserved addresses its parameters hold become that
 * device's view of them (the hits keep the launched values, read by fc_check_unqueued). */
void fc_run_kernel(struct fc_op *op, int dev) {
  struct CUfunc_st *f = op->u.kernel.f;
  for (size_t i = 0; i < op->u.kernel.nhits; i++) {
    void *v = fc_device_view(dev, op->u.kernel.hits[i].va);
    memcpy(op->u.kernel.buf + op->u.kernel.hits[i].off, &v, sizeof v);
  }
  f->fn(op->u.kernel.args, f->user);
}

/* Every 4-byte-aligned 8-byte word inside a parameter that holds a reserved address (a
 * pointer in a struct parameter may sit at any 4-byte offset). Returns how many. */
static size_t find_hits(const struct CUfunc_st *f, const unsigned char *buf, struct fc_hit *hits) {
  size_t n = 0;
  for (size_t i = 0; i < f->nparams; i++) {
    size_t end = f->offsets[i] + f->sizes[i];
    for (size_t off = (f->offsets[i] + 3) & ~(size_t)3; off + 8 <= end;) {
      CUdeviceptr v;
      memcpy(&v, buf + off, sizeof v);
      if (v && fc_vmm_reserved(v, 1)) {
        hits[n++] = (struct fc_hit){off, v};
        off += 8;
      } else {
        off += 4;
      }
    }
  }
  return n;
}

static CUresult check_func(CUfunction f) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  return fc_handles_has(&kernels, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult param_info(CUfunction f, size_t index, size_t *offset, size_t *size) {
  CUresult r = check_func(f);
  if (r != CUDA_SUCCESS) return r;
  if (!offset || index >= f->nparams) return CUDA_ERROR_INVALID_VALUE;
  *offset = f->offsets[index];
  if (size) *size = f->sizes[index];
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
  FC_TRACED(cuFuncGetParamInfo, param_info(func, paramIndex, paramOffset, paramSize), func, paramIndex, paramOffset,
            paramSize);
}

static CUresult func_name(const char **name, CUfunction f) {
  CUresult r = check_func(f);
  if (r != CUDA_SUCCESS) return r;
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  *name = f->name;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
  FC_TRACED(cuFuncGetName, func_name(name, hfunc), name, hfunc);
}

/* CUDA lets a library kernel (CUkernel) stand where a CUfunction goes; a registered
 * fake kernel is both, so the CUkernel queries answer for the same handles. */
FC_EXPORT CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
  FC_TRACED(cuKernelGetParamInfo, param_info((CUfunction)(void *)kernel, paramIndex, paramOffset, paramSize), kernel,
            paramIndex, paramOffset, paramSize);
}
FC_EXPORT CUresult cuKernelGetName(const char **name, CUkernel hfunc) {
  FC_TRACED(cuKernelGetName, func_name(name, (CUfunction)(void *)hfunc), name, hfunc);
}

/* Copies the arguments into buf: from kernelParams (one pointer per parameter) or
 * from extra's packed buffer, which must hold at least the whole layout. */
static CUresult fill_params(struct CUfunc_st *f, void **params, void **extra, unsigned char *buf) {
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  if (extra) {
    const void *src = NULL;
    const size_t *psize = NULL;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        src = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        psize = extra[i + 1];
      else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (f->bufsize && (!src || !psize || *psize < f->bufsize)) return CUDA_ERROR_INVALID_VALUE;
    if (f->bufsize) memcpy(buf, src, f->bufsize);
    return CUDA_SUCCESS;
  }
  if (f->nparams && !params) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < f->nparams; i++) {
    if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
    memcpy(buf + f->offsets[i], params[i], f->sizes[i]);
  }
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       CUstream h, void **params, void **extra, bool per_thread) {
  struct CUctx_st *c;
  struct CUstream_st *s;
  CUresult r = fc_current_ctx(&c);
  if (r == CUDA_SUCCESS) r = check_func(f);
  if (r != CUDA_SUCCESS) return r;
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  /* One allocation: the op, then args[], then the 16-aligned parameter buffer, then room
   * for a hit per 4 bytes of it. */
  size_t head = (sizeof(struct fc_op) + f->nparams * sizeof(void *) + 15) & ~(size_t)15;
  size_t hits_at = (head + f->bufsize + 15) & ~(size_t)15;
  struct fc_op *op = fc_op_new(FC_OP_KERNEL, hits_at - sizeof(struct fc_op) + f->bufsize / 4 * sizeof(struct fc_hit));
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  void **args = (void **)(op + 1);
  unsigned char *buf = (unsigned char *)op + head;
  r = fill_params(f, params, extra, buf);
  if (r != CUDA_SUCCESS) {
    free(op);
    return r;
  }
  for (size_t i = 0; i < f->nparams; i++) args[i] = buf + f->offsets[i];
  op->u.kernel.f = f;
  op->u.kernel.args = args;
  op->u.kernel.buf = buf;
  op->u.kernel.hits = (struct fc_hit *)((unsigned char *)op + hits_at);
  op->u.kernel.nhits = find_hits(f, buf, op->u.kernel.hits);
  return fc_submit(s, op, false);
}

FC_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  FC_TRACED(cuLaunchKernel,
            launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra,
                   false),
            f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams,
            extra);
}
FC_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                       unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra) {
  FC_TRACED(cuLaunchKernel_ptsz,
            launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra,
                   true),
            f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams,
            extra);
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra, bool per_thread) {
  if (!cfg || (cfg->numAttrs && !cfg->attrs)) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ,
                cfg->hStream, params, extra, per_thread);
}
FC_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
  FC_TRACED(cuLaunchKernelEx, launch_ex(config, f, kernelParams, extra, false), config, f, kernelParams, extra);
}
FC_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                         void **extra) {
  FC_TRACED(cuLaunchKernelEx_ptsz, launch_ex(config, f, kernelParams, extra, true), config, f, kernelParams, extra);
}
