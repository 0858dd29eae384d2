#ifndef LOOMI_SIMULATE_H
#define LOOMI_SIMULATE_H
#endif
