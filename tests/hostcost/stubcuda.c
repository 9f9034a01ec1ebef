/* A stand-in for libcuda.so.1, so numbapos's real CUDA host path runs without a GPU.

   What: enough of the CUDA driver API for numba-cuda, cuda.core and cuda-bindings to
   make a context, compile kernels (NVVM makes the PTX; "linking" returns a fake cubin),
   load modules and launch. Kernels do not run; device memory is host memory
   (cuMemAlloc is aligned_alloc, copies and memsets are memcpy / memset); every call
   returns at once and succeeds, but for the rules of stream capture below.

   Stream capture (cuStreamBeginCapture ... cuStreamEndCapture, then cuGraphInstantiate*
   and cuGraphLaunch) follows CUDA's rules where they decide whether a capture works.
   Work queued on a capturing stream (launches, asynchronous copies and memsets, event
   records) is recorded into its graph, not run. A "potentially unsafe" call (cuMemAlloc,
   cuMemFree, pinned host allocation, a synchronous copy or memset, a synchronisation)
   from a thread that may not make one now returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
   (900): unless the thread's mode (cuThreadExchangeStreamCaptureMode) is relaxed, its own
   captures begun in global or thread_local mode forbid it, and in global mode so do
   other threads' captures begun in global mode (unsafe_call below). So does
   synchronising or querying the capturing stream itself. Either invalidates the
   captures concerned: their stream work then returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
   (901) until cuStreamEndCapture, which ends the capture and returns 901 and no graph.
   cuGraphLaunch runs a graph's copies and memsets and counts its kernels as replayed
   launches. User objects (cuUserObjectCreate, cuGraphRetainUserObject) are released
   when the last graph holding them goes.

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
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, NOT_FOUND = 500, ILLEGAL_STATE = 401, CAPTURE_UNSUPPORTED = 900,
       CAPTURE_INVALIDATED = 901, CAPTURE_WRONG_THREAD = 908 };

/* Counters, read with stub_counters(); their names, in order, in stub_counter_names.
   launches, copies_* and memsets count work run eagerly (not what a capture records);
   captures: captures begun; captured_launches: kernels recorded into graphs;
   graph_launches: cuGraphLaunch calls; replayed_launches: the kernels they ran;
   refused: calls refused by the capture rules (900, 901, 908). Two are gauges, not
   counts: capturing (streams capturing now) and graphs_alive (graphs and executable
   graphs not destroyed yet). */
enum { LAUNCHES, DEVICE_ALLOCS, HOST_ALLOCS, FREES, COPIES_HTOD, COPIES_DTOH, COPIES_DTOD,
       MEMSETS, SYNCS, CAPTURES, CAPTURED_LAUNCHES, GRAPH_LAUNCHES, REPLAYED_LAUNCHES, REFUSED,
       CAPTURING, GRAPHS_ALIVE, N_COUNTERS };
__attribute__((visibility("default")))
const char stub_counter_names[] =
    "launches,device_allocs,host_allocs,frees,copies_htod,copies_dtoh,copies_dtod,memsets,syncs,"
    "captures,captured_launches,graph_launches,replayed_launches,refused,capturing,graphs_alive";
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

/* ---------------------------------------------------------------- stream capture */
enum { MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED };    /* CUstreamCaptureMode */
enum { STATUS_NONE, STATUS_ACTIVE, STATUS_INVALIDATED };  /* CUstreamCaptureStatus */
enum { NODE_EMPTY, NODE_KERNEL, NODE_COPY, NODE_MEMSET };

typedef struct { int kind, width; CUdeviceptr dst, src; size_t n; unsigned value; } Node;
/* A CUuserObject: ptr handed to destroy when its last reference goes. */
typedef struct { void *ptr; void (*destroy)(void *); int refs; } UserObject;
typedef struct { UserObject *object; unsigned refs; } Held;
typedef struct {  /* a CUgraph or a CUgraphExec */
    Node *nodes;
    size_t count, cap;
    Held *held;  /* the user objects it holds references to */
    size_t n_held;
} Graph;
typedef struct {
    void *stream;  /* 0: a free slot */
    int mode, status;
    pthread_t thread;  /* the thread that began it */
    Graph *graph;
    int taken;  /* the graph was handed out (cuStreamGetCaptureInfo) */
    unsigned long long id;
} Capture;

#define MAX_CAPTURES 64
static Capture captures[MAX_CAPTURES];
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int thread_mode = MODE_GLOBAL;  /* CUDA's default for every thread */
static unsigned long long capture_ids;
static Graph **graphs;  /* the live graphs, so that a bad or second destroy is an error */
static size_t n_graphs, graphs_cap;

/* Under capture_lock. The legacy stream (0, CU_STREAM_LEGACY) never captures. */
static Capture *capture_of(void *s) {
    if ((uintptr_t)s <= 1) return 0;
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i].stream == s) return &captures[i];
    return 0;
}

static Graph *graph_new(void) {  /* under capture_lock */
    Graph *g = calloc(1, sizeof *g);
    if (n_graphs == graphs_cap) {
        graphs_cap = graphs_cap ? 2 * graphs_cap : 16;
        graphs = realloc(graphs, graphs_cap * sizeof *graphs);
    }
    graphs[n_graphs++] = g;
    counters[GRAPHS_ALIVE]++;
    return g;
}

static void release(UserObject *object, unsigned n) {
    if (__atomic_sub_fetch(&object->refs, (int)n, __ATOMIC_ACQ_REL) > 0) return;
    object->destroy(object->ptr);
    free(object);
}

static int graph_live(Graph *g) {  /* under capture_lock */
    for (size_t i = 0; i < n_graphs; i++) if (graphs[i] == g) return 1;
    return 0;
}

/* Under capture_lock; 0 if g is no live graph. Its user objects' references are left
   in *held (to release once the lock is let go: a destructor may call back into Python). */
static int graph_free(Graph *g, Held **held, size_t *n_held) {
    for (size_t i = 0; i < n_graphs; i++) {
        if (graphs[i] != g) continue;
        graphs[i] = graphs[--n_graphs];
        *held = g->held;
        *n_held = g->n_held;
        free(g->nodes);
        free(g);
        counters[GRAPHS_ALIVE]--;
        return 1;
    }
    return 0;
}

static void graph_add(Graph *g, Node node) {
    if (g->count == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 32;
        g->nodes = realloc(g->nodes, g->cap * sizeof *g->nodes);
    }
    g->nodes[g->count++] = node;
    if (node.kind == NODE_KERNEL) counters[CAPTURED_LAUNCHES]++;
}

/* A "potentially unsafe" call (an allocation, a synchronous copy, a synchronisation):
   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED where this thread is prohibited from it
   (cuThreadExchangeStreamCaptureMode's rules: unless the thread's mode is relaxed, its
   own captures not begun in relaxed mode prohibit it, and in global mode so do other
   threads' captures begun in global mode); the captures that prohibit it are
   invalidated. */
static CUresult unsafe_call(void) {
    if (!counters[CAPTURING] || thread_mode == MODE_RELAXED) return OK;
    int refused = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        Capture *c = &captures[i];
        if (!c->stream) continue;
        int own = pthread_equal(c->thread, self);
        if ((own && c->mode != MODE_RELAXED)
                || (!own && c->mode == MODE_GLOBAL && thread_mode == MODE_GLOBAL)) {
            c->status = STATUS_INVALIDATED;
            refused = 1;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    if (!refused) return OK;
    counters[REFUSED]++;
    return CAPTURE_UNSUPPORTED;
}

/* Work queued on stream s: OK with *recorded = 1 where s captures (the work goes into
   its graph), OK with *recorded = 0 where it runs now, or the invalidated capture's 901. */
static CUresult stream_work(void *s, Node node, int *recorded) {
    *recorded = 0;
    if (!counters[CAPTURING]) return OK;
    CUresult err = OK;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (c && c->status == STATUS_INVALIDATED) err = CAPTURE_INVALIDATED;
    else if (c) { graph_add(c->graph, node); *recorded = 1; }
    pthread_mutex_unlock(&capture_lock);
    if (err) counters[REFUSED]++;
    return err;
}

/* Synchronising with (or querying) stream s: never while s captures (that invalidates
   the capture), otherwise an unsafe call. */
static CUresult stream_sync(void *s) {
    if (!counters[CAPTURING]) return OK;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (c) c->status = STATUS_INVALIDATED;
    pthread_mutex_unlock(&capture_lock);
    if (!c) return unsafe_call();
    counters[REFUSED]++;
    return CAPTURE_UNSUPPORTED;
}

static void fill(CUdeviceptr d, unsigned v, size_t n, int width) {
    if (width == 1) memset((void *)d, v, n);
    else for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v;
}

static CUresult launch(void *s) {
    Node node = {NODE_KERNEL};
    int recorded;
    CUresult err = stream_work(s, node, &recorded);
    if (!err && !recorded) counters[LAUNCHES]++;
    return err;
}

/* A copy of n bytes, counted in counters[counter] when it runs: synchronous (an unsafe
   call) or (async) queued on stream s. */
static CUresult copy(int counter, CUdeviceptr dst, CUdeviceptr src, size_t n, int async,
                     void *s) {
    CUresult err;
    int recorded = 0;
    Node node = {NODE_COPY, 0, dst, src, n};
    err = async ? stream_work(s, node, &recorded) : unsafe_call();
    if (err || recorded) return err;
    counters[counter]++;
    memmove((void *)dst, (const void *)src, n);
    return OK;
}

static CUresult memset_(CUdeviceptr d, unsigned v, size_t n, int width, int async, void *s) {
    CUresult err;
    int recorded = 0;
    Node node = {NODE_MEMSET, width, d, 0, n, v};
    err = async ? stream_work(s, node, &recorded) : unsafe_call();
    if (err || recorded) return err;
    counters[MEMSETS]++;
    fill(d, v, n, width);
    return OK;
}

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
API(cuCtxSynchronize)(void) {
    CUresult err = unsafe_call();
    if (!err) counters[SYNCS]++;
    return err;
}
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
static CUresult alloc(CUdeviceptr *p, size_t n) {
    counters[DEVICE_ALLOCS]++; *p = (CUdeviceptr)host_block(n); return OK;
}
API(cuMemAlloc)(CUdeviceptr *p, size_t n) {
    CUresult err = unsafe_call();
    return err ? err : alloc(p, n);
}
/* Stream-ordered: allowed while capturing (served at once, not as a graph node). */
API(cuMemAllocAsync)(CUdeviceptr *p, size_t n, void *s) { return alloc(p, n); }
API(cuMemFree)(CUdeviceptr p) {
    CUresult err = unsafe_call();
    if (err) return err;
    counters[FREES]++; free((void *)p); return OK;
}
API(cuMemFreeAsync)(CUdeviceptr p, void *s) {
    int recorded;
    Node node = {NODE_EMPTY};
    CUresult err = stream_work(s, node, &recorded);
    if (err || recorded) return err;  /* a captured free: the block stays (never replayed) */
    counters[FREES]++; free((void *)p); return OK;
}
API(cuMemHostAlloc)(void **p, size_t n, unsigned flags) {
    CUresult err = unsafe_call();
    if (err) return err;
    counters[HOST_ALLOCS]++; *p = host_block(n); memset(*p, 0, n); return OK;
}
API(cuMemAllocHost)(void **p, size_t n) { return stub_cuMemHostAlloc(p, n, 0); }
API(cuMemFreeHost)(void *p) {
    CUresult err = unsafe_call();
    if (err) return err;
    counters[FREES]++; free(p); return OK;
}
API(cuMemHostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned flags) {
    *d = (CUdeviceptr)p; return OK;
}
API(cuMemHostRegister)(void *p, size_t n, unsigned flags) { return OK; }
API(cuMemHostUnregister)(void *p) { return OK; }
API(cuMemcpyHtoD)(CUdeviceptr d, const void *h, size_t n) {
    return copy(COPIES_HTOD, d, (CUdeviceptr)h, n, 0, 0);
}
API(cuMemcpyDtoH)(void *h, CUdeviceptr d, size_t n) {
    return copy(COPIES_DTOH, (CUdeviceptr)h, d, n, 0, 0);
}
API(cuMemcpyDtoD)(CUdeviceptr a, CUdeviceptr b, size_t n) {
    return copy(COPIES_DTOD, a, b, n, 0, 0);
}
API(cuMemcpyHtoDAsync)(CUdeviceptr d, const void *h, size_t n, void *s) {
    return copy(COPIES_HTOD, d, (CUdeviceptr)h, n, 1, s);
}
API(cuMemcpyDtoHAsync)(void *h, CUdeviceptr d, size_t n, void *s) {
    return copy(COPIES_DTOH, (CUdeviceptr)h, d, n, 1, s);
}
API(cuMemcpyDtoDAsync)(CUdeviceptr a, CUdeviceptr b, size_t n, void *s) {
    return copy(COPIES_DTOD, a, b, n, 1, s);
}
/* Unified addressing: the direction is unknown, and counted as device to device. */
API(cuMemcpy)(CUdeviceptr a, CUdeviceptr b, size_t n) { return copy(COPIES_DTOD, a, b, n, 0, 0); }
API(cuMemcpyAsync)(CUdeviceptr a, CUdeviceptr b, size_t n, void *s) {
    return copy(COPIES_DTOD, a, b, n, 1, s);
}
API(cuMemsetD8)(CUdeviceptr d, unsigned char v, size_t n) { return memset_(d, v, n, 1, 0, 0); }
API(cuMemsetD8Async)(CUdeviceptr d, unsigned char v, size_t n, void *s) {
    return memset_(d, v, n, 1, 1, s);
}
API(cuMemsetD32)(CUdeviceptr d, unsigned v, size_t n) { return memset_(d, v, n, 4, 0, 0); }
API(cuMemsetD32Async)(CUdeviceptr d, unsigned v, size_t n, void *s) {
    return memset_(d, v, n, 4, 1, s);
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
API(cuStreamSynchronize)(void *s) {
    CUresult err = stream_sync(s);
    if (!err) counters[SYNCS]++;
    return err;
}
API(cuStreamQuery)(void *s) {
    if (!counters[CAPTURING]) return OK;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (c) c->status = STATUS_INVALIDATED;
    pthread_mutex_unlock(&capture_lock);
    if (c) counters[REFUSED]++;
    return c ? CAPTURE_UNSUPPORTED : OK;
}
API(cuStreamWaitEvent)(void *s, void *e, unsigned f) {
    int recorded;
    Node node = {NODE_EMPTY};
    return stream_work(s, node, &recorded);
}
API(cuStreamGetPriority)(void *s, int *p) { *p = 0; return OK; }
API(cuStreamGetFlags)(void *s, unsigned *f) { *f = 0; return OK; }
API(cuStreamGetCtx)(void *s, void **c) { *c = &ctx_token; return OK; }
API(cuStreamGetId)(void *s, unsigned long long *id) {
    *id = (unsigned long long)(intptr_t)s; return OK;
}
API(cuStreamGetDevice)(void *s, int *d) { *d = 0; return OK; }
API(cuEventCreate)(void **e, unsigned f) {
    *e = (void *)(intptr_t)(0x2000 + ++event_token); return OK;
}
API(cuEventDestroy)(void *e) { return OK; }
API(cuEventRecord)(void *e, void *s) {
    int recorded;
    Node node = {NODE_EMPTY};
    return stream_work(s, node, &recorded);
}
API(cuEventSynchronize)(void *e) {
    CUresult err = unsafe_call();
    if (!err) counters[SYNCS]++;
    return err;
}
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
/* The last LOGGED cuLaunchKernel calls' arguments, read with stub_launch_log(): function,
   grid x, y, z, block x, y, z, shared bytes, stream, params, extra, as 64-bit integers. */
enum { LOGGED = 256, LOG_FIELDS = 11 };
static unsigned long long launch_log[LOGGED][LOG_FIELDS];
static long long logged;

/* Copy the last min(n, logged, LOGGED) entries, oldest first, to out; returns how many. */
__attribute__((visibility("default")))
int stub_launch_log(unsigned long long *out, int n) {
    long long have = logged < LOGGED ? logged : LOGGED;
    if (n > have) n = (int)have;
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * LOG_FIELDS, launch_log[(logged - n + i) % LOGGED],
               sizeof launch_log[0]);
    return n;
}

API(cuLaunchKernel)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                    unsigned bz, unsigned shmem, void *s, void **params, void **extra) {
    unsigned long long *entry = launch_log[logged++ % LOGGED];
    entry[0] = (unsigned long long)(uintptr_t)f;
    entry[1] = gx; entry[2] = gy; entry[3] = gz; entry[4] = bx; entry[5] = by; entry[6] = bz;
    entry[7] = shmem;
    entry[8] = (unsigned long long)(uintptr_t)s;
    entry[9] = (unsigned long long)(uintptr_t)params;
    entry[10] = (unsigned long long)(uintptr_t)extra;
    return launch(s);
}
typedef struct {  /* CUlaunchConfig */
    unsigned grid[3], block[3], shared_bytes;
    void *stream, *attrs;
    unsigned n_attrs;
} LaunchConfig;
API(cuLaunchKernelEx)(const LaunchConfig *config, void *f, void **params, void **extra) {
    return launch(config->stream);
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
/* ---------------------------------------------------------------- capture, graphs */
API(cuThreadExchangeStreamCaptureMode)(int *mode) {
    if (*mode < MODE_GLOBAL || *mode > MODE_RELAXED) return 1;  /* invalid value */
    int before = thread_mode;
    thread_mode = *mode;
    *mode = before;
    return OK;
}
API(cuStreamBeginCapture)(void *s, int mode) {
    if ((uintptr_t)s <= 1) return CAPTURE_UNSUPPORTED;  /* the legacy stream */
    if (mode < MODE_GLOBAL || mode > MODE_RELAXED) return 1;
    CUresult err = OK;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (c) err = ILLEGAL_STATE;
    for (int i = 0; !err && i < MAX_CAPTURES && !c; i++) if (!captures[i].stream) c = &captures[i];
    if (!err && !c) err = 2;  /* out of memory: too many captures at once */
    if (!err) {
        Capture begun = {s, mode, STATUS_ACTIVE, pthread_self(), graph_new(), 0, ++capture_ids};
        *c = begun;
        counters[CAPTURES]++;
        counters[CAPTURING]++;
    }
    pthread_mutex_unlock(&capture_lock);
    return err;
}
/* Ends the capture, valid or not. The graph goes to phGraph if the capture was valid
   (cuda.core passes none: it took the graph from cuStreamGetCaptureInfo at the start);
   one that nobody can reach any more is destroyed. */
API(cuStreamEndCapture)(void *s, Graph **out) {
    CUresult err = OK;
    Graph *graph = 0, *unreachable = 0;
    Held *held = 0;
    size_t n_held = 0;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (!c) err = ILLEGAL_STATE;
    else if (c->mode != MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        err = CAPTURE_WRONG_THREAD;
    else {
        if (c->status == STATUS_INVALIDATED) err = CAPTURE_INVALIDATED;
        else if (out) graph = c->graph;
        if (!graph && !c->taken) unreachable = c->graph;
        memset(c, 0, sizeof *c);
        counters[CAPTURING]--;
    }
    if (unreachable) graph_free(unreachable, &held, &n_held);
    pthread_mutex_unlock(&capture_lock);
    for (size_t i = 0; i < n_held; i++) release(held[i].object, held[i].refs);
    free(held);
    if (out) *out = graph;
    if (err == CAPTURE_INVALIDATED || err == CAPTURE_WRONG_THREAD) counters[REFUSED]++;
    return err;
}
API(cuStreamIsCapturing)(void *s, int *status) {
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    *status = c ? c->status : STATUS_NONE;
    pthread_mutex_unlock(&capture_lock);
    return OK;
}
static CUresult capture_info(void *s, int *status, unsigned long long *id, Graph **graph,
                             const void **deps, size_t *n_deps) {
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (status) *status = c ? c->status : STATUS_NONE;
    if (c && id) *id = c->id;
    if (c && graph) { *graph = c->graph; c->taken = 1; }
    pthread_mutex_unlock(&capture_lock);
    if (deps) *deps = 0;
    if (n_deps) *n_deps = 0;
    return OK;
}
API(cuStreamGetCaptureInfo)(void *s, int *status, unsigned long long *id, Graph **graph,
                            const void **deps, size_t *n_deps) {
    return capture_info(s, status, id, graph, deps, n_deps);
}
/* CUDA 12.3's version (asked for with version >= 12030, see cuGetProcAddress_v2). */
API(cuStreamGetCaptureInfo_v3)(void *s, int *status, unsigned long long *id, Graph **graph,
                               const void **deps, const void **edges, size_t *n_deps) {
    if (edges) *edges = 0;
    return capture_info(s, status, id, graph, deps, n_deps);
}
API(cuGraphCreate)(Graph **graph, unsigned flags) {
    pthread_mutex_lock(&capture_lock);
    *graph = graph_new();
    pthread_mutex_unlock(&capture_lock);
    return OK;
}
static CUresult destroy(Graph *graph) {
    Held *held = 0;
    size_t n_held = 0;
    pthread_mutex_lock(&capture_lock);
    int found = graph_free(graph, &held, &n_held);
    pthread_mutex_unlock(&capture_lock);
    for (size_t i = 0; i < n_held; i++) release(held[i].object, held[i].refs);
    free(held);
    return found ? OK : 400;  /* invalid handle */
}
API(cuGraphDestroy)(Graph *graph) { return destroy(graph); }
API(cuGraphExecDestroy)(Graph *exec) { return destroy(exec); }
/* An executable graph: a copy of the graph's nodes, holding its user objects too. */
static CUresult instantiate(Graph **exec, Graph *graph) {
    pthread_mutex_lock(&capture_lock);
    int live = graph_live(graph);
    if (live) {
        Graph *made = graph_new();
        made->nodes = malloc((graph->count ? graph->count : 1) * sizeof(Node));
        memcpy(made->nodes, graph->nodes, graph->count * sizeof(Node));
        made->count = made->cap = graph->count;
        made->held = malloc((graph->n_held ? graph->n_held : 1) * sizeof(Held));
        memcpy(made->held, graph->held, graph->n_held * sizeof(Held));
        made->n_held = graph->n_held;
        for (size_t i = 0; i < made->n_held; i++)
            __atomic_add_fetch(&made->held[i].object->refs, (int)made->held[i].refs,
                               __ATOMIC_ACQ_REL);
        *exec = made;
    }
    pthread_mutex_unlock(&capture_lock);
    return live ? OK : 400;
}
API(cuUserObjectCreate)(UserObject **object, void *ptr, void (*destroy)(void *), unsigned refs,
                        unsigned flags) {
    *object = malloc(sizeof **object);
    (*object)->ptr = ptr;
    (*object)->destroy = destroy;
    (*object)->refs = (int)refs;
    return OK;
}
API(cuUserObjectRetain)(UserObject *object, unsigned n) {
    __atomic_add_fetch(&object->refs, (int)n, __ATOMIC_ACQ_REL);
    return OK;
}
API(cuUserObjectRelease)(UserObject *object, unsigned n) { release(object, n); return OK; }
/* flags & 1 (CU_GRAPH_USER_OBJECT_MOVE): the caller's references move to the graph. */
API(cuGraphRetainUserObject)(Graph *graph, UserObject *object, unsigned n, unsigned flags) {
    pthread_mutex_lock(&capture_lock);
    int live = graph_live(graph);
    if (live) {
        graph->held = realloc(graph->held, (graph->n_held + 1) * sizeof(Held));
        graph->held[graph->n_held].object = object;
        graph->held[graph->n_held++].refs = n;
        if (!(flags & 1)) __atomic_add_fetch(&object->refs, (int)n, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&capture_lock);
    return live ? OK : 400;
}
API(cuGraphReleaseUserObject)(Graph *graph, UserObject *object, unsigned n) {
    unsigned released = 0;
    pthread_mutex_lock(&capture_lock);
    for (size_t i = 0; graph_live(graph) && i < graph->n_held && released < n; i++) {
        Held *held = &graph->held[i];
        if (held->object != object) continue;
        unsigned take = held->refs < n - released ? held->refs : n - released;
        held->refs -= take;
        released += take;
    }
    pthread_mutex_unlock(&capture_lock);
    if (released) release(object, released);
    return released == n ? OK : 1;  /* invalid value: the graph held fewer */
}
API(cuGraphInstantiateWithFlags)(Graph **exec, Graph *graph, unsigned long long flags) {
    return instantiate(exec, graph);
}
typedef struct {  /* CUDA_GRAPH_INSTANTIATE_PARAMS */
    unsigned long long flags;
    void *upload_stream, *error_node;
    int result;
} InstantiateParams;
API(cuGraphInstantiateWithParams)(Graph **exec, Graph *graph, InstantiateParams *params) {
    if (params) { params->error_node = 0; params->result = 0; }  /* success */
    return instantiate(exec, graph);
}
API(cuGraphUpload)(Graph *exec, void *s) {
    int recorded;
    Node node = {NODE_EMPTY};
    return stream_work(s, node, &recorded);
}
/* Runs the graph's copies and memsets and counts its kernels; into a capturing stream, its
   nodes join that capture's graph. */
API(cuGraphLaunch)(Graph *exec, void *s) {
    CUresult err = OK;
    int into_capture = 0;
    pthread_mutex_lock(&capture_lock);
    Capture *c = capture_of(s);
    if (c && c->status == STATUS_INVALIDATED) err = CAPTURE_INVALIDATED;
    else if (c) {
        for (size_t i = 0; i < exec->count; i++) graph_add(c->graph, exec->nodes[i]);
        into_capture = 1;
    }
    pthread_mutex_unlock(&capture_lock);
    if (err) counters[REFUSED]++;
    if (err || into_capture) return err;
    counters[GRAPH_LAUNCHES]++;
    for (size_t i = 0; i < exec->count; i++) {
        const Node *node = &exec->nodes[i];
        if (node->kind == NODE_KERNEL) counters[REPLAYED_LAUNCHES]++;
        else if (node->kind == NODE_COPY)
            memmove((void *)node->dst, (const void *)node->src, node->n);
        else if (node->kind == NODE_MEMSET) fill(node->dst, node->value, node->n, node->width);
    }
    return OK;
}

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
    /* Versions with another signature under the same name. */
    if (strcmp(symbol, "cuStreamGetCaptureInfo") == 0 && version >= 12030)
        strcat(name, "_v3");
    if (strcmp(symbol, "cuGetProcAddress") == 0 && version >= 12000)
        strcat(name, "_v2");
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
/* cuGetProcAddress itself, as cuda-bindings' driver.cuGetProcAddress calls it. */
API(cuGetProcAddress)(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
API(cuGetProcAddress_v2)(const char *symbol, void **pfn, int version, unsigned long long flags,
                         int *status) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, status);
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
