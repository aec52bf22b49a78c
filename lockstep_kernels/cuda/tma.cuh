// Tensor maps, mbarriers and TMA copies shared by the TMA-fed kernels (wgmma.cu, wgmma_kq.cu).
// MBAR_BRKPT 1: a stuck barrier wait ends the kernel at a breakpoint instead of a trap (a trap anywhere
// makes ptxas give up setmaxnreg's register budget).
#ifndef MBAR_BRKPT
#define MBAR_BRKPT 0
#endif

struct __align__(64) TensorMap {
    unsigned long long v[16];  // CUtensorMap, encoded on the host (lockstep_kernels/cuda/tensor_map.py)
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits for the phase of `parity` to complete. A barrier that never completes is a bug: stop after
// ~seconds rather than hang the device (MBAR_BRKPT: at a breakpoint, which without a debugger also ends
// the kernel).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    for (unsigned spins = 0;; ++spins) {
        unsigned done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (done) return;
        if (spins > (1u << 26)) {
#if MBAR_BRKPT
            asm volatile("brkpt;\n");
#else
            __trap();
#endif
        }
    }
}

__device__ __forceinline__ void tma_2d(unsigned dst, const TensorMap* map, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
