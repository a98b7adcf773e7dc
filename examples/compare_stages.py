"""Run ZeRO stages 0-3 on the same model and print what each rank holds and sends per step.

    python examples/compare_stages.py            # N = 4 ranks, the default model
    python examples/compare_stages.py 8 512,512  # N = 8, hidden widths 512,512

Each stage runs as `mpirun -n N python -m zerompi.train --report json`; the numbers below are the
ledger's measurements of rank 0, beside the formulas of the ZeRO paper.
"""
import sys

from zerompi_runs import report as run_report


def main(num_ranks=4, hidden="128,128"):
    print(f"N = {num_ranks} ranks, hidden {hidden}: rank 0's model state and communication per step")
    print(f"{'stage':>5} {'params B':>10} {'grads B':>10} {'optimizer B':>12} {'formula B':>10}"
          f" {'comm elems':>11} {'formula':>9}")
    for stage in range(4):
        report = run_report(num_ranks, "--stage", stage, "--hidden", hidden, "--steps", 20)
        rank0 = report["per_rank"][0]
        print(f"{stage:>5} {rank0['params']:>10.0f} {rank0['grads']:>10.0f} {rank0['optimizer']:>12.0f}"
              f" {report['memory_formula_bytes']['total']:>10.0f}"
              f" {rank0['grads_elements'] + rank0['params_elements']:>11.0f}"
              f" {report['comm_formula_elements_per_step']:>9.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, sys.argv[2] if len(sys.argv) > 2 else "128,128")
