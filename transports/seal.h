/* seal.h - sealed records (LOOM_ENCRYPT): AES-256-GCM from OpenSSL's
 * libcrypto over one direction of one connection.
 *
 * A connection's handshake (auth.h) gives both ends 64 bytes of key
 * material of that connection alone: bytes 0-31 key what the opener
 * sends, 32-63 what the acceptor sends.  Each direction numbers its
 * records from 0; the nonce of a record is its kind (4 bytes) and its
 * number (8 bytes), so a key never sees a nonce twice, and a record
 * changed, dropped, replayed, reordered or taken for one of another
 * kind fails to open.  A record of n bytes goes on the wire as n bytes
 * of ciphertext and a 16-byte tag.  The receiver knows each record's
 * length before it arrives (a fixed-size header, or a length that an
 * opened header gave), so no byte is used before its tag is checked.
 */
#ifndef LOOMI_SEAL_H
#define LOOMI_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define LOOMI_SEAL_TAG 16
/* The largest record; longer payloads go as several. */
#define LOOMI_SEAL_MAX 65536u

enum { LOOMI_SEAL_HDR = 1, LOOMI_SEAL_DATA = 2 };

/* One direction of one connection. */
struct loomi_seal {
    void *ctx;    /* EVP_CIPHER_CTX, keyed once; NULL: not set up */
    uint64_t seq; /* the number of the next record */
};

/* Set up both directions from a connection's key material; opener: 1 on
 * the side that opened the connection.  0, or -1 (out of memory). */
int loomi_seal_setup(struct loomi_seal *tx, struct loomi_seal *rx,
                     const unsigned char session[64], int opener);
/* Free what setup took (safe on a zeroed or freed one). */
void loomi_seal_free(struct loomi_seal *s);
/* Seal n (<= LOOMI_SEAL_MAX) bytes of in as the next record of kind:
 * n bytes of ciphertext and the tag to out (n + LOOMI_SEAL_TAG bytes;
 * out may be in).  0, or -1 (a library error). */
int loomi_seal(struct loomi_seal *s, uint32_t kind, const void *in, size_t n, void *out);
/* Open the next record of kind: in holds n bytes of ciphertext and the
 * tag; the n bytes of plaintext go to out (which may be in).  0, or -1
 * when it fails authentication (out then holds bytes to be thrown
 * away, never used). */
int loomi_seal_open(struct loomi_seal *s, uint32_t kind, const void *in, size_t n, void *out);

#endif
