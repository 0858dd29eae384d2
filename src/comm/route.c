/* route.c - placeholder */
#include "transports/transport.h"
