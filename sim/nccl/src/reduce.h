// Element types and reductions of the NCCL stand-in: what a collective
// kernel computes, one element type at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "nccl.h"

namespace simnccl {

// Bytes per element; 0 for a value outside ncclDataType_t.
inline size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// Types the stand-in can reduce (the fp8 types it only moves).
inline bool reducible(ncclDataType_t t) {
  return type_size(t) != 0 && t != ncclFloat8e4m3 && t != ncclFloat8e5m2;
}

// IEEE binary16 and bfloat16 <-> float, round to nearest even.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or NaN (NaN stays a quiet NaN)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {               // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace detail {

template <class T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg:
      if constexpr (sizeof(T) < 8 && !std::is_floating_point_v<T>) {
        return static_cast<T>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
      } else if constexpr (!std::is_floating_point_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      } else {
        return a + b;
      }
    case ncclProd:
      if constexpr (sizeof(T) < 8 && !std::is_floating_point_v<T>) {
        return static_cast<T>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
      } else if constexpr (!std::is_floating_point_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      } else {
        return a * b;
      }
    case ncclMax:
      return a < b ? b : a;
    case ncclMin:
      return b < a ? b : a;
    default:
      return a;
  }
}

template <class T>
void reduce_typed(void* acc, const void* in, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, static_cast<const char*>(acc) + i * sizeof(T), sizeof(T));
    std::memcpy(&b, static_cast<const char*>(in) + i * sizeof(T), sizeof(T));
    a = combine(a, b, op);
    std::memcpy(static_cast<char*>(acc) + i * sizeof(T), &a, sizeof(T));
  }
}

template <class T>
void divide_typed(void* acc, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) {
    T a;
    std::memcpy(&a, static_cast<const char*>(acc) + i * sizeof(T), sizeof(T));
    a = static_cast<T>(a / static_cast<T>(by));
    std::memcpy(static_cast<char*>(acc) + i * sizeof(T), &a, sizeof(T));
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_16(void* acc, const void* in, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, static_cast<const char*>(acc) + 2 * i, 2);
    std::memcpy(&b, static_cast<const char*>(in) + 2 * i, 2);
    a = Store(combine(Load(a), Load(b), op));  // each step rounds, as the type would
    std::memcpy(static_cast<char*>(acc) + 2 * i, &a, 2);
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void divide_16(void* acc, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a;
    std::memcpy(&a, static_cast<const char*>(acc) + 2 * i, 2);
    a = Store(Load(a) / static_cast<float>(by));
    std::memcpy(static_cast<char*>(acc) + 2 * i, &a, 2);
  }
}

}  // namespace detail

// acc[i] = acc[i] op in[i] for n elements (unaligned buffers are fine).
inline void reduce(void* acc, const void* in, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  using namespace detail;
  switch (t) {
    case ncclInt8:
      return reduce_typed<int8_t>(acc, in, n, op);
    case ncclUint8:
      return reduce_typed<uint8_t>(acc, in, n, op);
    case ncclInt32:
      return reduce_typed<int32_t>(acc, in, n, op);
    case ncclUint32:
      return reduce_typed<uint32_t>(acc, in, n, op);
    case ncclInt64:
      return reduce_typed<int64_t>(acc, in, n, op);
    case ncclUint64:
      return reduce_typed<uint64_t>(acc, in, n, op);
    case ncclFloat32:
      return reduce_typed<float>(acc, in, n, op);
    case ncclFloat64:
      return reduce_typed<double>(acc, in, n, op);
    case ncclFloat16:
      return reduce_16<half_to_float, float_to_half>(acc, in, n, op);
    case ncclBfloat16:
      return reduce_16<bf16_to_float, float_to_bf16>(acc, in, n, op);
    default:
      return;
  }
}

// ncclAvg's last step: acc[i] /= by.
inline void divide(void* acc, size_t n, ncclDataType_t t, int by) {
  using namespace detail;
  switch (t) {
    case ncclInt8:
      return divide_typed<int8_t>(acc, n, by);
    case ncclUint8:
      return divide_typed<uint8_t>(acc, n, by);
    case ncclInt32:
      return divide_typed<int32_t>(acc, n, by);
    case ncclUint32:
      return divide_typed<uint32_t>(acc, n, by);
    case ncclInt64:
      return divide_typed<int64_t>(acc, n, by);
    case ncclUint64:
      return divide_typed<uint64_t>(acc, n, by);
    case ncclFloat32:
      return divide_typed<float>(acc, n, by);
    case ncclFloat64:
      return divide_typed<double>(acc, n, by);
    case ncclFloat16:
      return divide_16<half_to_float, float_to_half>(acc, n, by);
    case ncclBfloat16:
      return divide_16<bf16_to_float, float_to_bf16>(acc, n, by);
    default:
      return;
  }
}

}  // namespace simnccl
