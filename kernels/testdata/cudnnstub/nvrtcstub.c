// nvrtcstub: a stand-in for NVRTC (libnvrtc.so.MAJOR) and, built with -DBUILTINS, for its
// libnvrtc-builtins.so.MAJOR.9, for the cuDNN stub's tests (kernels/cuda_cudnn_stub_test.go,
// stubNVRTC): cudnnstub.c finalises an execution plan only when nvrtcVersion resolves in the
// global namespace and the builtins library of that version is loaded, as cuDNN's
// runtime-compiled engines need them. The version says minor 9, which no real builtins library
// has, so that a real NVRTC on the machine cannot stand in for the stub's.
//
//	gcc -shared -fPIC -DNVRTC_MAJOR=13 -Wl,-soname,libnvrtc.so.13 -o libnvrtc.so.13 nvrtcstub.c
//	gcc -shared -fPIC -DNVRTC_MAJOR=13 -DBUILTINS -Wl,-soname,libnvrtc-builtins.so.13.9 -o libnvrtc-builtins.so.13.9 nvrtcstub.c

#ifndef NVRTC_MAJOR
#error NVRTC_MAJOR must be defined
#endif

#ifdef BUILTINS
// The builtins library exports nothing the stub looks up: being loaded is what counts.
__attribute__((visibility("default"))) int nvrtcstub_builtins_major(void) { return NVRTC_MAJOR; }
#else
// nvrtcVersion is NVRTC's: its major and minor version, and NVRTC_SUCCESS (0).
__attribute__((visibility("default"))) int nvrtcVersion(int* major, int* minor) {
	*major = NVRTC_MAJOR;
	*minor = 9;
	return 0;
}
#endif
