#ifndef LOOMI_MODEL_H
#define LOOMI_MODEL_H
#endif
