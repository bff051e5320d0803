/* flexshim's public C API, for programs that want to talk to the preloaded library.
 *
 * Every function is also safe to call when libflexshim.so is not loaded if the program declares
 * them weak (see README): check the function pointer for NULL first. */
#ifndef FLEXSHIM_H
#define FLEXSHIM_H

#ifdef __cplusplus
extern "C" {
#endif

#define FLEXSHIM_VERSION_MAJOR 0
#define FLEXSHIM_VERSION_MINOR 1
#define FLEXSHIM_VERSION_PATCH 0
#define FLEXSHIM_VERSION_STRING "0.1.0"

/* "0.1.0" */
const char *flexshim_version(void);

/* 1 when flexshim manages allocations in this process, 0 when it only passes calls through
 * (disabled, configuration error, or no usable GPU). */
int flexshim_active(void);

/* The program's next kernel launch starts an iteration (a training step, a decode step). Call it
 * at the top of the loop where flexshim's discovery cannot find the iteration from the launches
 * alone; once a few marks were seen, the iteration is the launches between two of them. Does
 * nothing unless a profile is being recorded (FLEXTENSOR_PROFILE_OUT). FLEXTENSOR_ITERATION_KERNEL
 * does the same without a code change. */
void flexshim_mark_iteration(void);

#ifdef __cplusplus
}
#endif

#endif
