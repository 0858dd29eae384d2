#ifndef LOOMI_SIM_H
#define LOOMI_SIM_H
#endif
