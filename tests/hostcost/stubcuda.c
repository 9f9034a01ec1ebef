/* A stand-in for libcuda.so.1, so numbapos's real CUDA host path runs without a GPU.

   What: enough of the CUDA driver API for numba-cuda, cuda.core and cuda-bindings to
   make a context, compile kernels (NVVM makes the PTX; "linking" returns a fake cubin),
   load modules and launch. Kernels do not run; device memory is host memory
   (cuMemAlloc is aligned_alloc, copies and memsets are memcpy / memset); every call
   returns at once and succeeds.

   Why: host cost (microseconds, launches, allocations, Python calls per op) is set by
   the host code alone, so it can be measured, and gated in CI, on a machine with no
   GPU (tests/hostcost). The driver-level counters below check numbapos's own counts
   and catch synchronisations and device-to-host copies inside an op.

   How it is found: cuda-bindings dlopens libcuda.so.1 (LD_LIBRARY_PATH points at this
   library) and resolves every function through cuGetProcAddress_v2, which returns this
   library's stub_<name>. STUB_CUDA_LOG=1 prints the names asked for that it lacks.
   Build: gcc -O2 -shared -fPIC -o libcuda.so.1 stubcuda.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, NOT_FOUND = 500 };

/* Counters, read with stub_counters(); their names, in order, in stub_counter_names. */
enum { LAUNCHES, DEVICE_ALLOCS, HOST_ALLOCS, FREES, COPIES_HTOD, COPIES_DTOH, COPIES_DTOD,
       MEMSETS, SYNCS, N_COUNTERS };
__attribute__((visibility("default")))
const char stub_counter_names[] =
    "launches,device_allocs,host_allocs,frees,copies_htod,copies_dtoh,copies_dtod,memsets,syncs";
static long long counters[N_COUNTERS];

/* Copy up to n counters to out; returns how many there are. */
__attribute__((visibility("default")))
int stub_counters(long long *out, int n) {
    for (int i = 0; i < n && i < N_COUNTERS; i++) out[i] = counters[i];
    return N_COUNTERS;
}

static int ctx_token = 1, stream_token, event_token, module_token, function_token;
static void *current_ctx;

static void *host_block(size_t n) { return aligned_alloc(256, (n + 255) / 256 * 256 + 256); }

#define API(name) __attribute__((visibility("default"))) CUresult stub_##name

/* ---------------------------------------------------------------- driver, device */
API(cuInit)(unsigned int flags) { return OK; }
API(cuDriverGetVersion)(int *v) { *v = 12090; return OK; }
API(cuDeviceGetCount)(int *n) { *n = 1; return OK; }
API(cuDeviceGet)(int *d, int ordinal) { *d = ordinal; return OK; }
API(cuDeviceGetName)(char *name, int len, int dev) { strncpy(name, "Stub GPU", len); return OK; }
API(cuDeviceGetUuid)(unsigned char *uuid, int dev) { memset(uuid, 7, 16); return OK; }
API(cuDeviceTotalMem)(size_t *bytes, int dev) { *bytes = (size_t)80 << 30; return OK; }
API(cuDeviceGetAttribute)(int *value, int attrib, int dev) {
    switch (attrib) {  /* an H100's (CUdevice_attribute numbers) */
    case 1: case 2: case 3: *value = 1024; break;  /* threads per block, block dim x, y */
    case 4: *value = 64; break;                    /* block dim z */
    case 5: *value = 2147483647; break;            /* grid dim x */
    case 6: case 7: *value = 65535; break;         /* grid dim y, z */
    case 8: *value = 49152; break;                 /* shared memory per block */
    case 10: *value = 32; break;                   /* warp size */
    case 16: *value = 132; break;                  /* multiprocessors */
    case 19: case 41: *value = 1; break;           /* maps host memory, unified addressing */
    case 39: *value = 2048; break;                 /* threads per multiprocessor */
    case 75: *value = 9; break;                    /* compute capability 9.0 */
    case 76: *value = 0; break;
    case 81: case 82: *value = 65536; break;       /* shared memory, registers per SM */
    case 97: *value = 233472; break;               /* shared memory per block, opt-in */
    default: *value = 0;
    }
    return OK;
}

/* ---------------------------------------------------------------- contexts */
API(cuDevicePrimaryCtxRetain)(void **ctx, int dev) { *ctx = &ctx_token; return OK; }
API(cuDevicePrimaryCtxRelease)(int dev) { return OK; }
API(cuDevicePrimaryCtxReset)(int dev) { return OK; }
API(cuDevicePrimaryCtxGetState)(int dev, unsigned *flags, int *active) {
    *flags = 0; *active = current_ctx != 0; return OK;
}
API(cuDevicePrimaryCtxSetFlags)(int dev, unsigned flags) { return OK; }
API(cuCtxPushCurrent)(void *ctx) { current_ctx = ctx; return OK; }
API(cuCtxPopCurrent)(void **ctx) { if (ctx) *ctx = current_ctx; current_ctx = 0; return OK; }
API(cuCtxGetCurrent)(void **ctx) { *ctx = current_ctx; return OK; }
API(cuCtxSetCurrent)(void *ctx) { current_ctx = ctx; return OK; }
API(cuCtxGetDevice)(int *dev) { *dev = 0; return OK; }
API(cuCtxSynchronize)(void) { counters[SYNCS]++; return OK; }
API(cuCtxGetApiVersion)(void *ctx, unsigned *v) { *v = 12090; return OK; }
API(cuCtxGetId)(void *ctx, unsigned long long *id) { *id = 1; return OK; }
API(cuCtxGetFlags)(unsigned *flags) { *flags = 0; return OK; }
API(cuCtxSetFlags)(unsigned flags) { return OK; }
API(cuCtxGetLimit)(size_t *v, int limit) { *v = 1 << 20; return OK; }
API(cuCtxSetLimit)(int limit, size_t v) { return OK; }
API(cuCtxGetStreamPriorityRange)(int *lo, int *hi) { *lo = 0; *hi = -5; return OK; }
API(cuDeviceGetStreamPriorityRange)(int *lo, int *hi) { *lo = 0; *hi = -5; return OK; }

/* ---------------------------------------------------------------- memory */
API(cuMemGetInfo)(size_t *free_, size_t *total) {
    *free_ = (size_t)70 << 30; *total = (size_t)80 << 30; return OK;
}
API(cuMemAlloc)(CUdeviceptr *p, size_t n) {
    counters[DEVICE_ALLOCS]++; *p = (CUdeviceptr)host_block(n); return OK;
}
API(cuMemAllocAsync)(CUdeviceptr *p, size_t n, void *s) { return stub_cuMemAlloc(p, n); }
API(cuMemFree)(CUdeviceptr p) { counters[FREES]++; free((void *)p); return OK; }
API(cuMemFreeAsync)(CUdeviceptr p, void *s) { return stub_cuMemFree(p); }
API(cuMemHostAlloc)(void **p, size_t n, unsigned flags) {
    counters[HOST_ALLOCS]++; *p = host_block(n); memset(*p, 0, n); return OK;
}
API(cuMemAllocHost)(void **p, size_t n) { return stub_cuMemHostAlloc(p, n, 0); }
API(cuMemFreeHost)(void *p) { counters[FREES]++; free(p); return OK; }
API(cuMemHostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned flags) {
    *d = (CUdeviceptr)p; return OK;
}
API(cuMemHostRegister)(void *p, size_t n, unsigned flags) { return OK; }
API(cuMemHostUnregister)(void *p) { return OK; }
API(cuMemcpyHtoD)(CUdeviceptr d, const void *h, size_t n) {
    counters[COPIES_HTOD]++; memcpy((void *)d, h, n); return OK;
}
API(cuMemcpyDtoH)(void *h, CUdeviceptr d, size_t n) {
    counters[COPIES_DTOH]++; memcpy(h, (void *)d, n); return OK;
}
API(cuMemcpyDtoD)(CUdeviceptr a, CUdeviceptr b, size_t n) {
    counters[COPIES_DTOD]++; memmove((void *)a, (void *)b, n); return OK;
}
API(cuMemcpyHtoDAsync)(CUdeviceptr d, const void *h, size_t n, void *s) {
    return stub_cuMemcpyHtoD(d, h, n);
}
API(cuMemcpyDtoHAsync)(void *h, CUdeviceptr d, size_t n, void *s) {
    return stub_cuMemcpyDtoH(h, d, n);
}
API(cuMemcpyDtoDAsync)(CUdeviceptr a, CUdeviceptr b, size_t n, void *s) {
    return stub_cuMemcpyDtoD(a, b, n);
}
/* Unified addressing: the direction is unknown, and counted as device to device. */
API(cuMemcpy)(CUdeviceptr a, CUdeviceptr b, size_t n) { return stub_cuMemcpyDtoD(a, b, n); }
API(cuMemcpyAsync)(CUdeviceptr a, CUdeviceptr b, size_t n, void *s) {
    return stub_cuMemcpyDtoD(a, b, n);
}
API(cuMemsetD8)(CUdeviceptr d, unsigned char v, size_t n) {
    counters[MEMSETS]++; memset((void *)d, v, n); return OK;
}
API(cuMemsetD8Async)(CUdeviceptr d, unsigned char v, size_t n, void *s) {
    return stub_cuMemsetD8(d, v, n);
}
API(cuMemsetD32)(CUdeviceptr d, unsigned v, size_t n) {
    counters[MEMSETS]++;
    for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v;
    return OK;
}
API(cuMemsetD32Async)(CUdeviceptr d, unsigned v, size_t n, void *s) {
    return stub_cuMemsetD32(d, v, n);
}
API(cuMemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    if (base) *base = p;
    if (size) *size = 0;
    return OK;
}
API(cuPointerGetAttribute)(void *data, int attr, CUdeviceptr p) {
    switch (attr) {
    case 1: *(void **)data = &ctx_token; break;  /* context */
    case 2: *(unsigned *)data = 2; break;        /* memory type: device */
    case 3: *(CUdeviceptr *)data = p; break;     /* device pointer */
    case 4: *(void **)data = (void *)p; break;   /* host pointer */
    case 9: *(int *)data = 0; break;             /* device ordinal */
    default: memset(data, 0, 8);
    }
    return OK;
}
API(cuPointerGetAttributes)(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    for (unsigned i = 0; i < n; i++) stub_cuPointerGetAttribute(data[i], attrs[i], p);
    return OK;
}

/* ---------------------------------------------------------------- streams, events */
API(cuStreamCreate)(void **s, unsigned flags) {
    *s = (void *)(intptr_t)(0x1000 + ++stream_token); return OK;
}
API(cuStreamCreateWithPriority)(void **s, unsigned flags, int prio) {
    return stub_cuStreamCreate(s, flags);
}
API(cuStreamDestroy)(void *s) { return OK; }
API(cuStreamSynchronize)(void *s) { counters[SYNCS]++; return OK; }
API(cuStreamQuery)(void *s) { return OK; }
API(cuStreamWaitEvent)(void *s, void *e, unsigned f) { return OK; }
API(cuStreamGetPriority)(void *s, int *p) { *p = 0; return OK; }
API(cuStreamGetFlags)(void *s, unsigned *f) { *f = 0; return OK; }
API(cuStreamGetCtx)(void *s, void **c) { *c = &ctx_token; return OK; }
API(cuStreamGetId)(void *s, unsigned long long *id) {
    *id = (unsigned long long)(intptr_t)s; return OK;
}
API(cuStreamGetDevice)(void *s, int *d) { *d = 0; return OK; }
API(cuStreamIsCapturing)(void *s, int *status) { *status = 0; return OK; }
API(cuEventCreate)(void **e, unsigned f) {
    *e = (void *)(intptr_t)(0x2000 + ++event_token); return OK;
}
API(cuEventDestroy)(void *e) { return OK; }
API(cuEventRecord)(void *e, void *s) { return OK; }
API(cuEventSynchronize)(void *e) { counters[SYNCS]++; return OK; }
API(cuEventQuery)(void *e) { return OK; }
API(cuEventElapsedTime)(float *ms, void *a, void *b) { *ms = 0; return OK; }

/* ---------------------------------------------------------------- modules, kernels */
API(cuModuleLoadDataEx)(void **m, const void *image, unsigned n, int *opts, void **vals) {
    *m = (void *)(intptr_t)(0x3000 + ++module_token); return OK;
}
API(cuModuleLoadData)(void **m, const void *image) {
    return stub_cuModuleLoadDataEx(m, image, 0, 0, 0);
}
API(cuModuleUnload)(void *m) { return OK; }
API(cuModuleGetFunction)(void **f, void *m, const char *name) {
    *f = (void *)(intptr_t)(0x100000 + ++function_token); return OK;
}
API(cuModuleGetGlobal)(CUdeviceptr *p, size_t *n, void *m, const char *name) {
    *p = (CUdeviceptr)calloc(1, 4096);  /* a module's global variable, never freed */
    if (n) *n = 8;
    return OK;
}
API(cuLibraryLoadData)(void **lib, const void *code, void *jo, void *jv, unsigned nj, void *lo,
                       void *lv, unsigned nl) {
    *lib = (void *)(intptr_t)(0x4000 + ++module_token); return OK;
}
API(cuLibraryUnload)(void *lib) { return OK; }
API(cuLibraryGetKernel)(void **k, void *lib, const char *name) {
    *k = (void *)(intptr_t)(0x100000 + ++function_token); return OK;
}
API(cuLibraryGetModule)(void **m, void *lib) { *m = lib; return OK; }
API(cuLibraryGetGlobal)(CUdeviceptr *p, size_t *n, void *lib, const char *name) {
    return stub_cuModuleGetGlobal(p, n, lib, name);
}
API(cuKernelGetFunction)(void **f, void *k) { *f = k; return OK; }
API(cuKernelGetAttribute)(int *v, int attr, void *k, int dev) {
    *v = attr == 0 ? 1024 : 32; return OK;
}
API(cuKernelGetName)(const char **name, void *k) { *name = "stub_kernel"; return OK; }
API(cuFuncGetAttribute)(int *v, int attr, void *f) {
    *v = attr == 0 ? 1024 : attr == 4 ? 32 : 0;  /* max threads per block; registers */
    return OK;
}
API(cuFuncSetAttribute)(void *f, int attr, int v) { return OK; }
API(cuFuncSetCacheConfig)(void *f, int c) { return OK; }
API(cuFuncGetName)(const char **name, void *f) { *name = "stub_kernel"; return OK; }
API(cuLaunchKernel)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                    unsigned bz, unsigned shmem, void *s, void **params, void **extra) {
    counters[LAUNCHES]++; return OK;
}
API(cuLaunchKernelEx)(const void *config, void *f, void **params, void **extra) {
    counters[LAUNCHES]++; return OK;
}
API(cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *n, void *f, int bs, size_t sh) {
    *n = 8; return OK;
}
API(cuOccupancyMaxPotentialBlockSize)(int *grid, int *block, void *f, void *cb, size_t sh,
                                      int lim) {
    *grid = 264; *block = 1024; return OK;
}
API(cuLinkCreate)(unsigned n, int *o, void **v, void **state) { *state = malloc(1); return OK; }
API(cuLinkAddData)(void *st, int type, void *data, size_t size, const char *name, unsigned n,
                   int *o, void **v) {
    return OK;
}
API(cuLinkAddFile)(void *st, int type, const char *path, unsigned n, int *o, void **v) {
    return OK;
}
static char fake_cubin[64] = "stub cubin";  /* never to be loaded by a real driver */
API(cuLinkComplete)(void *st, void **cubin, size_t *size) {
    *cubin = fake_cubin; *size = sizeof fake_cubin; return OK;
}
API(cuLinkDestroy)(void *st) { free(st); return OK; }
API(cuGetErrorString)(CUresult e, const char **s) { *s = e ? "stub error" : "no error"; return OK; }
API(cuGetErrorName)(CUresult e, const char **s) {
    *s = e ? "CUDA_ERROR_STUB" : "CUDA_SUCCESS"; return OK;
}
API(cuProfilerStart)(void) { return OK; }
API(cuProfilerStop)(void) { return OK; }

/* ---------------------------------------------------------------- lookup */
__attribute__((visibility("default")))
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             unsigned long long flags, int *status) {
    static void *self;
    static int log = -1;
    char name[256];
    if (!self) {
        Dl_info info;
        dladdr((void *)cuGetProcAddress_v2, &info);
        self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
    snprintf(name, sizeof name, "stub_%s", symbol);
    *pfn = dlsym(self, name);
    if (status) *status = *pfn ? 0 : 1;
    if (*pfn) return OK;
    if (log < 0) log = getenv("STUB_CUDA_LOG") != 0;
    if (log) fprintf(stderr, "stub cuda: no %s\n", symbol);
    return NOT_FOUND;
}
__attribute__((visibility("default")))
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
/* The plain names of the calls a loader may dlsym before it asks cuGetProcAddress. */
__attribute__((visibility("default"))) CUresult cuInit(unsigned int flags) { return OK; }
__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int *v) {
    return stub_cuDriverGetVersion(v);
}
__attribute__((visibility("default")))
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *s, void **params, void **extra) {
    return stub_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
