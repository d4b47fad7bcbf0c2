// Where a cooperative matmul's partial sums of row m lie in `part`, in rows of the matmul's width
// (matmul_coop.comp and matmul_coop_direct.comp write them, reduce.comp adds them;
// coop_tiles.coop_partial_floats sizes the buffer). Needs common.glsl's meta and pc.fold_rows.
//
// The rows before D = meta.prompt_start (the step's tokens but its prompt tokens, which come last:
// StepBatch) hold K-chunk sums, chunk c's rows a slot of D rows padded to 32 after chunk 0's; one
// chunk where the matmul added them itself (D above pc.fold_rows). The prompt tokens' rows follow
// those chunks, each one sum over all of K (matmul_coop.comp WHOLE_K). The LM head's gathered rows
// (ROWS) are all of the first kind.

uint chunked_rows() {  // D
#ifdef ROWS
    return meta.num_rows;
#else
    return meta.prompt_start;
#endif
}

uint chunk_slot_rows(uint D) { return (D + 31u) / 32u * 32u; }

uint chunks_held(uint D, uint chunks) { return D > pc.fold_rows ? 1u : chunks; }  // of each row before D

// The row of `part` holding row m's chunk 0 (from D on: its one sum over all of K).
uint partial_row(uint m, uint D, uint chunks) { return m < D ? m : chunks_held(D, chunks) * chunk_slot_rows(D) + m - D; }
