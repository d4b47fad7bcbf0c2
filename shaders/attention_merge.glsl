// attention.comp's end (included after its buffers, push constants and shared arrays): the merge
// of a token's chunks by the last of them to finish, and (SPLIT_OUT) the o projection's input
// written by the last of the token's kv heads to finish.

// The merge (attention.comp's header): called by the last of the (t, kv head) counter's `tj`
// chunks, after its count (or by the serial grid's one workgroup of them, which never counted);
// the chunks' records in chunk order, then the counter reset for the next layer. rec: vec4 per record of part_acc; qbase: the vec4 index of the group's outputs.
void merge_chunks(uint tj, uint tokens_heads, uint nchunks, uint G, uint hd, uint qbase) {
    uint tid = gl_LocalInvocationID.x, rec = G * hd / 4u;
    if (tid < G) {  // record of chunk c: c * tokens_heads + tj
        float M = NEG;
        for (uint c = 0u; c < nchunks; c++) M = max(M, part_ml[(c * tokens_heads + tj) * 2u * G + tid]);
        float L = 0.0;
        for (uint c = 0u; c < nchunks; c++) {
            uint r = (c * tokens_heads + tj) * 2u * G;
            float w = exp(part_ml[r + tid] - M);
            weight[c * GMAX + tid] = w;
            L += part_ml[r + G + tid] * w;
        }
        total[tid] = L;
    }
    barrier();
    for (uint e = tid; e < rec; e += WG) {
        uint g = e / (hd / 4u);
        vec4 sum = vec4(0.0);
        for (uint c = 0u; c < nchunks; c++) sum += part_acc[(c * tokens_heads + tj) * rec + e] * weight[c * GMAX + g];
        o4[qbase + e] = sum / total[g];
    }
    if (tid == 0u) counters[tj] = 0u;
}

#ifdef SPLIT_OUT
// Called by each workgroup that wrote its (token t, kv head) slice of the output: the last of the
// token's kv heads to finish writes the whole row as the o projection's input, exactly as
// split.comp does (an exact max, then elementwise), and resets the token's counter.
void split_when_last(uint t, uint tokens_heads) {
    uint tid = gl_LocalInvocationID.x, K4 = NUM_HEADS * HEAD_DIM / 4u;
    RETURN_UNLESS_LAST(last_of_token, counters[tokens_heads + t], NUM_KV_HEADS);  // of the token's kv heads
    float mx = 0.0;
    for (uint i = tid; i < K4; i += WG) {
        vec4 a = abs(o4[t * K4 + i]);
        mx = max(mx, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float s = split_scale(workgroup_max(mx));
    for (uint i = tid; i < K4; i += WG) {
        vec4 v = o4[t * K4 + i] * s;
        uvec2 a = split_words(v.xy), b = split_words(v.zw);
        uint at = t * 4u * K4 + 2u * i;  // the row's hi words, then 2 K4 lo words
        split_out[at] = a.x;
        split_out[at + 1u] = b.x;
        split_out[at + 2u * K4] = a.y;
        split_out[at + 2u * K4 + 1u] = b.y;
    }
    if (tid == 0u) {
        split_scale_out[t] = 1.0 / s;
        counters[tokens_heads + t] = 0u;
    }
}
#endif
