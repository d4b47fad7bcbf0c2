"""Small prefill steps with each K chunk a workgroup (coop_tiles.coop_fold_rows, 2 workgroups an
SM) against the rule before it (the prefill tile's workgroups always sum their chunks:
COOP_FOLD_GROUPS_PER_SM = 0), alternating in one process, on stops_ab.py's job (256 requests,
at most 32 at once, steps of up to 512 tokens, early stops) and on the same job without stops.
The two rules sum alike, so the completions must be the same.

    python3 fold_ab.py [requests] [rounds]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stops_ab  # noqa: E402
from gemma_batch.backends.vulkan import coop_tiles  # noqa: E402

RULES = {"chunks as workgroups": 2, "summed in the tile (before)": 0}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    backend = stops_ab.backend_4b()  # step buffers first sized under the new rule: its partial sums are the larger
    prompts, stops, expect = stops_ab.job(backend, n)
    free = {i: None for i in range(n)}
    for rnd in range(rounds):
        for label, per_sm in RULES.items():
            coop_tiles.COOP_FOLD_GROUPS_PER_SM = per_sm
            backend._drop_graph()  # recorded again with the rule's grids and push constants
            stops_ab.report(f"round {rnd} {label}, stops", backend, prompts, stops, expect, 2)
            wall, done, st = stops_ab.run(backend, prompts, None, 2)
            if free[0] is None:
                free = done
            print(f"round {rnd} {label}, no stops: {n * stops_ab.GEN / wall:,.1f} tok/s ({wall:.3f} s, {st.steps} steps); "
                  f"completions as the first run's: {done == free}", flush=True)


if __name__ == "__main__":
    main()
