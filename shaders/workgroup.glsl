// Reductions over a workgroup in a fixed order (the subgroup's, then the subgroups in index
// order), so that a value depends only on its inputs. Needs GL_KHR_shader_subgroup_arithmetic;
// barriers inside: call from uniform control flow.

shared float wg_red[256];  // a subgroup's partial each: up to 1024 invocations in subgroups of 4

float workgroup_sum(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) wg_red[gl_SubgroupID] = s;
    barrier();
    float total = 0.0;
    for (uint j = 0; j < gl_NumSubgroups; j++) total += wg_red[j];
    barrier();
    return total;
}

float workgroup_max(float v) {
    float mx = subgroupMax(v);
    if (subgroupElect()) wg_red[gl_SubgroupID] = mx;
    barrier();
    for (uint j = 0; j < gl_NumSubgroups; j++) mx = max(mx, wg_red[j]);
    barrier();
    return mx;
}
