/* Thin shim over Ascend ACL for xTensor's npu backend (rust/janus-core/src/xtensor/backend/acl.rs).
 *
 * libascendcl.so is dlopen'ed at run time, so janusd builds and runs without CANN; the
 * Rust side sees only these janus_acl_* functions. Structs and enum values follow the
 * public CANN runtime documentation (aclrtPhysicalMemProp, aclrtMemAttr, ...).
 * Every function returns 0 on success, an aclError (>0) from ACL, or -1 when the library
 * is not loaded.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int aclError;
typedef void *aclrtDrvMemHandle;
typedef void *aclrtStream;

typedef struct {
    uint32_t id;
    int type; /* aclrtMemLocationType: ACL_MEM_LOCATION_TYPE_DEVICE = 1 */
} janus_acl_mem_location;

typedef struct {
    int handleType;      /* ACL_MEM_HANDLE_TYPE_NONE = 0 */
    int allocationType;  /* ACL_MEM_ALLOCATION_TYPE_PINNED = 0 */
    int memAttr;         /* ACL_HBM_MEM_HUGE = 4 (2 MiB granularity) */
    janus_acl_mem_location location;
    uint64_t reserve;
} janus_acl_physical_mem_prop;

static struct {
    void *lib;
    aclError (*init)(const char *);
    aclError (*set_device)(int32_t);
    aclError (*reserve)(void **, size_t, size_t, void *, uint64_t);
    aclError (*release)(void *);
    aclError (*malloc_physical)(aclrtDrvMemHandle *, size_t, const janus_acl_physical_mem_prop *, uint64_t);
    aclError (*free_physical)(aclrtDrvMemHandle);
    aclError (*map)(void *, size_t, size_t, aclrtDrvMemHandle, uint64_t);
    aclError (*unmap)(void *);
    aclError (*stream_create)(aclrtStream *);
    aclError (*stream_sync)(aclrtStream);
    aclError (*stream_destroy)(aclrtStream);
} g;

#define LOAD(field, name)                                                        \
    do {                                                                         \
        *(void **)(&g.field) = dlsym(lib, name);                                 \
        if (!g.field) {                                                          \
            snprintf(err, errlen, "%s: missing symbol %s", libname, name);       \
            return -1;                                                           \
        }                                                                        \
    } while (0)

/* Load the library once; on failure write dlerror's text (or the missing symbol) to err. */
int janus_acl_load(const char *libname, char *err, size_t errlen) {
    if (g.lib) return 0;
    void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : "dlopen failed");
        return -1;
    }
    LOAD(init, "aclInit");
    LOAD(set_device, "aclrtSetDevice");
    LOAD(reserve, "aclrtReserveMemAddress");
    LOAD(release, "aclrtReleaseMemAddress");
    LOAD(malloc_physical, "aclrtMallocPhysical");
    LOAD(free_physical, "aclrtFreePhysical");
    LOAD(map, "aclrtMapMem");
    LOAD(unmap, "aclrtUnmapMem");
    LOAD(stream_create, "aclrtCreateStream");
    LOAD(stream_sync, "aclrtSynchronizeStream");
    LOAD(stream_destroy, "aclrtDestroyStream");
    g.lib = lib;
    return 0;
}

/* aclInit (a repeated init, error 100002, counts as success) and aclrtSetDevice. */
int janus_acl_open_device(int32_t device) {
    if (!g.lib) return -1;
    aclError rc = g.init(NULL);
    if (rc != 0 && rc != 100002) return rc;
    return g.set_device(device);
}

int janus_acl_reserve(size_t size, void **out) {
    if (!g.lib) return -1;
    return g.reserve(out, size, 0, NULL, 0);
}

int janus_acl_release(void *va) {
    if (!g.lib) return -1;
    return g.release(va);
}

int janus_acl_malloc_physical(size_t size, int32_t device, void **handle_out) {
    if (!g.lib) return -1;
    janus_acl_physical_mem_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.memAttr = 4;
    prop.location.id = (uint32_t)device;
    prop.location.type = 1;
    return g.malloc_physical(handle_out, size, &prop, 0);
}

int janus_acl_free_physical(void *handle) {
    if (!g.lib) return -1;
    return g.free_physical(handle);
}

int janus_acl_map(void *va, size_t size, void *handle) {
    if (!g.lib) return -1;
    return g.map(va, size, 0, handle, 0);
}

int janus_acl_unmap(void *va) {
    if (!g.lib) return -1;
    return g.unmap(va);
}

int janus_acl_stream_create(void **out) {
    if (!g.lib) return -1;
    return g.stream_create(out);
}

int janus_acl_stream_synchronize(void *stream) {
    if (!g.lib) return -1;
    return g.stream_sync(stream);
}

int janus_acl_stream_destroy(void *stream) {
    if (!g.lib) return -1;
    return g.stream_destroy(stream);
}
