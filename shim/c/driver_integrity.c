/* The answer to the integrity check of NVIDIA's runtime (export table d4082055-..., slot 1).

   The runtime hands the driver a number and the time, and compares the 16 bytes it gets back
   with what it computes itself from the same facts: HMAC-MD2 (RFC 2104 over RFC 1319, MD2's
   16-byte block being the key's size), under a key both sides hold, of
     { u32 driver version (cuDriverGetVersion), u32 the runtime's number, u32 process id,
       u32 thread (pthread_self, low half), the CUDART_INTERFACE table's address, the
       integrity table's address, the answering function's address, u64 the runtime's time }
   followed by { 16-byte UUID, i32 PCI domain, bus and device } for every device. The runtime
   reads the devices' facts through the public API, so they must be what vgpu's
   cuDeviceGetUuid and cuDeviceGetAttribute say. Two of the runtime's numbers (last decimal
   digit 0 or 1) get fixed answers instead. ZLUDA (github vosen/ZLUDA, dark_api) documented
   these facts; the code here is written from RFC 1319 and RFC 2104. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "driver_export_tables.h"

enum { MD2_BLOCK = 16, MAX_DEVICES = 64 };

/* RFC 1319's substitution table (a permutation built from the digits of pi). */
static const unsigned char md2_s[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,
    98,  167, 5,   243, 192, 199, 115, 140, 152, 147, 43,  217, 188, 76,  130, 202,
    30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,  138, 23,  229, 18,
    190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122,
    169, 104, 121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,
    128, 127, 93,  154, 90,  144, 50,  39,  53,  62,  204, 231, 191, 247, 151, 3,
    255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,  170, 198,
    79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241,
    69,  157, 112, 89,  100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,
    27,  96,  37,  173, 174, 176, 185, 246, 28,  70,  97,  105, 52,  64,  126, 15,
    85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
    44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,
    106, 220, 55,  200, 108, 193, 171, 250, 36,  225, 123, 8,   12,  189, 177, 74,
    120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254, 59,  0,   29,  57,
    242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,
    49,  68,  80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20,
};

struct md2 {
    unsigned char state[48];
    unsigned char checksum[MD2_BLOCK];
    unsigned char pending[MD2_BLOCK];
    size_t used;
};

static void md2_compress(struct md2 *h, const unsigned char block[MD2_BLOCK])
{
    unsigned char t = h->checksum[MD2_BLOCK - 1];
    int i, j;

    for (i = 0; i < MD2_BLOCK; i++) {
        h->state[MD2_BLOCK + i] = block[i];
        h->state[2 * MD2_BLOCK + i] = (unsigned char)(h->state[i] ^ block[i]);
        t = h->checksum[i] ^= md2_s[block[i] ^ t];
    }
    t = 0;
    for (j = 0; j < 18; j++) {
        for (i = 0; i < 48; i++)
            t = h->state[i] ^= md2_s[t];
        t = (unsigned char)(t + j);
    }
}

static void md2_update(struct md2 *h, const void *data, size_t size)
{
    const unsigned char *bytes = data;

    while (size > 0) {
        size_t take = MD2_BLOCK - h->used < size ? MD2_BLOCK - h->used : size;
        memcpy(h->pending + h->used, bytes, take);
        h->used += take;
        bytes += take;
        size -= take;
        if (h->used == MD2_BLOCK) {
            md2_compress(h, h->pending);
            h->used = 0;
        }
    }
}

static void md2_final(struct md2 *h, unsigned char digest[MD2_BLOCK])
{
    unsigned char padding[MD2_BLOCK], checksum[MD2_BLOCK];
    size_t pad = MD2_BLOCK - h->used;

    memset(padding, (int)pad, pad);
    md2_update(h, padding, pad);
    memcpy(checksum, h->checksum, MD2_BLOCK);
    md2_update(h, checksum, MD2_BLOCK);
    memcpy(digest, h->state, MD2_BLOCK);
}

/* One hash input of the key xored with `pad`: HMAC's inner (0x36) and outer (0x5c) start. */
static void hmac_start(struct md2 *h, unsigned char pad)
{
    static const unsigned char key[MD2_BLOCK] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                                 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};
    unsigned char block[MD2_BLOCK];
    int i;

    memset(h, 0, sizeof *h);
    for (i = 0; i < MD2_BLOCK; i++)
        block[i] = key[i] ^ pad;
    md2_update(h, block, MD2_BLOCK);
}

struct integrity_facts {
    uint32_t driver_version;
    uint32_t runtime_value;
    uint32_t process;
    uint32_t thread;
    const void *cudart_table;
    const void *integrity_table;
    const void *answering_function;
    uint64_t unix_seconds;
};

struct device_facts {
    unsigned char uuid[16];
    int32_t pci_domain;
    int32_t pci_bus;
    int32_t pci_device;
};

static CUresult hash_devices(struct md2 *h)
{
    struct device_facts facts;
    CUuuid uuid;
    CUresult rc;
    int count, dev;

    if ((rc = cuDeviceGetCount(&count)) != CUDA_SUCCESS)
        return rc;
    for (dev = 0; dev < count && dev < MAX_DEVICES; dev++) {
        if ((rc = cuDeviceGetUuid_v2(&uuid, dev)) != CUDA_SUCCESS ||
            (rc = cuDeviceGetAttribute(&facts.pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
                                       dev)) != CUDA_SUCCESS ||
            (rc = cuDeviceGetAttribute(&facts.pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev)) !=
                CUDA_SUCCESS ||
            (rc = cuDeviceGetAttribute(&facts.pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
                                       dev)) != CUDA_SUCCESS)
            return rc;
        memcpy(facts.uuid, uuid.bytes, sizeof facts.uuid);
        md2_update(h, &facts, sizeof facts);
    }
    return CUDA_SUCCESS;
}

CUresult vgpu_integrity_answer(uint32_t runtime_value, uint64_t unix_seconds,
                               const void *cudart_table, const void *integrity_table,
                               const void *answering_function, uint64_t result[2])
{
    struct integrity_facts facts;
    struct md2 h;
    unsigned char inner[MD2_BLOCK], outer[MD2_BLOCK];
    int driver_version;
    CUresult rc;

    if (result == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (runtime_value % 10 == 0 || runtime_value % 10 == 1) {
        result[0] = runtime_value % 10 == 0 ? 0x3341181C03CB675CULL : 0x1841181C03CB675CULL;
        result[1] = 0x8ED383AA1F4CD1E8ULL;
        return CUDA_SUCCESS;
    }
    if ((rc = cuDriverGetVersion(&driver_version)) != CUDA_SUCCESS)
        return rc;
    memset(&facts, 0, sizeof facts);
    facts.driver_version = (uint32_t)driver_version;
    facts.runtime_value = runtime_value;
    facts.process = (uint32_t)getpid();
    facts.thread = (uint32_t)(uintptr_t)pthread_self();
    facts.cudart_table = cudart_table;
    facts.integrity_table = integrity_table;
    facts.answering_function = answering_function;
    facts.unix_seconds = unix_seconds;
    hmac_start(&h, 0x36);
    md2_update(&h, &facts, sizeof facts);
    if ((rc = hash_devices(&h)) != CUDA_SUCCESS)
        return rc;
    md2_final(&h, inner);
    hmac_start(&h, 0x5c);
    md2_update(&h, inner, sizeof inner);
    md2_final(&h, outer);
    memcpy(result, outer, sizeof outer);
    return CUDA_SUCCESS;
}
