/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests on machines without a GPU.
 *
 * Built by the tests with gcc -shared; the -D values choose what it reports:
 *   STUB_INIT_STATUS   what cuInit returns (0 = CUDA_SUCCESS)
 *   STUB_CUDA_VERSION  what cuDriverGetVersion reports (11020 = CUDA 11.2)
 *   STUB_DEVICES       how many GPUs the driver lists, each named STUB_NAME with compute
 *                      capability STUB_CC_MAJOR.STUB_CC_MINOR
 */
#include <string.h>

#ifndef STUB_INIT_STATUS
#define STUB_INIT_STATUS 0
#endif
#ifndef STUB_CUDA_VERSION
#define STUB_CUDA_VERSION 11020
#endif
#ifndef STUB_DEVICES
#define STUB_DEVICES 0
#endif
#ifndef STUB_NAME
#define STUB_NAME "Stub GPU"
#endif
#ifndef STUB_CC_MAJOR
#define STUB_CC_MAJOR 7
#endif
#ifndef STUB_CC_MINOR
#define STUB_CC_MINOR 5
#endif

typedef int CUresult;
typedef int CUdevice;

CUresult cuInit(unsigned int flags) { (void)flags; return STUB_INIT_STATUS; }

CUresult cuDriverGetVersion(int *version) {
  *version = STUB_CUDA_VERSION;
  return 0;
}

CUresult cuDeviceGetCount(int *count) {
  *count = STUB_DEVICES;
  return 0;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (ordinal < 0 || ordinal >= STUB_DEVICES) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *device = ordinal;
  return 0;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
  (void)device;
  strncpy(name, STUB_NAME, (size_t)len - 1);
  name[len - 1] = '\0';
  return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
  (void)device;
  if (attribute == 75) *value = STUB_CC_MAJOR;      /* COMPUTE_CAPABILITY_MAJOR */
  else if (attribute == 76) *value = STUB_CC_MINOR; /* COMPUTE_CAPABILITY_MINOR */
  else *value = 0;
  return 0;
}
