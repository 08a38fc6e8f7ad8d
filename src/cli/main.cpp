#include <cstdio>
int main() { std::puts("hone"); }
