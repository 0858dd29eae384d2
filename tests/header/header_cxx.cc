// The public header must compile as C++ and link against the C library.
#include "loom.h"

#include <cstdio>
#include <cstring>

int main()
{
    loom_config_t cfg = LOOM_CONFIG_INITIALIZER;
    if (cfg.size != sizeof(loom_config_t)) return 1;
    loom_request_t req = LOOM_REQUEST_NULL;
    int done = 0;
    if (loom_test(&req, &done) != LOOM_SUCCESS || done != 1) return 1;
    if (loom_wait(&req) != LOOM_SUCCESS) return 1;
    loom_comm_t comm = nullptr;
    if (loom_comm_rank(comm, &done) != LOOM_ERR_INVALID_ARGUMENT) return 1;
    if (std::strstr(loom_get_last_error(), "comm") == nullptr) return 1;
    std::printf("C++: %s\n", loom_strerror(LOOM_ERR_REMOTE));
    return 0;
}
