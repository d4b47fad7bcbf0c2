"""Prompts fed beside a full batch in small steps (Scheduler.small_step: at most 64 tokens a step
while at least half the batch decodes) against steps of the whole budget, alternating in one
process on job_steps.py's jobs: 256 random prompts of 128 tokens (with and without early stops)
and of 16-512 tokens (with stops), at most 32 at once, steps of up to 512 tokens, two ahead. The
completions must be the same under both rules.

    python3 small_ab.py [requests] [rounds]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_steps import jobs, logged_run  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    backend, prompts, stops, varied = jobs(n)
    cases = {"128-token prompts, stops": (prompts, stops), "16-512-token prompts, stops": (varied, stops),
            "128-token prompts, no stops": (prompts, None)}
    first = {}
    for rnd in range(rounds):
        for name, (ps, st) in cases.items():
            for small in (True, False):
                label = f"round {rnd} {name}, {'small steps' if small else 'whole budget'}"
                done = logged_run(backend, ps, st, label, small)
                first.setdefault(name, done)
                print(f"  completions as the first run's: {done == first[name]}", flush=True)


if __name__ == "__main__":
    main()
