# The bench's 4b cases with the opt-in fp16 inputs (GEMMA_BATCH_VK_COOPMAT_INPUTS=fp16), same tree.
GEMMA_BATCH_VK_COOPMAT_INPUTS=fp16 python3 -m gemma_batch bench --shape 4b --batch 1,32 --prompt-len 128 --gen-len 128 \
  --backend vulkan --json "$1"
