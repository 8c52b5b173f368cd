"""The README's Python example runs and checks its own result."""
import pathlib
import runpy


def test_readme_all_to_all_example(capsys):
    example = pathlib.Path(__file__).parents[1] / "examples" / "all_to_all.py"
    runpy.run_path(str(example), run_name="__main__")
    assert capsys.readouterr().out.strip() == "ok"
