/* seal.c - sealed records (seal.h), AES-256-GCM through OpenSSL's EVP. */
#include "transports/seal.h"

#include <openssl/evp.h>
#include <string.h>

static void nonce_of(uint32_t kind, uint64_t seq, unsigned char iv[12])
{
    for (int i = 0; i < 4; i++) iv[i] = (unsigned char)(kind >> (24 - 8 * i));
    for (int i = 0; i < 8; i++) iv[4 + i] = (unsigned char)(seq >> (56 - 8 * i));
}

static int setup_one(struct loomi_seal *s, const unsigned char *key, int enc)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (!c) return -1;
    /* Keyed once; each record sets only its nonce (12 bytes, GCM's default). */
    if (EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, key, NULL, enc) != 1) {
        EVP_CIPHER_CTX_free(c);
        return -1;
    }
    s->ctx = c;
    s->seq = 0;
    return 0;
}

int loomi_seal_setup(struct loomi_seal *tx, struct loomi_seal *rx,
                     const unsigned char session[64], int opener)
{
    const unsigned char *mine = opener ? session : session + 32;
    const unsigned char *theirs = opener ? session + 32 : session;
    if (setup_one(tx, mine, 1)) return -1;
    if (setup_one(rx, theirs, 0)) {
        loomi_seal_free(tx);
        return -1;
    }
    return 0;
}

void loomi_seal_free(struct loomi_seal *s)
{
    if (s->ctx) EVP_CIPHER_CTX_free(s->ctx);
    s->ctx = NULL;
}

int loomi_seal(struct loomi_seal *s, uint32_t kind, const void *in, size_t n, void *out)
{
    unsigned char iv[12];
    int len = 0, fin = 0;
    EVP_CIPHER_CTX *c = s->ctx;
    /* A number never comes back: a direction ends before it would wrap. */
    if (!c || n > LOOMI_SEAL_MAX || s->seq == UINT64_MAX) return -1;
    nonce_of(kind, s->seq++, iv);
    if (EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) != 1) return -1;
    if (n && EVP_EncryptUpdate(c, out, &len, in, (int)n) != 1) return -1;
    if (EVP_EncryptFinal_ex(c, (unsigned char *)out + len, &fin) != 1) return -1;
    return EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, LOOMI_SEAL_TAG, (unsigned char *)out + n) ==
                   1
               ? 0
               : -1;
}

int loomi_seal_open(struct loomi_seal *s, uint32_t kind, const void *in, size_t n, void *out)
{
    unsigned char iv[12], tag[LOOMI_SEAL_TAG];
    int len = 0, fin = 0;
    EVP_CIPHER_CTX *c = s->ctx;
    if (!c || n > LOOMI_SEAL_MAX || s->seq == UINT64_MAX) return -1;
    nonce_of(kind, s->seq++, iv);
    memcpy(tag, (const unsigned char *)in + n, sizeof tag); /* before out may overwrite it */
    if (EVP_DecryptInit_ex(c, NULL, NULL, NULL, iv) != 1) return -1;
    if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, LOOMI_SEAL_TAG, tag) != 1) return -1;
    if (n && EVP_DecryptUpdate(c, out, &len, in, (int)n) != 1) return -1;
    return EVP_DecryptFinal_ex(c, (unsigned char *)out + len, &fin) == 1 ? 0 : -1;
}
