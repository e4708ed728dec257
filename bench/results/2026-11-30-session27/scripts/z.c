#include <sys/mman.h>
#include <string.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int c,char**v){size_t n=(size_t)1<<30; int huge=c>1;
char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
if(huge) madvise(p,n,MADV_HUGEPAGE);
double t=now(); memset(p,1,n); double a=now()-t; t=now(); memset(p,2,n); double b=now()-t;
printf("huge=%d first touch %.0f MB/s, second %.0f MB/s\n",huge,1024/a,1024/b);}
