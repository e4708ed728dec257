#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
int main(int c, char**v){ size_t n=2UL<<30; char*p=mmap(0,n+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);
 p=(char*)(((unsigned long)p+(2<<20)-1)&~((2UL<<20)-1));
 madvise(p,n, v[1][0]=='h'?MADV_HUGEPAGE:MADV_NOHUGEPAGE);
 struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
 for(size_t o=0;o<n;o+=4096)p[o]=1;
 clock_gettime(CLOCK_MONOTONIC,&b); double s=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)/1e9;
 printf("%s %.2f GB/s\n", v[1], n/s/1e9); return 0;}
