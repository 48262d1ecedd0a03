/* Driver functions that must answer even when the embedded Python runtime cannot start:
   the error texts (an application reporting that very failure asks for them). */

#include "driver_shim.h"

static const struct vgpu_result_text *find_result(CUresult error)
{
    size_t low = 0, high = vgpu_driver_result_count;

    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (vgpu_driver_results[middle].value < (int)error)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < vgpu_driver_result_count && vgpu_driver_results[low].value == (int)error)
        return &vgpu_driver_results[low];
    return NULL;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    const struct vgpu_result_text *result = find_result(error);

    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = result != NULL ? result->name : NULL;
    return result != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    const struct vgpu_result_text *result = find_result(error);

    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = result != NULL ? result->text : NULL;
    return result != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
