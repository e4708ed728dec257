#include <sys/mman.h>
#include <string.h>
#include <stdlib.h>
int main(int c,char**v){size_t n=(size_t)atol(v[1])<<20;char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);memset(p,1,n);munmap(p,n);return 0;}
