// Weight tiles loaded as the matrix units' A fragments (matmul_coop_direct.comp; matmul_coop.comp
// stages them into rows). With FRAGMENT_LOADS (specialization constant 6, kernels.Kernels'
// fragment_loads), each 16 x 16 fp16 tile is stored in the order of an A fragment (weights.py,
// fragment_order.py): lane l's 8 components are the 16 bytes at l * 16 of the tile, so a lane loads
// its part in one 16-byte load and the fragment is built from those components (int8 tiles, W_T8:
// 8 bytes a lane, in the same order, always). The component order of VK_KHR_cooperative_matrix
// is the driver's; fragment_order.py reads it once per device with coop_fragment_probe.comp and
// turns this path on only where it is the order the tiles are stored in. Off, tiles are row-major
// and coopMatLoad reads them. The values multiplied are the same either way.
layout(constant_id = 6) const bool FRAGMENT_LOADS = false;

MAT_A fragment_of(uvec4 w) {  // a lane's 16 bytes of a tile in fragment order
    MAT_A a;
    f16vec2 p0 = unpackFloat2x16(w.x), p1 = unpackFloat2x16(w.y), p2 = unpackFloat2x16(w.z), p3 = unpackFloat2x16(w.w);
    a[0] = p0.x; a[1] = p0.y; a[2] = p1.x; a[3] = p1.y;
    a[4] = p2.x; a[5] = p2.y; a[6] = p3.x; a[7] = p3.y;
    return a;
}
