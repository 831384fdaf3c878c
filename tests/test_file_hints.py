"""Messages that name the file the user meant: `attn report DIR` and `attn config DIR`
given the directory that holds experiment.yaml or config.yaml."""

from attn import cli


def test_a_directory_given_for_a_file_names_the_file_inside_it(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "experiment.yaml").write_text("name: x\n")
    assert cli.main(["report", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"is a directory, not an experiment file; did you mean {tmp_path / 'x' / 'experiment.yaml'}?" in err, err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("seed: 0\n")
    assert cli.main(["config", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"not a config file; did you mean {tmp_path / 'run' / 'config.yaml'}?" in err, err
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "(and it holds no experiment.yaml)" in capsys.readouterr().err


def test_a_figure_title_is_wrapped_to_fit_inside_the_figure():
    from matplotlib.figure import Figure

    from attn.report.experiment_figures import suptitle

    fig = Figure(figsize=(6.8, 3.5))
    fig.add_subplot()
    suptitle(
        fig,
        "eval loss (nats) at each arm's best setting: every seed (thin) and the median (thick); "
        "y range from the bulk of the values",
    )
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox)


def test_an_experiment_without_an_arm_key_is_worded_as_one_arm(tmp_path):
    from attn.report import conclusion

    class Layout:
        def arm_label(self, arm):
            return "all runs"

    assert conclusion._named(Layout(), ()) == "the runs"  # no arm key: the arm is the empty tuple
