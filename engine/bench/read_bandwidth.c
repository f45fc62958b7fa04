/* Single-thread sequential read bandwidth: the ceiling a one-thread decode of resident weights
 * can reach on this machine (issue 43). 512 MiB read 5 times with AVX-512 loads into 4
 * accumulators; prints the best GB/s.
 *
 *   gcc -O3 -march=native engine/bench/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t n=(size_t)1<<29; // 512 MiB
  char*p=aligned_alloc(64,n); memset(p,1,n);
  double best=1e9; __m512i acc[4]={0};
  for(int r=0;r<5;r++){
    double t0=now();
    for(size_t i=0;i<n;i+=256){
      for(int k=0;k<4;k++) acc[k]=_mm512_add_epi32(acc[k],_mm512_load_si512((void*)(p+i+64*k)));
    }
    double t=now()-t0; if(t<best)best=t;
  }
  int s=_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(acc[0],acc[1]),_mm512_add_epi32(acc[2],acc[3])));
  printf("1-thread read: %.1f GB/s (%d)\n", n/best/1e9, s&1);
}
