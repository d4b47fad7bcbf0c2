// Dispatches chained without pipeline barriers (graph.py, `chain`): each workgroup waits until
// the dispatch recorded before it has finished, and counts itself done when it has finished; the
// last of a dispatch's workgroups to count itself sets the dispatch's flag. So the next kernel's
// launch, and whatever it does before chain_wait (loads of weights and of the step header),
// overlap the tail of the one before, where a pipeline barrier would drain the device.
//
// Binding 16 is the chain buffer from this dispatch's record on (step_buffers.CHAIN_RECORD
// bytes a record): the previous dispatch's words [0, 16) (done count at 0, flag at 8), then this
// one's [16, 32). Word 1 of a record counts its dispatch's waits that gave up after
// CHAIN_SPIN_LIMIT polls; the host checks it (a step whose order broke is reported, never hung).
// CHAIN false (the default): no-ops, and the recording orders the dispatches with barriers.
// Buffers that an earlier dispatch of the step wrote are read STEP_IN (coherent): no barrier
// invalidates the first-level caches between chained dispatches.
layout(constant_id = 3) const bool CHAIN = false;
layout(std430, binding = 16) volatile coherent buffer ChainB { uint chain[]; };
#define STEP_IN coherent readonly
#define CHAIN_SPIN_LIMIT (1u << 24)

void chain_wait() {
    if (!CHAIN) return;
    if (gl_LocalInvocationIndex == 0u) {
        for (uint polls = 0u; chain[8] == 0u; polls++) {
            if (polls == CHAIN_SPIN_LIMIT) {
                atomicAdd(chain[17], 1u);
                break;
            }
        }
    }
    barrier();
    memoryBarrierBuffer();
}

// After the workgroup's last write (call from uniform control flow, once; it waits first if the
// workgroup has not, so that a dispatch is never done before the one before it).
void chain_done() {
    if (!CHAIN) return;
    chain_wait();
    memoryBarrierBuffer();  // this workgroup's writes are visible before it counts itself done
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
        if (atomicAdd(chain[16], 1u) == groups - 1u) {
            memoryBarrierBuffer();
            chain[24] = 1u;
        }
    }
}
