/**
 * The sliders Python sends (neuraldbg_nb.notebook.panel_state.sliders(), made from
 * neuraldbg_nb.Thresholds). tests/test_one_home.py checks that this JSON is what Python
 * sends, so these tests read the real spans and defaults.
 */
import type { SliderSpec, Thresholds } from "../model";

export const SLIDER_SPECS: readonly SliderSpec[] = [
  {
    "key": "vanish",
    "label": "vanishing grad <",
    "help": "Gradient norm of a layer's own parameters below which its gradient has vanished.",
    "default": 1e-06,
    "min": 1e-10,
    "max": 0.01,
    "log": true
  },
  {
    "key": "explode",
    "label": "exploding grad >",
    "help": "Gradient norm above which a layer's gradient has exploded; scaled up for a run whose gradients start above 100 (`detect.gradients.explode_line`).",
    "default": 1000.0,
    "min": 1.0,
    "max": 100000000.0,
    "log": true
  },
  {
    "key": "jump",
    "label": "regime jump ×",
    "help": "Factor against the layer's own recent history (in log space) that counts as a regime shift worth a warning.",
    "default": 10.0,
    "min": 2.0,
    "max": 1000.0,
    "log": true
  },
  {
    "key": "dead",
    "label": "dead units ≥",
    "help": "Fraction of a ReLU-like layer's units that output zero for the whole batch: a warning, and an error from the larger of this and 0.9 (`detect.activations.DEAD_ERROR`).",
    "default": 0.5,
    "min": 0.1,
    "max": 1.0,
    "log": false
  },
  {
    "key": "saturated",
    "label": "saturated ≥",
    "help": "Fraction of a bounded activation's outputs pinned at its bounds.",
    "default": 0.5,
    "min": 0.1,
    "max": 1.0,
    "log": false
  },
  {
    "key": "max_update",
    "label": "weight update ≥",
    "help": "Relative change of a layer's weight norm in one optimizer step that counts as an exploding update (1.0: the norm doubled, or fell to zero).",
    "default": 1.0,
    "min": 0.01,
    "max": 100.0,
    "log": true
  }
];

/** The sliders' defaults, by key. */
export const DEFAULTS: Thresholds = Object.fromEntries(SLIDER_SPECS.map((s) => [s.key, s.default]));
