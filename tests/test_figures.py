"""A run's figures show what happened to it (issue 44 item 4): the loss from
step 0 with the chance and no-retrieval lines inside the axes, the
diagnostics from step 0, readable ticks on a log axis of few decades, a
diverged run's title whole, and each run's own mechanism figure over
training; the experiment's mechanism figure with x labels that do not
overlap and a word for a median off its log axis; an experiment's curves
over training holding every median from step 0, its loss figures with the
chance and no-retrieval lines inside the axes, and its log axes of few
decades read in plain numbers; `attn demo`."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import TINY
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import same_color

from attn import cli
from attn.analysis import stats
from attn.analysis.curves import band_stats
from attn.analysis.grouping import Run, group_runs
from attn.config.loading import load_config
from attn.model import head
from attn.report import compare_figure, experiment_figures
from attn.store import arrayfiles, runs
from attn.train import figures, lifecycle, loop

REPO = Path(__file__).resolve().parents[1]
REFERENCES = {"chance": 2.772588722239781, "no_retrieval": 1.7983973799733117}
STEPS = list(range(0, 1510, 10))


def records_of(losses, score_std=None, grads=None) -> list[dict]:
    """Metric records at STEPS with these losses (train and eval), score std and ‖∇W_q‖ (= ‖∇W_k‖)."""
    out = []
    for i, (step, loss) in enumerate(zip(STEPS, losses)):
        grad = 0.5 if grads is None else grads[i]
        out.append(
            {
                "step": step,
                "train_loss": loss * 1.02,
                "eval_loss": loss,
                "eval_accuracy": 0.5,
                "score_std": 3.3 + 0.001 * i if score_std is None else score_std[i],
                "attn_entropy": 1.0,
                "saturated_frac": 0.0,
                "grad_norm/W_q": grad,
                "grad_norm/W_k": grad,
            }
        )
    return out


LEARNED = [max(3.3 * math.exp(-s / 20), 1e-4 * (1 + 0.1 * math.sin(s))) for s in STEPS]  # the bulk near 1e-4
STALLED = [3.7] + [2.75 + 0.04 * math.sin(s) for s in STEPS[1:]]  # at chance from step 10


def made_run(tmp_path: Path, name: str, records: list[dict], **summary) -> Path:
    config = load_config(None, [*TINY, f"runs_dir={tmp_path}"])
    run_dir = lifecycle.create(config, name=name)
    for record in records:
        runs.append_metrics(run_dir, record)
    runs.write_json(
        run_dir / "summary.json",
        {"status": "completed", "step": records[-1]["step"], "references": REFERENCES, **summary},
    )
    return run_dir


def drawn(run_dir: Path, monkeypatch, name: str) -> dict:
    """plot_run's figures by file name, none written; the one `name`d drawn (laid out as saved), the others
    made but not drawn (rendering is most of a figure's time, and each test here reads one figure)."""
    made = {}

    def keep(fig, path, tight=True):
        if Path(path).name == name:
            if tight:
                fig.tight_layout()
            FigureCanvasAgg(fig).draw()
        made[Path(path).name] = fig
        return path

    monkeypatch.setattr(figures, "save_figure", keep)
    figures.plot_run(run_dir)
    return made


def holds(ax, *values) -> bool:
    low, high = ax.get_ylim()
    return all(low <= v <= high for v in values)


def labelled(axis) -> list[str]:
    """The tick labels a reader sees on an axis (drawn): inside its range, with text."""
    low, high = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return [
        t.label1.get_text()
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high
    ]


def test_the_loss_figure_holds_step_0_and_the_reference_lines(tmp_path, monkeypatch):
    made = drawn(made_run(tmp_path, "learned", records_of(LEARNED)), monkeypatch, "loss.png")
    [ax] = made["loss.png"].axes
    assert ax.get_yscale() == "log"
    assert holds(ax, LEARNED[0], LEARNED[0] * 1.02, *REFERENCES.values(), min(LEARNED))


def test_a_run_at_chance_leaves_the_chance_line_drawn_over_its_curve(tmp_path, monkeypatch):
    [ax] = drawn(made_run(tmp_path, "stalled", records_of(STALLED)), monkeypatch, "loss.png")["loss.png"].axes
    levels = set(REFERENCES.values())
    references = [line for line in ax.get_lines() if set(line.get_ydata()) <= levels and len(line.get_ydata())]
    curves = [line for line in ax.get_lines() if line not in references]
    assert references and curves
    assert min(r.get_zorder() for r in references) > max(c.get_zorder() for c in curves)


def test_a_loss_at_chance_is_drawn_on_a_log_axis_with_ticks_a_reader_can_read(tmp_path, monkeypatch):
    made = drawn(made_run(tmp_path, "stalled", records_of(STALLED)), monkeypatch, "loss.png")
    [ax] = made["loss.png"].axes
    low, high = ax.get_ylim()
    assert math.log10(high / low) < 1 and holds(ax, STALLED[0], *REFERENCES.values())
    assert plain_numbers(labelled(ax.yaxis)) >= 3, labelled(ax.yaxis)


def plain_numbers(labels: list[str]) -> int:
    """How many labels there are, each a plain number a reader reads at once (2.5, 0.05), else 0."""
    try:
        return len([float(text) for text in labels])
    except ValueError:
        return 0


def test_a_log_axis_of_a_decade_or_two_is_labelled_in_plain_numbers(tmp_path, monkeypatch):
    grads = list(np.geomspace(0.9, 0.05, len(STEPS)))  # 1.3 decades: matplotlib labels only 0.1 and 1
    made = drawn(made_run(tmp_path, "narrow", records_of(LEARNED, grads=grads)), monkeypatch, "diagnostics.png")
    grad_ax = made["diagnostics.png"].axes[3]
    assert plain_numbers(labelled(grad_ax.yaxis)) >= 3, labelled(grad_ax.yaxis)


def test_the_diagnostics_hold_step_0_and_draw_gradient_norms_on_a_log_axis(tmp_path, monkeypatch):
    score_std = [1.01] + [3.32 + 0.001 * i for i in range(len(STEPS) - 1)]  # step 0 far below the rest
    made = drawn(made_run(tmp_path, "diag", records_of(LEARNED, score_std=score_std)), monkeypatch, "diagnostics.png")
    score_ax, _, _, grad_ax = made["diagnostics.png"].axes
    assert holds(score_ax, 1.01, max(score_std))
    assert grad_ax.get_yscale() == "log"


def test_a_diverged_run_keeps_its_whole_title_inside_the_figure(tmp_path, monkeypatch):
    reason = "non-finite loss at step 497; largest weight in E_pos: |w| = 2.89e+27"
    run_dir = made_run(
        tmp_path, "retrieval_unscaled-20260101-120000", records_of(STALLED[:50]), status="diverged", reason=reason
    )
    fig = drawn(run_dir, monkeypatch, "loss.png")["loss.png"]
    title = fig.axes[0].title
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert "|w| = 2.89e+27" in title.get_text().replace("\n", " ")
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width


def test_a_run_that_diverged_before_its_second_record_spans_its_steps_in_whole_steps(tmp_path, monkeypatch):
    reason = "non-finite loss at step 4"
    run_dir = made_run(tmp_path, "early", records_of(STALLED[:1]), status="diverged", step=4, reason=reason)
    figures = drawn(run_dir, monkeypatch, "loss.png")
    for name in ("loss.png", "diagnostics.png"):
        ax = figures[name].axes[0]
        low, high = ax.get_xlim()
        assert low <= 0 < 4 <= high, (name, ax.get_xlim())
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks == [round(t) for t in ticks] and {0, 4} <= set(ticks), (name, ticks)


def test_each_run_draws_score_std_against_theory_saturated_rows_and_row_gradients(tmp_path, monkeypatch):
    grads = [0.5] + [0.0] * (len(STEPS) - 1)  # every gradient exactly 0 after step 0: saturated rows pass none
    run_dir = made_run(tmp_path, "mech", records_of(STALLED, grads=grads))
    trace = {}
    for step in (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        trace.update(
            {
                f"{step}/saturated_frac": 1.0,
                f"{step}/grad_W_q_median_saturated": 0.0,
                f"{step}/grad_W_q_median_other": 0.3,
            }
        )
    arrayfiles.save_arrays(run_dir / loop.MECHANISM_TRACE, {k: np.float64(v) for k, v in trace.items()})
    std_ax, saturated_ax, grad_ax = drawn(run_dir, monkeypatch, "mechanism.png")["mechanism.png"].axes
    config = lifecycle.config_of(run_dir)
    theory = config.model.d_k**-0.5 * math.sqrt(config.model.d_k) * config.model.qk_gain**2  # s √d_k g², s = 1/√d_k
    assert any(list(line.get_ydata()) == [theory, theory] for line in std_ax.get_lines()), "the theory line"
    assert any(line.get_label().startswith("s·√d_k·g² = 1 (") for line in std_ax.get_lines()), "in digits"
    first = next(r["score_std"] for r in runs.read_metrics(run_dir) if "score_std" in r)
    assert f"score std (step 0: {first:.3g})" in [line.get_label() for line in std_ax.get_lines()], "its start, read"
    assert std_ax.get_yscale() == grad_ax.get_yscale() == "log" and holds(std_ax, theory, 3.3)
    [std_line] = [line for line in std_ax.get_lines() if line.get_label().startswith("score std")]
    marked = [std_line.get_xdata()[i] for i in std_line.get_markevery()]  # the first logged steps, spread by the log
    assert std_line.get_marker() == "." and marked == [s for s in STEPS if s < figures.FIRST_MARKED * 10]
    assert saturated_ax.get_ylim()[0] <= 0 and saturated_ax.get_ylim()[1] >= 1
    lines = {line.get_label(): line for line in grad_ax.get_lines()}
    assert figures.ZERO_LABEL in lines, "a median of 0 is said, not dropped"
    assert len(lines[figures.ZERO_LABEL].get_xdata()) >= 1
    other = [label for label in lines if "other rows" in label]
    assert other and list(lines[other[0]].get_xdata()) == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    left = grad_ax.transData.transform([(grad_ax.get_xlim()[0], 1)])[0][0]
    step0 = grad_ax.transData.transform([(0, 1)])[0][0]
    radius = max(line.get_markersize() for line in grad_ax.get_lines()) / 2 * grad_ax.figure.dpi / 72  # pixels
    assert step0 - left >= radius, ("step 0's markers cut by the axes' left edge", step0 - left, radius)
    fig = grad_ax.figure
    fig.tight_layout()  # as save_figure lays it out
    renderer = fig.canvas.get_renderer()
    for ax in (std_ax, saturated_ax, grad_ax):  # each legend below its axes: it covers no curve, and is seen whole
        legend, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.y1 <= axes_box.y0 and legend.y0 >= 0, (ax.get_title(), legend, axes_box)
        assert 0 <= legend.x0 and legend.x1 <= fig.bbox.width, (ax.get_title(), legend)


def test_a_row_kind_absent_at_some_traced_steps_breaks_its_line_there_instead_of_bridging_them(tmp_path, monkeypatch):
    run_dir = made_run(tmp_path, "gaps", records_of(STALLED))
    traced = (0, 1, 2, 5, 10, 20, 50)
    trace = {f"{step}/grad_W_q_median_saturated": np.float64(0.5) for step in traced}
    trace.update({f"{step}/grad_W_q_median_other": np.float64(0.3) for step in (0, 20, 50)})  # none at 1-10
    trace.update({f"{step}/saturated_frac": np.float64(1.0) for step in traced})
    arrayfiles.save_arrays(run_dir / loop.MECHANISM_TRACE, trace)
    _, _, grad_ax = drawn(run_dir, monkeypatch, "mechanism.png")["mechanism.png"].axes
    [other] = [line for line in grad_ax.get_lines() if "other rows" in line.get_label()]
    y = dict(zip(other.get_xdata(), other.get_ydata()))
    assert [step for step in traced if math.isnan(y.get(step, 0.0))] == [1, 2, 5, 10], y
    assert y[0] == y[20] == 0.3


def test_a_run_traces_its_rows_at_log_spaced_steps_unless_asked_not_to(tmp_path):
    for trace in ("true", "false"):
        config = load_config(
            None, [*TINY, "train.steps=60", f"logging.mechanism_trace={trace}", f"runs_dir={tmp_path}"]
        )
        run_dir = lifecycle.create(config, name=f"trace-{trace}")
        lifecycle.execute(config, run_dir)
        path = run_dir / loop.MECHANISM_TRACE
        assert path.exists() == (trace == "true")
        if path.exists():
            steps = sorted({int(key.split("/")[0]) for key in arrayfiles.load_arrays(path)})
            assert steps == [0, 1, 2, 5, 10, 20, 50]
        assert sorted({int(k.split("/")[0]) for k in arrayfiles.load_arrays(run_dir / "mechanism.npz")}) == [0, 10]


def test_a_qk_norm_run_traces_each_rows_gradient_through_the_norm_and_draws_it(tmp_path, monkeypatch):
    config = load_config(
        None, [*TINY, "model.score=qk_norm", "model.scale=none", "train.steps=12", f"runs_dir={tmp_path}"]
    )
    run_dir = lifecycle.create(config, name="qk-norm")
    lifecycle.execute(config, run_dir)
    trace = arrayfiles.load_arrays(run_dir / loop.MECHANISM_TRACE)
    measured = [trace[f"{step}/grad_W_{w}_median_other"] for step in (0, 10) for w in ("q", "k")]
    assert all(np.isfinite(measured) & (np.asarray(measured) > 0)), measured
    std_ax, _, grad_ax = drawn(run_dir, monkeypatch, "mechanism.png")["mechanism.png"].axes
    assert not any("no row's gradient" in text.get_text() for text in grad_ax.texts)
    theory = math.sqrt(config.model.d_k)  # unscaled, normed q and k: components of mean square 1 at init
    assert any(list(line.get_ydata()) == [theory, theory] for line in std_ax.get_lines()), "qk_norm's theory line"
    start = runs.read_metrics(run_dir)[0]["score_std"]
    assert theory / 1.5 < start < theory * 1.5, (start, theory)
    assert any("other rows" in line.get_label() for line in grad_ax.get_lines())


def test_the_theory_std_is_s_sqrt_dk_g2_for_dot_scores_s_sqrt_dk_for_qk_norm_and_none_for_other_modes():
    assert head.theory_score_std("dot", "sqrt", 256, 2.0) == pytest.approx(4.0)
    assert head.theory_score_std("dot", "none", 256, 1.0) == pytest.approx(16.0)
    assert head.theory_score_std("qk_norm", "none", 256, 2.0) == pytest.approx(16.0)  # the norm undoes W's gain
    assert head.theory_score_std("temperature", "sqrt", 256, 1.0) == pytest.approx(1.0)  # exp(θ₀) = s
    assert head.theory_score_std("temperature", "sqrt", 256, 1.0, temperature_init=1.0) == pytest.approx(16 * math.e)
    for mode in ("softcap", "mup", "sigma_reparam", "log_length"):
        assert head.theory_score_std(mode, "sqrt", 256, 1.0) is None, mode
    assert figures.model_theory_score_std({"score": "softcap", "d_k": 64}) is None


def test_compare_draws_gradient_norms_and_update_ratios_on_log_axes_by_default():
    def band(*values):
        return band_stats([(np.arange(len(values)), np.array(values, dtype=float))])

    assert compare_figure.log_scale("grad_norm/W_q", [band(0.4, 0.5, 0.45)])
    assert compare_figure.log_scale("update_ratio/W_k", [band(0.01, 0.02)])
    assert compare_figure.log_scale("grad_norm", [band(1.0, 2.0)])
    assert not compare_figure.log_scale("grad_norm/W_q", [band(0.4, 0.5)], yscale="linear")


def test_compare_holds_step_0_and_the_references_of_a_learned_run(tmp_path):
    run = Run(tmp_path / "a", {"model.scale": "sqrt", "seed": 0}, records_of(LEARNED), {}, "completed")
    fig = compare_figure.draw_comparison(group_runs([run]), ["eval_loss"], references=REFERENCES)
    assert holds(fig.axes[0], LEARNED[0], *REFERENCES.values())


class Cell:
    """A judged cell's mechanism medians: the saturated rows' gradient 0 from d_k 65536 (it left the log axis)."""

    n, seeds = 1, ()

    def __init__(self, d_k: int, scale: str):
        self.d_k, self.scale = d_k, scale
        self.theory_score_std = math.sqrt(d_k) if scale == "none" else 1.0

    def at_init(self, key):
        return [self.theory_score_std]

    def mechanism(self, step, key):
        if key.endswith("_median_saturated"):
            return [0.0 if self.d_k >= 65536 else 1e-3 / self.d_k] if self.scale == "none" else [math.nan]
        return [0.5]


D_K = (16, 64, 256, 1024, 4096, 16384, 65536, 1048576)


class Layout:
    x_name, best_of = "d_k", None

    @staticmethod
    def arm_label(arm):
        return f"scale={arm[0]}"

    @staticmethod
    def x_label(x):
        return str(x[0])


def x_labels_apart(ax, renderer) -> bool:
    """Whether no two x tick labels overlap as drawn: level ones by their boxes; turned ones
    (parallel strips a line high) when the ticks are at least a line apart across the text."""
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) == len(D_K)
    angle = math.radians(labels[0].get_rotation())
    if angle == 0:
        boxes = [t.get_window_extent(renderer) for t in labels]
        return not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    ticks = np.sort(ax.transData.transform([(x, 1.0) for x in ax.get_xticks()])[:, 0])  # pixels
    line = labels[0].get_fontsize() * ax.figure.dpi / 72
    return bool(np.diff(ticks).min() * math.sin(angle) >= line)


class FactorialLayout(Layout):
    """Arms named by two settings each, as two_factors names them: long legend entries."""

    @staticmethod
    def arm_label(arm):
        return f"qk_gain_exponent={arm[0]}, qk_lr_exponent={arm[0]}"


@pytest.mark.parametrize("arms", [("sqrt", "none"), ("none", "-0.25", "0.5", "-0.5", "-1", "0.25")])
def test_the_experiment_mechanism_figure_says_what_it_measures_with_x_labels_apart(monkeypatch, arms):
    made = []
    monkeypatch.setattr(experiment_figures, "save_figure", lambda fig, path, tight=True: made.append(fig))
    best = {((d_k,), (arm,)): Cell(d_k, arm) for d_k in D_K for arm in arms}
    colors = {(arm,): f"C{i}" for i, arm in enumerate(arms)}
    layout = Layout() if len(arms) == 2 else FactorialLayout()
    experiment_figures.mechanism_figure(best, layout, colors, [0, 10], Path("mechanism.png"))
    [fig] = made
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    assert "why" not in fig._suptitle.get_text() and "stops learning" not in fig._suptitle.get_text()
    for ax in fig.axes[:5]:
        assert x_labels_apart(ax, renderer), ax.get_title()
        # each arm's markers beside the others' at each d_k: arms that start alike (the same values) stay in sight
        marked = [
            tuple(line.get_xdata()) for line in ax.get_lines() if line.get_marker() == "o" and len(line.get_xdata())
        ]
        firsts = {xs[0] for xs in marked}
        assert len(firsts) == len(arms), (ax.get_title(), marked)
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert any("median of 0" in text and "off the log axis" in text for text in texts), texts
    box, page = legend.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0, (box, page)  # never cut at an edge
    assert all(box.y1 <= ax.get_tightbbox(renderer).y0 for ax in fig.axes)  # below the panels


def test_a_legend_of_many_long_entries_below_one_panel_grows_the_figure_and_stays_below_the_panel():
    fig, (ax,) = experiment_figures.panels(1)
    height = fig.get_size_inches()[1]
    labels = [f"qk_gain_exponent={g}, qk_lr_exponent={r}, optim.name=adamw" for g in (0, -0.25) for r in (0, 1, -1)]
    handles = [ax.plot([0, 1], [i, i])[0] for i in range(len(labels))]
    experiment_figures.legend_below(fig, handles, labels)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(renderer), fig.bbox
    assert fig.get_size_inches()[1] > height
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0
    assert box.y1 <= ax.get_tightbbox(renderer).y0


def test_the_legend_below_lays_the_panels_out_as_tight_layout_does_measuring_each_panel_once(monkeypatch):
    from matplotlib.axes import Axes

    def three_panels():
        fig, axes = experiment_figures.panels(3)
        for i, ax in enumerate(axes):
            ax.plot(STEPS, np.geomspace(10.0**-i, 10.0**i, len(STEPS)))
            ax.set_yscale("log")
            ax.set_title(f"d_k = {4**i}")
        return fig, axes

    fig, axes = three_panels()
    experiment_figures.legend_below(fig, [], [])  # no legend: the rect is the whole figure
    plain, _ = three_panels()
    plain.tight_layout(rect=(0, 0, 1, 1))
    assert vars(fig.subplotpars) == vars(plain.subplotpars)
    measured = []
    measure = Axes.get_tightbbox
    monkeypatch.setattr(Axes, "get_tightbbox", lambda ax, *a, **k: measured.append(ax) or measure(ax, *a, **k))
    fig, axes = three_panels()
    experiment_figures.legend_below(fig, axes[0].get_lines(), ["one line"])
    assert sorted(map(axes.index, measured)) == [0, 1, 2]  # tight_layout(rect=...) alone measures each twice
    assert all("get_tightbbox" not in vars(ax) for ax in axes)


def a_laid_out_figure():
    """A figure of two panels and a legend below them, laid out as an experiment's figures are."""
    fig, axes = experiment_figures.panels(2)
    handles = [ax.plot(STEPS, np.linspace(2.8, 0.1, len(STEPS)))[0] for ax in axes]
    axes[1].set_yscale("log")
    experiment_figures.legend_below(fig, handles, ["scale=sqrt", "scale=none"])
    return fig


@pytest.mark.parametrize("tight", [False, True])
def test_a_laid_out_figure_is_drawn_once_into_the_bytes_savefig_makes(monkeypatch, tmp_path, tight):
    import io

    from matplotlib.figure import Figure

    reference = io.BytesIO()
    a_laid_out_figure().savefig(reference, dpi=110, format="png")  # the layout engine tight_layout leaves: 2 draws
    draws = []
    drawn = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: draws.append(fig) or drawn(fig, renderer))
    path = figures.save_figure(a_laid_out_figure(), tmp_path / "f.png", tight=tight)
    assert len(draws) == 1
    if not tight:
        assert path.read_bytes() == reference.getvalue()


@pytest.mark.parametrize("rc", [{}, {"figure.autolayout": True}, {"figure.constrained_layout.use": True}])
def test_a_constrained_figure_saved_in_two_formats_is_laid_out_once_and_keeps_that_layout(monkeypatch, tmp_path, rc):
    """compare.png then compare.svg: the second save draws the panels where the first laid them out, whatever
    matplotlibrc asks."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine, TightLayoutEngine

    monkeypatch.setattr(matplotlib, "rcParams", matplotlib.RcParams({**matplotlib.rcParams, **rc}))

    fig = Figure(figsize=(6, 3), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax in axes:
        ax.plot(STEPS, np.linspace(2.8, 0.1, len(STEPS)))
        ax.set_ylabel("eval_loss")
    layouts = []
    for engine_class in (ConstrainedLayoutEngine, TightLayoutEngine):
        execute = engine_class.execute
        monkeypatch.setattr(engine_class, "execute", lambda engine, f, run=execute: layouts.append(f) or run(engine, f))
    figures.save_figure(fig, tmp_path / "f.png", tight=False)
    placed = [ax.get_position().bounds for ax in axes]
    unplaced = [ax.get_position().bounds for ax in Figure(figsize=(6, 3)).subplots(1, 2)]
    assert len(layouts) == 1 and placed != unplaced  # laid out by the save
    svg = figures.save_figure(fig, tmp_path / "f.svg", tight=False)
    assert len(layouts) == 1 and [ax.get_position().bounds for ax in axes] == placed
    assert "<svg" in svg.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`attn demo` on a budget where the scaled head has learned (200 steps), twice."""
    import os

    here = os.getcwd()
    os.chdir(REPO)
    try:
        out = tmp_path_factory.mktemp("demo")
        codes = [cli.main(["demo", "train.steps=200", "--runs-dir", str(out)]) for _ in range(2)]
    finally:
        os.chdir(here)
    return out, codes


@pytest.mark.slow
def test_the_demo_trains_the_pair_and_draws_one_figure_with_both_outcomes(demo):
    out, codes = demo
    assert codes == [0, 0]
    assert (out / "demo.png").read_bytes().startswith(b"\x89PNG")
    outcomes = {name: runs.read_summary(out / name)["outcome"] for name in ("wide", "wide_unscaled")}
    assert outcomes == {"wide": "learned", "wide_unscaled": "stalled"}
    assert (out / "wide" / "mechanism.png").exists() and (out / "wide_unscaled" / "mechanism.png").exists()


@pytest.mark.slow
def test_a_second_demo_reuses_the_runs_it_made(demo):
    out, _ = demo
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["wide", "wide_unscaled"]


def test_a_sweep_traces_the_rows_only_where_it_draws_each_run_or_is_asked_to(tmp_path):
    from attn.experiment import spec

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nbase: base.yaml\ngrid: {optim.lr: [0.1]}\nseeds: [0]\n")
    cells = {plots: spec.load_experiment(path, plots=plots).cells[0] for plots in (False, True)}
    assert {plots: cell.config.logging.mechanism_trace for plots, cell in cells.items()} == {False: False, True: True}
    path.write_text(path.read_text() + "overrides: {logging.mechanism_trace: true}\n")
    assert spec.load_experiment(path, plots=False).cells[0].config.logging.mechanism_trace


class Seed:
    """One seed of a judged cell: its metric records (score_std from `start` at step 0 towards `end`)."""

    def __init__(self, start: float, end: float, wobble: float):
        steps = range(0, 1010, 10)
        records = [{"step": s, "score_std": end + (start - end) * math.exp(-s / 15) + wobble} for s in steps]
        self.run = Run(Path("seed"), {}, records, {}, "completed")


class TimedCell:
    """A judged cell with its seeds, success rate and Kaplan-Meier median steps (the headline's panels)."""

    budget = 1000

    def __init__(self, start: float, end: float, median: float):
        self.seeds = [Seed(start, end, 0.01 * i) for i in range(10)]
        self.n, self.median = len(self.seeds), median

    def rate(self, name):
        return {"rate": 1.0, "low": 0.72, "high": 1.0}

    def time(self):
        return stats.KMMedian(self.median, self.median * 0.8, self.median * 1.2)


def figure_drawn(monkeypatch, draw, *args):
    made = []
    monkeypatch.setattr(experiment_figures, "save_figure", lambda fig, path, tight=True: made.append(fig))
    draw(*args)
    [fig] = made
    FigureCanvasAgg(fig).draw()
    return fig


def test_an_experiments_score_growth_holds_every_median_from_step_0_on_a_labelled_log_axis(monkeypatch):
    """Scores' std near 1 at step 0 under the scale, near 2 after; 8 to 12 without it (width at d_k 64): the bulk
    of the seeds' values starts above the scaled arm's step 0, which stays on the axis, read in plain numbers."""
    best = {((64,), ("sqrt",)): TimedCell(0.9, 2.0, 40), ((64,), ("none",)): TimedCell(8.0, 12.0, 830)}
    colors = {("sqrt",): "C0", ("none",): "C1"}
    fig = figure_drawn(
        monkeypatch, experiment_figures.curves_over_training, best, Layout(), colors, "score_std", "std", Path("s.png")
    )
    [ax] = fig.axes
    low, high = ax.get_ylim()
    medians = [line.get_ydata() for line in ax.get_lines() if line.get_linewidth() > 1]
    assert len(medians) == 2 and all(low <= min(m) and max(m) <= high for m in medians), (low, high)
    assert plain_numbers(labelled(ax.yaxis)) >= 3, labelled(ax.yaxis)


def test_an_experiments_score_growth_holds_each_median_at_step_0_however_far_below_the_bulk(monkeypatch):
    """As two_factors_adamw's: two arms start at std 0.95 and grow to 40 and 1e5, two start at 120; the seeds'
    bulk lies more than a decade above 0.95, yet every median's step 0 is on the axis."""
    best = {
        ((16384,), (arm,)): TimedCell(start, end, 100)
        for arm, start, end in (("a", 0.95, 40.0), ("b", 0.95, 1e5), ("c", 120.0, 140.0), ("d", 120.0, 3000.0))
    }
    colors = {(arm,): f"C{i}" for i, arm in enumerate("abcd")}
    fig = figure_drawn(
        monkeypatch, experiment_figures.curves_over_training, best, Layout(), colors, "score_std", "std", Path("s.png")
    )
    [ax] = fig.axes
    low, high = ax.get_ylim()
    starts = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linewidth() > 1]
    assert len(starts) == 4 and all(low <= start <= high for start in starts), (low, starts)


def test_the_headlines_time_panel_of_a_decade_or_two_is_labelled_in_plain_numbers(monkeypatch):
    best = {
        ((d_k,), (scale,)): TimedCell(1.0, 2.0, m) for d_k in (64, 1024) for scale, m in (("sqrt", 40), ("none", 830))
    }
    colors = {("sqrt",): "C0", ("none",): "C1"}
    fig = figure_drawn(monkeypatch, experiment_figures.headline_figure, best, {}, Layout(), colors, Path("h.png"), "w")
    time_ax = fig.axes[1]
    assert time_ax.get_yscale() == "log"
    assert plain_numbers(labelled(time_ax.yaxis)) >= 3, labelled(time_ax.yaxis)
    (legend,) = fig.legends
    assert not time_ax.texts and any("budget: 1000 steps" in t.get_text() for t in legend.get_texts())  # off the data


class LossCell:
    """A judged cell whose seeds' eval loss falls from `start` at step 0 to about `end`, the task's plateau levels
    (`references`) in each run's summary."""

    def __init__(self, start: float, end: float, diverged: int = 0, references: dict = REFERENCES):
        self.diverged, self.seeds = diverged, []
        for i in range(10):
            records = [
                {"step": s, "eval_loss": end * (1 + 0.01 * i) + (start - end) * math.exp(-s / 30)}
                for s in range(0, 1010, 10)
            ]
            self.seeds.append(SimpleNamespace(run=Run(Path("seed"), {}, records, {"references": references}, "done")))
        self.n = len(self.seeds)

    def final_losses(self):
        return [math.inf] * self.diverged + [s.run.records[-1]["eval_loss"] for s in self.seeds[self.diverged :]]


@pytest.mark.parametrize("figure", ["loss_curves", "final_loss"])
def test_an_experiments_loss_figures_draw_the_chance_and_no_retrieval_lines_inside_the_axes(monkeypatch, figure):
    """Every seed's loss, from step 0, lies below both plateaus: the lines a stalled seed would sit on are drawn and
    held on the axis anyway, each named with its level in the legend, after the arms."""
    best = {((64,), ("sqrt",)): LossCell(0.5, 1e-4, diverged=1), ((64,), ("none",)): LossCell(0.5, 1e-2)}
    colors = {("sqrt",): "C0", ("none",): "C1"}
    if figure == "loss_curves":
        args = (experiment_figures.curves_over_training, best, Layout(), colors, "eval_loss", "loss", Path("l.png"))
    else:
        args = (experiment_figures.final_loss_figure, best, Layout(), colors, Path("f.png"))
    fig = figure_drawn(monkeypatch, *args)
    ax = fig.axes[0]
    levels = [line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1]
    assert sorted(levels) == sorted(REFERENCES.values()) and holds(ax, *levels), (levels, ax.get_ylim())
    (legend,) = fig.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels[-2:] == ["chance (2.77)", "no retrieval (1.80)"], labels
    if figure == "loss_curves":  # one panel: its title and the legend below leave the axes a row's height
        assert ax.get_position().height * fig.get_figheight() >= 1.3, ax.get_position()
    if figure == "final_loss":  # a diverged seed of the sqrt arm: its × in its arm's colour; the legend's one, grey
        assert sorted(labels[:2]) == ["scale=none", "scale=sqrt"] and labels[2] == experiment_figures.DIVERGED_MARK
        assert legend.legend_handles[2].get_color() == "0.3"
        [crosses] = [c for c in ax.collections if np.allclose(c.get_offsets()[:, 1], ax.get_ylim()[1] / 1.2)]
        assert len(crosses.get_offsets()) == 1 and same_color(crosses.get_facecolor()[0], "C0")


def test_only_plateau_levels_a_log_axis_can_show_and_every_seed_shares_are_drawn():
    """A task of one pair has no-retrieval loss 0; a level may be missing (NaN); a panel may mix tasks."""
    odd = {"chance": 2.0, "no_retrieval": 0.0, "other": math.nan}
    assert experiment_figures.plateau_levels(LossCell(0.5, 1e-3, references=odd).seeds) == {"chance": 2.0}
    mixed = LossCell(0.5, 1e-3).seeds + LossCell(0.5, 1e-3, references={"chance": 3.0}).seeds
    assert experiment_figures.plateau_levels(mixed) == {}


def test_a_median_widens_a_log_axis_past_the_seeds_bulk_by_at_most_a_decade():
    low, high = experiment_figures.covering((1.0, 10.0), [0.5, 20.0])
    assert math.isclose(low, 0.5 / 1.2) and math.isclose(high, 20.0 * 1.2)  # held whole, a little inside
    assert experiment_figures.covering((1.0, 10.0), [1e-9, 1e30, math.inf, math.nan, 0.0]) == (0.1, 100.0)
    assert experiment_figures.covering(None, [2.0]) == (2.0 / 1.2, 2.0 * 1.2)
    assert experiment_figures.covering((1.0, 10.0), []) == (1.0, 10.0)
