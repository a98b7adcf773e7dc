"""Loss curves of ZeRO stages 0-3 from their --metrics files, on top of each other: they coincide.

    pip install ".[plot]"
    python examples/plot_loss.py                          # N = 4, 150 steps -> runs/figures/loss_curves.png
    python examples/plot_loss.py --ranks 2 --steps 20 --out loss.png

Each stage trains the same model from the same seed with
`mpirun -n N python -m zerompi.train --stage S --metrics stageS.jsonl`; the script reads each
file's per-step loss. Every stage computes the same AdamW step, so the four curves lie on top of
each other; the legend gives the largest difference from stage 0's loss (float32 rounding: the
stages add the ranks' gradients in different orders).
"""
import os
import tempfile

from zerompi_runs import FIGURES, figure_args, finish_figure, pyplot, read_jsonl, train

DEFAULT_OUT = os.path.join(FIGURES, "loss_curves.png")

LOSS_TOLERANCE = 1e-3        # relative: another BLAS kernel rounds the float32 sums otherwise
STAGE_STYLES = (("tab:gray", "-", 5), ("tab:blue", "--", 3), ("tab:orange", "-.", 2), ("tab:green", ":", 1.5))


def run_stages(num_ranks, steps, folder):
    """{stage: [loss of step 1, 2, ...]} read from each stage's --metrics file."""
    losses = {}
    for stage in range(4):
        path = os.path.join(folder, f"stage{stage}.jsonl")
        train(num_ranks, "--stage", stage, "--steps", steps, "--metrics", path, "--log-every", 0,
              "--report", "none")
        losses[stage] = [line["loss"] for line in read_jsonl(path)]
    return losses


def plot(losses, num_ranks, out):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    for stage, loss in losses.items():
        color, style, width = STAGE_STYLES[stage]
        largest = max(abs(a - b) for a, b in zip(loss, losses[0]))
        ax.plot(range(1, len(loss) + 1), loss, style, color=color, linewidth=width,
                label=f"stage {stage}" + (f" (max |loss - stage 0| = {largest:.1e})" if stage else ""))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title(f"ZeRO stages 0-3, N = {num_ranks} ranks, float32: the same training run")
    data = {f"stage {stage}": loss for stage, loss in losses.items()}
    finish_figure(fig, ax, out, data, LOSS_TOLERANCE)


def main():
    args = figure_args(__doc__, DEFAULT_OUT)
    with tempfile.TemporaryDirectory() as folder:
        losses = run_stages(args.ranks, args.steps, folder)
    plot(losses, args.ranks, args.out)


if __name__ == "__main__":
    main()
