/* The public header must compile alone as strict C99 and be usable. */
#include "loom.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    loom_config_t cfg = LOOM_CONFIG_INITIALIZER;
    loom_config_t cfg2;
    int ma, mi, pa;
    if (loom_config_init(&cfg2) != LOOM_SUCCESS) return 1;
    if (cfg.size != sizeof cfg || memcmp(&cfg, &cfg2, sizeof cfg) != 0) return 1;
    if (loom_get_version(&ma, &mi, &pa) != LOOM_SUCCESS || ma != LOOM_VERSION_MAJOR) return 1;
    if (loom_datatype_size(LOOM_BFLOAT16) != 2 || loom_datatype_size(LOOM_FLOAT64) != 8) return 1;
    if (strcmp(loom_strerror(LOOM_SUCCESS), "success") != 0) return 1;
    printf("C99: loom %d.%d.%d\n", ma, mi, pa);
    return 0;
}
