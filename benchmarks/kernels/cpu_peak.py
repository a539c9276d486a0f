"""This CPU's instruction peaks for the two operations our kernels' time is made of: int8
multiply-adds by AVX-512 VNNI (`vpdpbusd`, the int8 GEMMs) and float32 FMAs (attention), with
1 and with every core, so that a kernel's rate can be read as a share of what the core allows.

    .venv/bin/python benchmarks/kernels/cpu_peak.py

Compiles a tiny C program with gcc (`-march=native -fopenmp`) in a temporary directory: twelve
independent accumulator chains, no memory traffic, so the figures are upper bounds that no
real kernel (loads, conversions, reductions) reaches. Needs AVX-512 VNNI; run it on a quiet
machine and name the CPU (`lscpu`) beside the figures.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHAINS(OP) \
    OP(c0); OP(c1); OP(c2); OP(c3); OP(c4); OP(c5); \
    OP(c6); OP(c7); OP(c8); OP(c9); OP(c10); OP(c11); \
    __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5)); \
    __asm__ volatile("" : "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));

int main(void) {
    const long rounds = 20000000L; /* x 12 instructions a thread */
    int cores = omp_get_num_procs();
    for (int nt = 1; nt <= cores; nt = nt < cores && nt * 2 > cores ? cores : nt * 2) {
        double t0 = now();
        int sink = 0;
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2), c0 = _mm512_setzero_si512();
            __m512i c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
                    c9 = c0, c10 = c0, c11 = c0;
#define DP(c) c = _mm512_dpbusd_epi32(c, a, b)
            for (long i = 0; i < rounds; i++) { CHAINS(DP) }
            __m512i s = _mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3));
            s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c4, c5), c6));
            s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c7, c8), c9));
            sink += _mm512_reduce_add_epi32(_mm512_add_epi32(s, _mm512_add_epi32(c10, c11)));
        }
        double dt = now() - t0;
        printf("int8 vpdpbusd zmm, %d thread(s): %.0f G multiply-adds/s in all (%.2f ns an "
               "instruction a thread) [%d]\n", nt, nt * rounds * 12.0 * 64 / dt / 1e9,
               dt / (rounds * 12.0) * 1e9, sink & 1);
    }
    for (int nt = 1; nt <= cores; nt = nt < cores && nt * 2 > cores ? cores : nt * 2) {
        double t0 = now();
        float sink = 0;
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
            __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
            __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
#define FMA(c) c = _mm512_fmadd_ps(a, b, c)
            for (long i = 0; i < rounds; i++) { CHAINS(FMA) }
            __m512 s = _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3));
            s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c4, c5), c6));
            s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c7, c8), c9));
            sink += _mm512_reduce_add_ps(_mm512_add_ps(s, _mm512_add_ps(c10, c11)));
        }
        double dt = now() - t0;
        printf("float32 FMA zmm, %d thread(s): %.0f G multiply-adds/s in all (%.2f ns an "
               "instruction a thread) [%d]\n", nt, nt * rounds * 12.0 * 16 / dt / 1e9,
               dt / (rounds * 12.0) * 1e9, sink > 0);
    }
    return 0;
}
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(SOURCE)
        cc = ["gcc", "-O2", "-march=native", "-fopenmp", str(src), "-o", str(exe)]
        built = subprocess.run(cc, capture_output=True, text=True)
        if built.returncode != 0:
            print(f"gcc failed (AVX-512 VNNI needed):\n{built.stderr}", file=sys.stderr)
            return 1
        return subprocess.run([str(exe)]).returncode


if __name__ == "__main__":
    sys.exit(main())
