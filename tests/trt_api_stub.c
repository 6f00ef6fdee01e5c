/* A stand-in for libnvinfer, libnvonnxparser, libnvinfer_plugin and (8.6) libnvparsers, for
 * tests/test_tensorrt_api.py: the C symbols the TensorRT Python bindings 8.6-11.x link against
 * (nm -D --undefined-only tensorrt.so), every factory returning NULL, which is what libnvinfer does when
 * CUDA cannot start. The bindings then import, and trt.Builder / trt.Runtime raise
 * "TypeError: pybind11::init(): factory function returned nullptr", as on a machine without a GPU. */
#include <stddef.h>
void *createInferBuilder_INTERNAL(void *l, int v) { return NULL; }
void *createInferRefitter_INTERNAL(void *e, void *l, int v) { return NULL; }
void *createInferRuntime_INTERNAL(void *l, int v) { return NULL; }
void *createNvOnnxParserRefitter_INTERNAL(void *r, void *l, int v) { return NULL; }
void *createNvOnnxParser_INTERNAL(void *n, void *l, int v) { return NULL; }
void *getBuilderPluginRegistry(int t) { return NULL; }
int getNvOnnxParserVersion(void) { return 0; }
void *getPluginRegistry(void) { return NULL; }
int initLibNvInferPlugins(void *l, const char *ns) { return 0; }
void *_ZN11nvuffparser15createUffParserEv(void) { return NULL; }
void _ZN11nvuffparser8FieldMapC1EPKcPKvNS_9FieldTypeEi(void *s, const char *n, const void *d, int t, int l) {}
void *_ZN14nvcaffeparser117createCaffeParserEv(void) { return NULL; }
void _ZN14nvcaffeparser123shutdownProtobufLibraryEv(void) {}
