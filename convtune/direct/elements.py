"""Each dtype's element type for the CUDA kernels that read and write a problem's own memory (the depthwise families'):
the source prefix that defines ``T``, its widening conversion ``cv`` and load ``ld`` and its rounding store ``st``."""

#: Each dtype's element type ``T`` (bfloat16 and float16 as their 16 bits), its widening conversion ``cv`` (of a value
#: already loaded) and load ``ld`` and rounding
#: store ``st`` (to nearest, ties to even): the source prefix of every kernel that reads a problem's own memory.
ELEMENT_TYPES = {
    "float32": r"""
typedef float T;
__device__ __forceinline__ float cv(T v) { return v; }
__device__ __forceinline__ float ld(const T* p) { return __ldg(p); }
__device__ __forceinline__ T st(float v) { return v; }
""",
    "bfloat16": r"""
typedef unsigned short T;
__device__ __forceinline__ float cv(T v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ float ld(const T* p) { return cv(__ldg(p)); }
__device__ __forceinline__ T st(float v) {  // round to nearest, ties to even; NaN stays NaN
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (T)(u >> 16);
}
""",
    "float16": r"""
typedef unsigned short T;
__device__ __forceinline__ float cv(T h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float ld(const T* p) { return cv(__ldg(p)); }
__device__ __forceinline__ T st(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}
""",
}
