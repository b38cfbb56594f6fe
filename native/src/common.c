#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static _Thread_local char last_error[512];

ei_status ei_fail(ei_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *ei_last_error(void) { return last_error; }

const char *ei_version(void) { return EI_VERSION; }  /* edgeinfer/_version.py, through CMake */

int ei_physical_cores(void) {
    /* Hyper-threads share a core's SIMD units; count cores, not logical CPUs. */
    long logical = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "r");
    int siblings = 1;
    if (f) {
        int a, b;
        char sep;
        if (fscanf(f, "%d%c%d", &a, &sep, &b) == 3 && (sep == '-' || sep == ','))
            siblings = sep == '-' ? b - a + 1 : 2;
        fclose(f);
    }
    cores = (int)(logical / (siblings > 0 ? siblings : 1));
    return cores > 0 ? cores : 1;
}
