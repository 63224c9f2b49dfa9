// The HIP runtime calls kvstrand uses, mapped onto the CUDA runtime.
//
// Debian's HIP 5.2 headers for the NVIDIA platform no longer compile against
// CUDA 12 or 13, so the cuda backend includes this instead of
// <hip/hip_runtime_api.h>. backend_gpu.cpp is written once against the HIP
// names and compiles unchanged for both vendors. Only what backend_gpu.cpp
// calls is mapped; add a line here when it starts calling something new.
#pragma once

#include <cuda_runtime_api.h>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipIpcMemHandle_t = cudaIpcMemHandle_t;
using hipDeviceProp_t = cudaDeviceProp;
using hipMemcpyKind = cudaMemcpyKind;
using hipHostFn_t = cudaHostFn_t;

inline constexpr hipError_t hipSuccess = cudaSuccess;
inline constexpr hipError_t hipErrorNotReady = cudaErrorNotReady;
inline constexpr hipError_t hipErrorInvalidValue = cudaErrorInvalidValue;
inline constexpr hipError_t hipErrorOutOfMemory = cudaErrorMemoryAllocation;
inline constexpr hipError_t hipErrorNoDevice = cudaErrorNoDevice;
inline constexpr hipError_t hipErrorInsufficientDriver = cudaErrorInsufficientDriver;
inline constexpr hipError_t hipErrorLaunchFailure = cudaErrorLaunchFailure;
inline constexpr hipError_t hipErrorInvalidDevicePointer = cudaErrorInvalidDevicePointer;
inline constexpr hipError_t hipErrorMapFailed = cudaErrorMapBufferObjectFailed;

inline constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
inline constexpr hipMemcpyKind hipMemcpyDeviceToHost = cudaMemcpyDeviceToHost;
inline constexpr hipMemcpyKind hipMemcpyDeviceToDevice = cudaMemcpyDeviceToDevice;

inline constexpr unsigned hipStreamNonBlocking = cudaStreamNonBlocking;
inline constexpr unsigned hipEventDisableTiming = cudaEventDisableTiming;
inline constexpr unsigned hipHostMallocDefault = cudaHostAllocDefault;
inline constexpr unsigned hipIpcMemLazyEnablePeerAccess = cudaIpcMemLazyEnablePeerAccess;

inline const char* hipGetErrorName(hipError_t e) { return cudaGetErrorName(e); }
inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline constexpr unsigned hipHostRegisterPortable = cudaHostRegisterPortable;
inline constexpr unsigned hipHostRegisterMapped = cudaHostRegisterMapped;
inline hipError_t hipHostRegister(void* p, size_t n, unsigned flags) { return cudaHostRegister(p, n, flags); }
inline hipError_t hipHostUnregister(void* p) { return cudaHostUnregister(p); }

inline hipError_t hipGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* p, int d) { return cudaGetDeviceProperties(p, d); }
inline hipError_t hipSetDevice(int d) { return cudaSetDevice(d); }
inline hipError_t hipMalloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline hipError_t hipFree(void* p) { return cudaFree(p); }
inline hipError_t hipHostMalloc(void** p, size_t n, unsigned flags) { return cudaHostAlloc(p, n, flags); }
inline hipError_t hipHostFree(void* p) { return cudaFreeHost(p); }
inline hipError_t hipStreamCreateWithFlags(hipStream_t* s, unsigned f) { return cudaStreamCreateWithFlags(s, f); }
inline hipError_t hipStreamDestroy(hipStream_t s) { return cudaStreamDestroy(s); }
inline hipError_t hipStreamSynchronize(hipStream_t s) { return cudaStreamSynchronize(s); }
inline hipError_t hipStreamQuery(hipStream_t s) { return cudaStreamQuery(s); }
inline hipError_t hipLaunchHostFunc(hipStream_t s, hipHostFn_t fn, void* a) { return cudaLaunchHostFunc(s, fn, a); }
inline hipError_t hipEventCreateWithFlags(hipEvent_t* e, unsigned f) { return cudaEventCreateWithFlags(e, f); }
inline hipError_t hipEventDestroy(hipEvent_t e) { return cudaEventDestroy(e); }
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { return cudaEventRecord(e, s); }
inline hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t e, unsigned flags) { return cudaStreamWaitEvent(s, e, flags); }
inline hipError_t hipEventQuery(hipEvent_t e) { return cudaEventQuery(e); }
inline hipError_t hipEventSynchronize(hipEvent_t e) { return cudaEventSynchronize(e); }
inline hipError_t hipMemcpyAsync(void* d, const void* s, size_t n, hipMemcpyKind k, hipStream_t st) {
  return cudaMemcpyAsync(d, s, n, k, st);
}
inline hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* h, void* p) { return cudaIpcGetMemHandle(h, p); }
inline hipError_t hipIpcOpenMemHandle(void** p, hipIpcMemHandle_t h, unsigned f) { return cudaIpcOpenMemHandle(p, h, f); }
inline hipError_t hipIpcCloseMemHandle(void* p) { return cudaIpcCloseMemHandle(p); }
