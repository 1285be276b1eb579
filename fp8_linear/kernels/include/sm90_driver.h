// Host-side driver helpers shared by the dense (csrc/sm90_host.cu) and grouped (csrc/sm90_grouped.cu)
// GEMMs: the tensor-map encoder through the runtime's driver entry point (no -lcuda), and a current
// context on the calling thread. Defined in csrc/sm90_host.cu. No device code.
#pragma once
#include <cudaTypedefs.h>

namespace fp8sm90 {

// cuTensorMapEncodeTiled, looked up once per process; nullptr when the driver does not have it.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn();

// cuTensorMapEncodeTiled is a driver call and needs a current context on this thread; a fresh host
// thread may have none yet (CUresult 201). cudaSetDevice makes the runtime's primary context current
// (CUDA >= 12), once per thread and device; it is no stream operation, so it is also safe while a
// stream is being captured. Returns nullptr or the runtime's error text.
const char* ensure_context();

}  // namespace fp8sm90
