/* What the tests' C programs share: reading a file whole (a PTX image, say).
 * tests/toolkit.py puts this folder on every C program's include path. */
#ifndef VGPU_TEST_FILES_H
#define VGPU_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

/* The file at `path`, whole and NUL-terminated, for the caller to free; NULL if it cannot
 * be read. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(n + 1, 1);
    if (fread(buf, 1, n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    return buf;
}

#endif
