"""reduce_gated_split_rows with ACT_VEC sized for the model (kernels.gated_row_vec, specialization
constant 5: 3 for the 4b) against the largest (6, what it was before): binary size and registers,
logits hashes (must agree), median 4b decode step at batch 16 and 32, alternating, three rounds.

    python3 act_vec.py"""
from builds import alternate_settings

NAME = "reduce_gated_split_rows"


def act_vec(vec: int):
    def setup(backend) -> None:
        kernels = backend.kernels
        kernels.constants = (*kernels.constants[:5], vec, *kernels.constants[6:])
        kernels.pipelines.pop(NAME, None)
    return setup


if __name__ == "__main__":
    alternate_settings([("model's (3)", act_vec(3)), ("largest (6)", act_vec(6))], batches=(16, 32))
