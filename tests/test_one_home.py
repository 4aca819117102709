"""Each fact has one home, and what shows it is made from there: the thresholds' defaults and
meanings (`Thresholds`) reach the magic, the CLI, the panel's sliders and
docs/thresholds.md; the panel's traits are the same on the Python and the JS side; the
watch options (`WatchOptions`) reach `watch()`, `Watch`, the magic and `neuraldbg run`.

    python tests/test_one_home.py --write    writes docs/thresholds.md and the JS tests'
                                             slider fixture again from the Python side
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

from neuraldbg_nb import Thresholds, watch
from neuraldbg_nb.cli import make_parser
from neuraldbg_nb.detect import thresholds_doc
from neuraldbg_nb.detect.fielddocs import field_docs
from neuraldbg_nb.detect.thresholds import number, settings
from neuraldbg_nb.live.options import DEFAULT, WatchOptions, watch_arguments
from neuraldbg_nb.live.watcher import Watch

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "thresholds.md"
MODEL_TS = ROOT / "js" / "model.ts"
SLIDER_FIXTURE = ROOT / "js" / "__tests__" / "slider-specs.ts"
FIXTURE_ARRAY = re.compile(r"SLIDER_SPECS: readonly SliderSpec\[\] = (\[.*?\n\]);",
                           re.DOTALL)
REGENERATE = "regenerate it with `python tests/test_one_home.py --write`"


# -- thresholds ---------------------------------------------------------------------------
def test_every_setting_has_its_meaning_written_under_its_field() -> None:
    missing = [s.name for s in settings() if not s.doc]
    assert not missing, f"Thresholds fields without a docstring: {missing}"
    assert [s.name for s in settings()] == [f.name for f in dataclasses.fields(Thresholds)]
    assert all(s.default == getattr(Thresholds(), s.name) for s in settings())


def test_the_committed_thresholds_page_is_what_the_fields_generate() -> None:
    assert DOC.read_text() == thresholds_doc.markdown(), f"docs/thresholds.md is stale: {REGENERATE}"


def test_the_thresholds_page_lists_every_setting_with_its_default() -> None:
    page = thresholds_doc.markdown()
    for s in settings():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{s.name}` |"))
        assert f"| {number(s.default)} |" in row and s.doc[:40] in row, row


def _magic_parser():
    from neuraldbg_nb.notebook.magic import NeuralDbgMagics

    return NeuralDbgMagics.neuraldbg.parser


def _subparser(name: str):
    parser = make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


def _actions(parser) -> dict[str, object]:
    return {o: a for a in parser._actions for o in a.option_strings}


@pytest.mark.parametrize("where", ["magic", "run", "show"])
def test_the_command_lines_offer_every_setting_with_its_default_type_and_meaning(where) -> None:
    parser = _magic_parser() if where == "magic" else _subparser(where)
    actions = _actions(parser)
    for s in settings():
        action = actions.get(s.option)
        assert action is not None, f"{where} has no {s.option}"
        assert action.type is s.type and action.default is None  # not given: unchanged
        assert action.help.replace("%%", "%").startswith(s.doc)
        assert f"(default: {number(s.default)})" in action.help
    assert f"(default: {number(Thresholds().vanish)})" in parser.format_help()


def test_a_setting_given_on_the_command_line_reaches_the_run(tmp_path) -> None:
    from neuraldbg_nb.live.options import threshold_changes, watch_keywords

    args = _subparser("run").parse_args(["--lookback", "4", "--noise", "2.5", "x.py"])
    assert threshold_changes(args) == {"lookback": 4, "noise": 2.5}
    w = watch(None, report=False, **watch_keywords(args))
    assert w.run.thresholds == Thresholds(lookback=4, noise=2.5)


# -- the panel ----------------------------------------------------------------------------
def _python_traits() -> set[str]:
    from neuraldbg_nb.notebook.panel import Panel

    return set(Panel.class_own_traits(sync=True))


def _ts_traits() -> tuple[list[str], list[str]]:
    """The `TRAITS` list of js/model.ts, and the keys of its `PanelTraits` interface."""
    text = MODEL_TS.read_text()
    listed = re.search(r"export const TRAITS: readonly TraitName\[\] = \[(.*?)\];", text,
                       re.DOTALL)
    body = re.search(r"export interface PanelTraits \{(.*?)\n\}", text, re.DOTALL)
    assert listed and body, "js/model.ts has no TRAITS list or no PanelTraits interface"
    keys = re.findall(r"^\s{2}(\w+)\??:", body.group(1), re.MULTILINE)
    return re.findall(r'"(\w+)"', listed.group(1)), keys


def test_the_panel_traits_are_the_same_in_python_and_in_js() -> None:
    listed, keys = _ts_traits()
    python = _python_traits()
    assert len(listed) == len(set(listed)), f"a trait listed twice in TRAITS: {listed}"
    assert set(listed) == python, (
        f"only in Python: {sorted(python - set(listed))}; only in js/model.ts TRAITS: "
        f"{sorted(set(listed) - python)}")
    assert set(keys) == python, (
        f"only in Python: {sorted(python - set(keys))}; only in js/model.ts PanelTraits: "
        f"{sorted(set(keys) - python)}")


def test_the_panel_state_fills_every_python_to_js_trait() -> None:
    from neuraldbg_nb.live.captures import CaptureStore
    from neuraldbg_nb.notebook import panel_state
    from neuraldbg_nb.report.run import Run
    from neuraldbg_nb.trace import Trace

    state = panel_state.panel_state(Run(Trace(), Thresholds(), CaptureStore(0)), True)
    js_to_python = {"thresholds", "selected", "inspector_html", "message"}
    assert set(state) == _python_traits() - js_to_python


def test_the_sliders_are_made_from_the_settings() -> None:
    from neuraldbg_nb.notebook import panel_state

    known = {s.name: s for s in settings()}
    for spec in panel_state.sliders():
        s = known[spec["key"]]
        assert spec["default"] == s.default and spec["help"] == s.doc
        assert (spec["min"], spec["max"], spec["log"]) == (*s.span, s.log)
        assert spec["min"] < spec["default"] < spec["max"] or spec["default"] == spec["max"]


def test_the_js_tests_slide_the_sliders_python_sends() -> None:
    from neuraldbg_nb.notebook import panel_state

    found = FIXTURE_ARRAY.search(SLIDER_FIXTURE.read_text())
    assert found, f"no SLIDER_SPECS array in {SLIDER_FIXTURE}"
    assert json.loads(found.group(1)) == panel_state.sliders(), \
        f"{SLIDER_FIXTURE.name} is stale: {REGENERATE}"


def test_js_keeps_no_copy_of_the_defaults() -> None:
    for path in (ROOT / "js").glob("*.ts"):
        text = path.read_text()
        assert "1e-6" not in text and "1e-10" not in text, f"{path.name} writes a threshold"


# -- watch options ------------------------------------------------------------------------
@pytest.mark.parametrize("func", [watch, Watch.__init__], ids=["watch", "Watch"])
def test_watch_takes_each_option_with_its_declared_default_and_type(func) -> None:
    params = {p.name: p for p in inspect.signature(func).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    options = {f.name: f for f in dataclasses.fields(WatchOptions)}
    assert list(params) == list(options)
    for name, f in options.items():
        if name == "thresholds":  # None: the defaults, with the keywords' changes
            assert params[name].default is None and params[name].annotation == "Thresholds | None"
            continue
        assert params[name].default == getattr(DEFAULT, name), name
        assert params[name].annotation == f.type, name


def test_watch_help_is_made_of_the_options_docstrings() -> None:
    doc = " ".join((watch.__doc__ or "").split())
    for name, text in field_docs(WatchOptions).items():
        assert text, f"WatchOptions.{name} has no docstring"
        assert f"{name}: {text}" in doc, name


def _flag(name: str) -> str:
    return "--" + ("no-" if isinstance(getattr(DEFAULT, name), bool) else "") \
        + name.replace("_", "-")


@pytest.mark.parametrize("where", ["magic", "run"])
def test_the_command_lines_offer_each_watch_option_as_declared(where) -> None:
    parser = _magic_parser() if where == "magic" else _subparser("run")
    actions = _actions(parser)
    docs = field_docs(WatchOptions)
    names = [kw["dest"] for _, kw in watch_arguments()]
    assert set(names) == {f.name for f in dataclasses.fields(WatchOptions)} - {
        "thresholds", "report"}
    for name in names:
        action = actions[_flag(name)]
        assert action.dest == name and action.default == getattr(DEFAULT, name)
        assert action.help.replace("%%", "%").startswith(docs[name])
    defaults = vars(parser.parse_args(["x.py"] if where == "run" else []))
    assert {n: defaults[n] for n in names} == {n: getattr(DEFAULT, n) for n in names}


def test_a_bad_option_is_refused_where_it_is_declared() -> None:
    with pytest.raises(ValueError, match="sample_every must be >= 1"):
        WatchOptions(sample_every=0)
    with pytest.raises(ValueError, match="sample_every must be >= 1"):
        watch(None, sample_every=0)
    with pytest.raises(SystemExit):
        _subparser("run").parse_args(["--stop-on", "sometimes", "x.py"])


def _write() -> None:
    from neuraldbg_nb.notebook import panel_state

    DOC.write_text(thresholds_doc.markdown())
    text = SLIDER_FIXTURE.read_text()
    specs = json.dumps(panel_state.sliders(), indent=2, ensure_ascii=False)
    found = FIXTURE_ARRAY.search(text)
    assert found, f"no SLIDER_SPECS array in {SLIDER_FIXTURE}"
    SLIDER_FIXTURE.write_text(text[:found.start(1)] + specs + text[found.end(1):])


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    _write()
