/*
 * cuda_stub.c - a stand-in for CUDA's driver, libcuda.so.1, for
 * tests/mp/test_nccl.sh: cuPointerGetAttribute answers as the driver
 * does for the memory type and managed attributes, for ranges the test
 * program marks as device or managed memory (stub_cuda_mark) once it
 * declares the driver initialised (stub_cuda_init); before that, every
 * query fails with CUDA_ERROR_NOT_INITIALIZED, and unmarked memory gives
 * CUDA_ERROR_INVALID_VALUE, as pageable host memory does.
 */
#include <stddef.h>
#include <stdint.h>

static int initialised;
static struct { uintptr_t lo, hi; int managed; } marks[8];
static int nmarks;

void stub_cuda_init(void)
{
    initialised = 1;
}

void stub_cuda_mark(const void *p, size_t bytes, int managed)
{
    if (nmarks < 8) {
        marks[nmarks].lo = (uintptr_t)p;
        marks[nmarks].hi = (uintptr_t)p + bytes;
        marks[nmarks++].managed = managed;
    }
}

int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    for (int i = 0; i < nmarks; i++) {
        if (ptr < marks[i].lo || ptr >= marks[i].hi) continue;
        if (attribute == 2) { /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
            *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
            return 0;
        }
        if (attribute == 8) { /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
            *(unsigned int *)data = (unsigned int)marks[i].managed;
            return 0;
        }
        return 1;
    }
    return 1; /* CUDA_ERROR_INVALID_VALUE: not CUDA's memory */
}
