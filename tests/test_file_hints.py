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
